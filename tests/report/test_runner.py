"""End to end: real papermill runs, real nbconvert HTML, real findings.json."""

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from workbench.catalog import CHECKS
from workbench.model.target import resolve_target
from workbench.report.runner import diagnose, new_report_folder

ALL_CHECKS = {c.id for c in CHECKS}


def run_cli(*args, cwd=None, env=None):
    return subprocess.run([sys.executable, "-m", "workbench", "diagnose", *map(str, args)], capture_output=True,
                          text=True, timeout=900, cwd=cwd, env={**os.environ, **(env or {})},
                          stdin=subprocess.DEVNULL)


def only_report(reports: Path) -> Path:
    folders = [p for p in reports.glob("*/*") if p.is_dir()]
    assert len(folders) == 1, folders
    return folders[0]


@pytest.mark.slow
def test_a_model_family_the_demo_does_not_use(tmp_path):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    ckpt = tmp_path / "tiny-gpt2"
    GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=300, n_positions=64)).save_pretrained(ckpt)
    before = {p.name: p.stat().st_mtime_ns for p in ckpt.iterdir()}
    # relative paths and a user set-up module in the working folder, as a user types them
    (tmp_path / "my_setup.py").write_text(
        "from transformers import AutoModelForCausalLM\n"
        "def load(checkpoint, **options):\n"
        "    return AutoModelForCausalLM.from_pretrained(checkpoint, local_files_only=True)\n")
    result = run_cli("tiny-gpt2", "--setup", "my_setup:load", "--reports-dir", "reports", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((only_report(tmp_path / "reports") / "findings.json").read_text())
    verdicts = {f["id"]: f["verdict"] for f in report["findings"]}
    assert set(verdicts) == ALL_CHECKS and "error" not in verdicts.values()
    assert verdicts["parallel.trainer_wrap"] == "pass"  # one GPU
    assert verdicts["peft.layer_status"] == "skip"  # a user set-up without an adapter
    assert verdicts["adapter.weights"] == verdicts["tokenizer.vocab"] == "skip"  # no adapter, no tokenizer files
    assert verdicts["config.tied_embeddings"] == "pass"  # GPT-2 ties its head: one tensor saved
    census = next(f for f in report["findings"] if f["id"] == "dtype.census")
    assert set(census["evidence"]["parameters"]) == {"language"}  # tied lm_head: counted once, with wte
    assert {p.name: p.stat().st_mtime_ns for p in ckpt.iterdir()} == before  # nothing written into the checkpoint


@pytest.mark.slow
def test_a_failing_notebook_is_an_artifact_and_the_next_still_runs(demo, tmp_path, contract_notebook):
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    nbformat.write(contract_notebook("raise RuntimeError('planted crash')", ["boom.check"]), notebooks / "01_boom.ipynb")
    nbformat.write(contract_notebook(
        "import workbench as wb\nrec = wb.FindingsRecorder(findings_path, notebook='02_ok')\n"
        "rec.add(wb.Finding('ok.check', 'pass', 'fine'))", ["ok.check"]), notebooks / "02_ok.ipynb")
    target = resolve_target(str(demo.llama))
    folder, findings = diagnose(target, reports_dir=tmp_path / "reports", notebook_dir=notebooks,
                                echo=lambda line: None)
    by_id = {f.id: f for f in findings}
    assert by_id["boom.check"].verdict == "error" and "planted crash" in by_id["boom.check"].detail
    assert by_id["ok.check"].verdict == "pass"
    report = json.loads((folder / "findings.json").read_text())
    assert [n["status"] for n in report["notebooks"]] == ["error", "ok"]
    assert (folder / "01_boom.html").exists() and (folder / "01_boom.ipynb").exists()
    assert "planted crash" in (folder / "01_boom.html").read_text()


@pytest.mark.slow
def test_notebooks_side_by_side_run_in_kernels_of_their_own_told_the_diagnosis_and_this_process_untouched(
        demo, tmp_path, contract_notebook, monkeypatch):
    monkeypatch.delenv("WORKBENCH_BATCH", raising=False)
    before = dict(os.environ)
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    for i in (1, 2):  # each kernel says what its environment told it: batch mode, the notebooks, the user's folder
        nbformat.write(contract_notebook(
            "import os\nimport workbench as wb\n"
            f"rec = wb.FindingsRecorder(findings_path, notebook='0{i}_env')\n"
            "told = (os.environ.get('WORKBENCH_BATCH'), os.environ.get('WORKBENCH_NOTEBOOKS'),\n"
            "        os.getcwd() in os.environ.get('PYTHONPATH', '').split(os.pathsep))\n"
            f"rec.add(wb.Finding('env{i}.check', 'pass' if told == ('1', '01_env,02_env', True) else 'fail', "
            "'the kernel environment', repr(told)))", [f"env{i}.check"]), notebooks / f"0{i}_env.ipynb")
    folder, findings = diagnose(resolve_target(str(demo.llama)), reports_dir=tmp_path / "reports",
                                notebook_dir=notebooks, jobs=2, echo=lambda line: None)
    assert {f.id: f.verdict for f in findings} == {"env1.check": "pass", "env2.check": "pass"}, [
        f.detail for f in findings]
    report = json.loads((folder / "findings.json").read_text())
    assert [(n["name"], n["status"], n["kernel"]) for n in report["notebooks"]] == [("01_env", "ok", "own"),
                                                                                   ("02_env", "ok", "own")]
    assert report["cost"]["kernels_started"] == 2 and (folder / "02_env.html").is_file()
    assert dict(os.environ) == before  # the diagnosis told its kernels, not this process


def test_report_folders_never_collide(tmp_path):
    now = dt.datetime(2026, 11, 22, 10, 30, 0)
    first_temp, first = new_report_folder(tmp_path, "demo", now)
    first_temp.rename(first)
    second_temp, second = new_report_folder(tmp_path, "demo", now)
    assert first != second and first.name == "103000-demo" and second.name == "103000-demo-2"
    assert first.parent.name == "2026-11-22" and second_temp.name.endswith(".partial")


def test_notebooks_run_side_by_side_only_when_two_copies_fit_easily(demo, monkeypatch):
    import os

    target = resolve_target(str(demo.llama))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr("workbench.model.memory.available_bytes", lambda: (16 * 1024**3, "test"))
    from workbench.report.runner import parallel_jobs

    assert parallel_jobs(target, 4) == 2
    assert parallel_jobs(target, 1) == 1
    monkeypatch.setattr("workbench.model.memory.estimated_load_bytes", lambda t: 3 * 1024**3)  # a 3 GB model
    assert parallel_jobs(target, 4) == 1
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    monkeypatch.setattr("workbench.model.memory.estimated_load_bytes", lambda t: 1000)
    assert parallel_jobs(target, 4) == 1


@pytest.mark.slow
def test_a_notebook_that_kills_its_kernel_leaves_the_next_a_fresh_one(demo, tmp_path, contract_notebook):
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    nbformat.write(contract_notebook("import os\nos._exit(3)", ["dead.check"]), notebooks / "01_dies.ipynb")
    nbformat.write(contract_notebook("x = 1", []), notebooks / "02_after.ipynb")
    folder, findings = diagnose(resolve_target(str(demo.llama)), reports_dir=tmp_path / "reports",
                                notebook_dir=notebooks, echo=lambda line: None)
    report = json.loads((folder / "findings.json").read_text())
    assert [(n["status"], n["kernel"]) for n in report["notebooks"]] == [("error", "shared"), ("ok", "fresh")]
    assert report["cost"]["kernels_started"] == 2
    assert [f.verdict for f in findings if f.id == "dead.check"] == ["error"]
    # written as far as it ran, before the kernel died
    assert nbformat.read(folder / "01_dies.ipynb", as_version=4).cells[-1].source == "import os\nos._exit(3)"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["t5", "bert_seq_cls", "bert_encoder", "llava"])
def test_a_healthy_checkpoint_of_each_head_kind_diagnoses_clean_for_one_model_load(family, name, tmp_path):
    # one full diagnosis per head kind beyond the demo's (image-text-to-text) and the causal LMs above: the default
    # set-up, every notebook in one kernel; a healthy checkpoint gets no fail and no error. What it costs: one load,
    # the prepared model, shared by notebooks 01-05 — the wrapping chain walks a copy of its module tree, and the
    # 4-bit/8-bit census is the meta-device prediction once the checkpoint is above real_quant_max_bytes (here 0;
    # test_family_matrix proves prediction = real load for every family)
    target = resolve_target(str(family(name)), params={"real_quant_max_bytes": 0})
    folder, findings = diagnose(target, reports_dir=tmp_path / "reports", echo=lambda line: None)
    report = json.loads((folder / "findings.json").read_text())
    assert {n["status"] for n in report["notebooks"]} == {"ok"}
    assert not [(f.id, f.verdict, f.title) for f in findings if f.verdict in ("fail", "error")]
    assert report["cost"]["model_loads"] == 1 and report["cost"]["kernels_started"] == 1, report["cost"]
    assert [(load["notebook"], load["why"]) for load in report["cost"]["loads"]] == [
        ("01_dtype_distribution", "the model the set-up prepares")]
    # the full-model forwards each step ran: grad.flow's training step one with autograd; the forward matrix only
    # those no earlier step ran on the batch (eval under autocast, the traced train cell)
    steps = {f"{s['notebook'][:2]}/{s['step']}": s for s in report["cost"]["steps"]}
    assert all(isinstance(s["forwards"], int) and s["peak_rss_bytes"] > 0 for s in steps.values())  # kernel's peak
    assert max(s["peak_rss_bytes"] for s in steps.values()) <= report["cost"]["peak_rss_bytes"]
    assert steps["04/grads"]["forwards_with_grad"] == 1 and steps["04/forward"]["forwards"] <= 2, steps
    chain = next(f for f in findings if f.id == "peft.attributes")
    assert chain.evidence["raw_model_from"] == "a copy of the shared model's module tree (no load)"
