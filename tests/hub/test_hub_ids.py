"""`workbench census|diagnose org/name`: configs, tokenizer and adapter files downloaded, the base's safetensors
headers read by HTTP range requests; offline, the one-line error."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.hub.conftest import as_hub_adapter, cached_files, run_workbench
from tests.hub.hub_server import HubServer
from tests.served_hub import serving
from workbench.model.hub import hub_online
from workbench.model.hub_headers import FIRST_RANGE_BYTES, fetch_header
from workbench.model.safetensors_header import read_header

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from sparse_checkpoint import write_sparse_checkpoint  # noqa: E402


def write_safetensors(path: Path, tensors: int, *, truncate: int = 0) -> Path:
    """A real safetensors file of `tensors` small fp32 tensors (a long header when many); `truncate` bytes cut."""
    import torch
    from safetensors.torch import save_file

    save_file({f"layer.{i}.weight": torch.full((2, 2), float(i)) for i in range(tensors)}, str(path))
    if truncate:
        path.write_bytes(path.read_bytes()[:-truncate])
    return path


@pytest.mark.slow  # ~11 s: the 7B skeleton built twice (the sparse files, the census's map)
def test_a_7b_shaped_hub_checkpoint_is_censused_from_under_1_mb(tmp_path, hub_home):
    base = write_sparse_checkpoint(tmp_path / "qwen7b")
    shards = sorted(p.name for p in base.glob("*.safetensors"))
    with serving({"org/qwen2-vl-7b": base}) as hub:
        result = run_workbench("census", "org/qwen2-vl-7b", "--json", hub=hub, home=hub_home)
        read = {name: hub.bytes_sent("org/qwen2-vl-7b", name) for name in shards}
        ranges = [r for method, path, r in hub.requests if path.endswith(".safetensors") and method == "GET"]
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["integrity"]["verdict"] == "pass"
    assert data["integrity"]["evidence"]["hub"].startswith("org/qwen2-vl-7b@")
    assert data["integrity"]["evidence"]["weight_bytes"] > 15e9  # the 7B's weights, counted from the headers
    assert {row["component"] for row in data["census"]} >= {"vision", "language", "head"}
    assert sum(read.values()) < 1_000_000, read
    assert all(r.startswith("bytes=") for r in ranges) and len(ranges) >= len(shards)
    assert not set(shards) & cached_files(hub_home)  # no shard in the Hugging Face cache


def test_a_header_longer_than_the_first_range_takes_a_second_range(tmp_path):
    folder = tmp_path / "repo"
    folder.mkdir()
    local = write_safetensors(folder / "model.safetensors", 2500)
    assert read_header(local).header_size > FIRST_RANGE_BYTES
    with HubServer({"org/long-header": folder}) as hub, hub_online():
        commit = hub.repos["org/long-header"].commit
        remote = fetch_header("org/long-header", "model.safetensors", commit, endpoint=hub.endpoint)
        ranges = [r for _, path, r in hub.requests if path.endswith("model.safetensors")]
    header = remote.parse(folder)
    assert header == read_header(local)  # same tensors, sizes and (no) problems as the local read
    assert ranges == [f"bytes=0-{FIRST_RANGE_BYTES}", f"bytes=8-{header.header_size + 7}"]


def test_a_truncated_hub_file_is_damaged_as_a_local_one_is(tmp_path):
    folder = tmp_path / "repo"
    folder.mkdir()
    local = write_safetensors(folder / "model.safetensors", 4, truncate=8)
    with HubServer({"org/truncated": folder}) as hub, hub_online():
        commit = hub.repos["org/truncated"].commit
        header = fetch_header("org/truncated", "model.safetensors", commit, endpoint=hub.endpoint).parse(folder)
    assert header.problems == read_header(local).problems
    assert any("truncated" in p for p in header.problems)


def test_hub_unreachable_or_offline_is_one_line_exit_2(hub_home):
    for offline in (False, True):  # no server on the port / HF_HUB_OFFLINE=1 set by the user
        result = run_workbench("census", "org/not-cached", hub=None, home=hub_home, offline=offline)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1, result.stderr
        assert "hub id" in lines[0] and "cannot be reached" in lines[0] and "Traceback" not in result.stdout


def test_a_repo_the_hub_does_not_have_is_named(tmp_path, hub_home):
    with serving({}) as hub:
        result = run_workbench("census", "org/no-such-model", hub=hub, home=hub_home)
    assert result.returncode == 2
    assert "org/no-such-model" in result.stderr and "no such model repository" in result.stderr


@pytest.mark.slow
def test_a_hub_adapter_on_a_hub_base_gets_notebook_00_with_no_base_weight(demo, tmp_path, hub_home):
    adapter = as_hub_adapter(demo.qwen_stage2, tmp_path / "adapter", "org/base")
    with serving({"org/base": demo.qwen_base, "org/adapter": adapter}) as hub:
        result = run_workbench("diagnose", "org/adapter", "--reports-dir", tmp_path / "reports", hub=hub,
                               home=hub_home)
        base_weights = hub.bytes_sent("org/base", "model.safetensors")
        adapter_weights = hub.bytes_sent("org/adapter", "adapter_model.safetensors")
    assert "weights left on the hub" in result.stdout and "--download" in result.stdout, result.stdout
    report = json.loads(next((tmp_path / "reports").rglob("findings.json")).read_text())
    assert [n["name"] for n in report["notebooks"]] == ["00_saved_files"]
    verdicts = {f["id"]: f["verdict"] for f in report["findings"]}
    assert verdicts["adapter.weights"] != "error" and verdicts["adapter.targets"] != "error", verdicts
    assert adapter_weights == (adapter / "adapter_model.safetensors").stat().st_size  # the adapter, whole
    assert base_weights <= FIRST_RANGE_BYTES + 1  # the base: its header's range only
    assert "model.safetensors" not in cached_files(hub_home)

    # --download: the base's weights come down, and a notebook that loads the model runs on them
    with serving({"org/base": demo.qwen_base, "org/adapter": adapter}) as hub:
        result = run_workbench("diagnose", "org/adapter", "--download", "--notebooks", "01_dtype_distribution",
                               "--reports-dir", tmp_path / "downloaded", hub=hub, home=hub_home)
        base_weights = hub.bytes_sent("org/base", "model.safetensors")
    assert result.returncode == 0 and "weights left on the hub" not in result.stdout, result.stdout + result.stderr
    report = json.loads(next((tmp_path / "downloaded").rglob("findings.json")).read_text())
    assert [n["name"] for n in report["notebooks"]] == ["01_dtype_distribution"]
    assert report["cost"]["model_loads"] >= 1
    assert "error" not in {f["verdict"] for f in report["findings"]}, report["findings"]
    assert base_weights == (demo.qwen_base / "model.safetensors").stat().st_size
    assert "model.safetensors" in cached_files(hub_home)


@pytest.mark.slow
def test_a_hub_model_asked_for_a_notebook_that_loads_it_is_told_to_download(demo, tmp_path, hub_home):
    with serving({"org/llama": demo.llama}) as hub:
        result = run_workbench("diagnose", "org/llama", "--notebooks", "04_forward_checks", "--reports-dir",
                               tmp_path / "reports", hub=hub, home=hub_home)
    shards = sorted(demo.llama.glob("*.safetensors"))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert f"weights left on the hub ({len(shards)} file(s), " in result.stdout
    assert "04_forward_checks" in result.stderr and "pass --download" in result.stderr
    assert not {p.name for p in shards} & cached_files(hub_home)  # headers read, no shard downloaded
    assert not (tmp_path / "reports").exists()
