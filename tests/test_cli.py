import json
import subprocess
import sys

import pytest

from tests.cli_in_process import workbench_here


def test_census_reads_headers_only(demo):
    result = workbench_here("census", demo.qwen_stage1, "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["integrity"]["verdict"] == "pass"
    components = {row["component"] for row in data["census"]}
    assert components == {"vision", "language", "head"}
    assert data["header_bytes_read"] < 10_000


def test_census_of_a_damaged_checkpoint_exits_1(demo, copy_of):
    folder = copy_of(demo.qwen_base)
    (folder / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes()[:-64])
    result = workbench_here("census", folder)
    assert result.returncode == 1
    fields = dict(line.split(None, 1) for line in result.stdout.splitlines()[:3])  # the findings table, as text
    assert fields["verdict"] == "FAIL" and fields["check"] == "checkpoint.integrity"
    assert "damaged" in fields["finding"] and "bytes read" in result.stdout


@pytest.mark.parametrize("args, message", [
    (["diagnose", "/no/such/checkpoint"], "does not exist"),
    (["diagnose", "someorg/some-model-7b"], "hub id"),
    (["census", "/no/such/checkpoint"], "does not exist"),
    (["diagnose", "/no/such/checkpoint", "--gpus", "0"], "--gpus 0"),
    (["diagnose", "/no/such/checkpoint", "--serve", "ollamaa"], "--serve: unknown serving engine 'ollamaa'"),
])
def test_bad_input_exits_2_with_one_line(args, message):
    result = workbench_here(*args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]
    assert "Traceback" not in result.stderr + result.stdout


def workbench_in_process(*args, cwd=None):
    """The CLI as `python -m workbench` runs it; its last stdout line says whether this process imported torch."""
    code = ("import sys\nfrom workbench.cli import main\nrc = main(sys.argv[1:])\n"
            "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH')\nsys.exit(rc)")
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          timeout=600, stdin=subprocess.DEVNULL)


@pytest.mark.slow  # two kernels started and asked
def test_the_set_up_and_the_architecture_are_checked_in_the_kernel_and_refused_with_exit_2(demo, copy_of, edit_json,
                                                                                           tmp_path):
    """What only torch and transformers can tell (a --setup that does not import, a model_type transformers does not
    know) is asked of the diagnosis' kernel: the same one line and exit 2, and the CLI's process imports neither."""
    result = workbench_in_process("diagnose", demo.llama, "--setup", "no_such_module:load", "--reports-dir", tmp_path)
    assert result.returncode == 2 and result.stdout.split()[-1] == "NO-TORCH", result.stderr
    assert result.stderr.strip().splitlines() == [result.stderr.strip()] and "cannot import no_such_module" in \
        result.stderr and "Traceback" not in result.stderr
    unknown = copy_of(demo.llama)
    edit_json(unknown / "config.json", model_type="acme_lm")
    result = workbench_in_process("diagnose", unknown, "--reports-dir", tmp_path)
    assert result.returncode == 2 and result.stdout.split()[-1] == "NO-TORCH", result.stderr
    assert "model_type 'acme_lm' is unknown to transformers" in result.stderr and "Traceback" not in result.stderr



def test_unusable_reports_dir_exits_2(demo, tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the reports folder should go")
    result = workbench_here("diagnose", demo.llama, "--reports-dir", blocker / "reports")
    assert result.returncode == 2
    assert "cannot create reports folder" in result.stderr and "Traceback" not in result.stderr


def test_a_folder_that_is_no_checkpoint_stops_the_early_kernel_it_started(tmp_path):
    """diagnose starts its kernel before it validates a local folder; when the folder is refused (exit 2), that
    kernel is shut down — nothing is left running or lying around."""
    import os

    import psutil

    (tmp_path / "empty").mkdir()
    temp = tmp_path / "tmp"
    temp.mkdir()
    before = {p.pid for p in psutil.process_iter()}
    result = subprocess.run([sys.executable, "-m", "workbench", "diagnose", str(tmp_path / "empty"),
                             "--reports-dir", str(tmp_path / "reports")], capture_output=True, text=True,
                            timeout=600, stdin=subprocess.DEVNULL, env={**os.environ, "TMPDIR": str(temp)})
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "config.json" in result.stderr
    assert not list(temp.iterdir())  # nothing left in its temporary folder
    assert not [p for p in psutil.process_iter(["pid", "cmdline"]) if p.info["pid"] not in before
                and "ipykernel_launcher" in " ".join(p.info["cmdline"] or []) and _started_with(p, temp)]


def _started_with(process, temp) -> bool:
    """Whether a process inherited this test's TMPDIR: the kernels other tests start at the same moment (the suite
    runs in parallel) carry their own, so only the one this diagnose started can match."""
    import psutil

    try:
        return process.environ().get("TMPDIR") == str(temp)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def test_training_args_with_unknown_fields_exits_2_naming_them(demo, tmp_path):
    args = tmp_path / "args.yaml"
    args.write_text("per_device_train_batch_size: 2\nlearning_rat: 0.0001\n")
    result = workbench_here("diagnose", demo.llama, "--training-args", args, "--reports-dir", tmp_path / "reports")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown TrainingArguments field(s) learning_rat" in lines[0]
    assert "Traceback" not in result.stderr + result.stdout and not (tmp_path / "reports").exists()
