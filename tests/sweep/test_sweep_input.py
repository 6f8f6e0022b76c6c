"""Bad input to `workbench sweep`: one line naming the fix, exit 2, nothing run and no folder left. Through
`workbench.cli.main` in the test process (a refusal needs no fresh process)."""

import json
import socket
import sys

import pytest

from workbench.cli import main


def refused(arguments: list[str], capsys, tmp_path) -> str:
    reports = tmp_path / "reports"
    assert main(["sweep", *arguments, "--reports-dir", str(reports)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    assert not reports.exists() or not any(reports.rglob("sweep.json"))
    return err


def test_an_empty_sweep(capsys, tmp_path):
    assert "an empty sweep" in refused([], capsys, tmp_path)


def test_history_on_a_folder_without_checkpoints(capsys, tmp_path):
    (tmp_path / "run").mkdir()
    assert "holds no checkpoint-N folder" in refused([str(tmp_path / "run"), "--history"], capsys, tmp_path)


def test_history_across_different_bases(capsys, tmp_path):
    for step, base in ((1, "base-a"), (2, "base-b")):
        (tmp_path / base).mkdir()
        folder = tmp_path / "run" / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        (folder / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(tmp_path / base)}))
    err = refused([str(tmp_path / "run"), "--history"], capsys, tmp_path)
    assert "checkpoint-2 is adapter on" in err and "base-b" in err and "without --history" in err


def test_an_unreachable_ray_address(capsys, tmp_path):
    with socket.socket() as s:  # a port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    err = refused([str(tmp_path), "--engine", "ray", "--address", f"127.0.0.1:{port}"], capsys, tmp_path)
    assert "no Ray cluster answers there" in err and "ray start --head" in err


def test_the_ray_engine_without_ray_installed(capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` meets where Ray is not installed
    err = refused([str(tmp_path), "--engine", "ray"], capsys, tmp_path)
    assert "Ray is not installed" in err and "finetune-workbench[ray]" in err


@pytest.mark.parametrize("arguments, says", [
    (["--jobs", "0"], "--jobs 0"),
    (["--address", "127.0.0.1:1"], "add --engine ray"),
    (["--engine", "ray", "--jobs", "2"], "--jobs is the local engine's"),
])
def test_options_of_the_other_engine(arguments, says, capsys, tmp_path):
    assert says in refused([str(tmp_path), *arguments], capsys, tmp_path)


def test_a_member_that_is_no_folder(capsys, tmp_path):
    assert "no such folder" in refused([str(tmp_path / "missing")], capsys, tmp_path)
