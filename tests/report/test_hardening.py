"""Bad input, untrusted checkpoints, secrets, resource limits: the workbench never makes matters worse."""

import errno
import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.cli_in_process import workbench_here
from workbench import cli
from workbench.errors import UsageError
from workbench.model.memory import ResourceError
from workbench.model.safetensors_header import HeaderError, read_header
from workbench.model.setups import prepare_model
from workbench.model.target import resolve_target
from workbench.params import validate_params
from workbench.report.runner import diagnose


def run_cli(*args, env=None, cwd=None):
    import os

    return subprocess.run([sys.executable, "-m", "workbench", *map(str, args)], capture_output=True, text=True,
                          timeout=900, cwd=cwd, env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)


def tiny_gpt2(folder: Path) -> Path:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=32)).save_pretrained(folder)
    return folder


# ---------- bad input ----------

def test_weights_without_config(tmp_path, demo):
    (tmp_path / "model.safetensors").write_bytes((demo.qwen_base / "model.safetensors").read_bytes())
    with pytest.raises(UsageError, match="neither config.json nor adapter_config.json"):
        resolve_target(str(tmp_path))


def test_adapter_folder_without_adapter_config(demo, tmp_path):
    (tmp_path / "adapter_model.safetensors").write_bytes(b"x")
    with pytest.raises(UsageError, match="no adapter_config.json"):
        resolve_target(str(demo.qwen_stage1), adapter=str(tmp_path))


@pytest.mark.slow
def test_a_setup_that_raises_still_gives_a_report_and_its_tokens_never_reach_it(demo, tmp_path):
    # one CLI run for two promises: a set-up that raises is an `error` finding in a finished report, and the token
    # its message leaks (as an auth failure's would) is redacted from every file of that report
    token = "hf_SuperSecretToken1234567"
    (tmp_path / "leaky_recipe.py").write_text(
        "import os\ndef load(checkpoint, **options):\n"
        "    raise RuntimeError('recipe exploded: auth failed with ' + os.environ['HF_TOKEN'])\n")
    result = run_cli("diagnose", demo.llama, "--setup", "leaky_recipe:load", "--notebooks", "01",
                     "--reports-dir", tmp_path / "reports", env={"HF_TOKEN": token, "WANDB_API_KEY": "wandb-k3y-000"},
                     cwd=tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    report_dir = next((tmp_path / "reports").glob("*/*"))
    report = json.loads((report_dir / "findings.json").read_text())
    census = next(f for f in report["findings"] if f["id"] == "dtype.census")
    assert census["verdict"] == "error" and "recipe exploded" in census["detail"]
    for path in report_dir.iterdir():
        text = path.read_text(errors="replace")
        assert token not in text and "wandb-k3y-000" not in text, path.name
    assert "***redacted***" in census["detail"]


def test_a_full_disk_is_one_line_and_exit_2(demo, tmp_path, monkeypatch, capsys):
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "findings.json"))

    monkeypatch.setattr("workbench.report.contract.write_json_atomic", full)
    # the disk fills as the report is written: the kernel's check of the target (its stack's imports, 5 s with no
    # kernel server) is not what this test is about
    monkeypatch.setattr("workbench.report.kernels.Kernel.check_target", lambda self, target, timeout=900: True)
    monkeypatch.setattr("workbench.report.runner.run_notebook",
                        lambda nb, folder, params, kernel, timeout, **_: __import__("workbench.report.runner", fromlist=["NotebookRun"]).NotebookRun(
                            nb.stem, "ok", None, 0.0))
    code = cli.main(["diagnose", str(demo.llama), "--reports-dir", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 2 and "No space left on device" in err and "free some space" in err
    assert len(err.strip().splitlines()) == 1 and "crashed" not in err


# ---------- untrusted checkpoints ----------

def test_pickle_only_checkpoints_are_refused_unless_allowed(tmp_path):
    folder = tiny_gpt2(tmp_path / "gpt2-bin")
    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel.from_pretrained(folder)
    (folder / "model.safetensors").unlink()
    torch.save(model.state_dict(), folder / "pytorch_model.bin")
    with pytest.raises(UsageError, match="only pickle weights.*--allow-pickle"):
        resolve_target(str(folder))
    target = resolve_target(str(folder), allow_pickle=True)
    assert prepare_model(target).model.transformer.h[0] is not None  # loaded with torch.load(weights_only=True)


@pytest.mark.slow
def test_remote_code_is_refused_without_the_flag(demo, copy_of, edit_json):
    folder = copy_of(demo.llama)
    edit_json(folder / "config.json", model_type="evil_model",
              auto_map={"AutoModelForCausalLM": "modeling_evil.EvilModel"})
    (folder / "modeling_evil.py").write_text("raise SystemExit('remote code ran')\n")
    result = workbench_here("diagnose", folder)
    assert result.returncode == 2 and "--trust-remote-code" in result.stderr
    assert "remote code ran" not in result.stdout + result.stderr


@pytest.mark.slow
def test_strings_from_the_checkpoint_are_escaped_in_every_html(tmp_path):
    from safetensors.torch import load_file, save_file

    folder = tiny_gpt2(tmp_path / "ckpt-<img src=x onerror=alert(2)>")
    tensors = load_file(str(folder / "model.safetensors"))
    tensors["<script>alert(1)</script>"] = torch.zeros(2)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    result = workbench_here("diagnose", folder, "--notebooks", "01", "--reports-dir", tmp_path / "reports")
    assert result.returncode in (0, 1), result.stderr
    pages = list((tmp_path / "reports").glob("*/*/*.html"))
    assert len(pages) == 2
    for page in pages:
        text = page.read_text()
        assert "<script>alert(1)" not in text and "<img src=x" not in text, page.name
    notebook_html = (pages[0].parent / "01_dtype_distribution.html").read_text()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in notebook_html  # shown, as text
    assert "&lt;img src=x onerror=alert(2)&gt;" in notebook_html


# ---------- nothing lost, nothing touched ----------

@pytest.mark.slow
def test_checkpoint_folders_are_byte_identical_after_a_diagnosis(demo_report):
    # the session's full demo diagnosis (every notebook, the adapter, its base, the original base) hashed around
    assert demo_report.result.returncode == 1, demo_report.result.stderr
    assert demo_report.hashes_after == demo_report.hashes_before and len(demo_report.hashes_before) == 3


def test_an_interrupted_run_leaves_no_report_that_looks_whole(demo, tmp_path, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("workbench.report.runner.run_notebook", interrupted)
    with pytest.raises(KeyboardInterrupt):
        diagnose(resolve_target(str(demo.llama)), reports_dir=tmp_path, echo=lambda line: None)
    day = next(tmp_path.iterdir())
    assert [p.name.startswith(".") and p.name.endswith(".partial") for p in day.iterdir()] == [True]


@pytest.mark.slow
def test_ctrl_c_in_a_running_cell_is_one_line_and_leaves_no_kernel(demo, tmp_path):
    """Ctrl-C while a notebook's cell runs (the user's set-up, hanging): exit 130 and the one line, no traceback
    (the interrupted cell's task, left to asyncio, printed DeadKernelError's as the process exited), no kernel left,
    no report that looks whole."""
    import os
    import signal
    import time

    import psutil

    from tests import served_kernels

    started = time.time()
    (tmp_path / "recipe.py").write_text("import time\nfrom pathlib import Path\n\n\ndef load(checkpoint, **options):\n"
                                        "    Path('loading').touch()\n    time.sleep(600)\n")
    process = subprocess.Popen([sys.executable, "-m", "workbench", "diagnose", str(demo.llama), "--setup",
                                "recipe:load", "--notebooks", "01", "--reports-dir", str(tmp_path / "r")],
                               cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    while not (tmp_path / "loading").exists():  # the cell runs, in the user's set-up
        assert process.poll() is None, process.stderr.read()
        time.sleep(0.1)
    processes = psutil.Process(process.pid).children(recursive=True)  # the kernel, or the client standing for it
    os.kill(process.pid, signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    assert stderr.strip() == "interrupted: no report was completed (a partial one, if any, is a hidden .partial folder)"
    _, alive = psutil.wait_procs(processes, timeout=30)
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE], alive
    assert served_kernels.server_children(since=started) == []
    assert not list((tmp_path / "r").rglob("findings.json"))


@pytest.mark.slow
def test_a_cell_that_hangs_is_stopped_and_the_next_notebook_runs(demo, tmp_path, contract_notebook):
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    for name, body in [("01_hang", "import time\ntime.sleep(60)"), ("02_ok", "x = 1")]:
        nbformat.write(contract_notebook(body, [f"{name}.check"]), notebooks / f"{name}.ipynb")
    folder, findings = diagnose(resolve_target(str(demo.llama)), reports_dir=tmp_path / "r", notebook_dir=notebooks,
                                echo=lambda line: None, cell_timeout=3)
    report = json.loads((folder / "findings.json").read_text())
    assert [n["status"] for n in report["notebooks"]] == ["error", "ok"]
    assert report["notebooks"][0]["seconds"] < 40 and "Timeout" in report["notebooks"][0]["error"]
    # the stopped notebook is written as far as it ran: its HTML shows the cell it stopped in
    assert report["notebooks"][0]["html"] == "01_hang.html"
    assert nbformat.read(folder / "01_hang.ipynb", as_version=4).cells[-1].source == "import time\ntime.sleep(60)"


# ---------- resource limits ----------

def test_a_model_too_big_for_memory_is_refused_with_numbers(demo):
    target = resolve_target(str(demo.qwen_stage1), params={"memory_limit_bytes": 100_000})
    with pytest.raises(ResourceError, match=r"needs about 0\.00 GB.*memory_limit_bytes.*not loaded"):
        prepare_model(target)
    four_bit = resolve_target(str(demo.qwen_stage1), quant="4bit", params={"memory_limit_bytes": 10_000_000})
    assert prepare_model(four_bit).model is not None


# ---------- fuzz ----------

@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=200))
def test_fuzz_header_bytes_never_crash(tmp_path, data):
    path = tmp_path / "f.safetensors"
    path.write_bytes(data)
    try:
        read_header(path)
    except HeaderError:
        pass


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                      max_size=3), max_leaves=8)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(st.text(max_size=8), json_values, max_size=4))
@example({"x": {"dtype": ["F32"], "shape": [1], "data_offsets": [0, 4]}})  # unhashable dtype
@example({"x": {"dtype": "F32", "shape": [float("inf")], "data_offsets": [0, 4]}})  # Infinity in JSON
@example({"x": {"dtype": "F32", "shape": "12", "data_offsets": "04"}})  # strings that iterate like lists
@example({"x": {"dtype": "F32", "shape": [True], "data_offsets": [0, 4]}})
@example({"__metadata__": [1, 2]})
def test_fuzz_structured_headers_never_crash(tmp_path, header):
    raw = json.dumps(header).encode()
    path = tmp_path / "g.safetensors"
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + b"\0" * 16)
    try:
        read_header(path)
    except HeaderError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["components", "compare", "real_quant_max_bytes", "dataset_size", "other"]),
                       json_values, max_size=4))
def test_fuzz_parameter_files_never_crash(data):
    try:
        validate_params(data)
    except UsageError:
        pass
