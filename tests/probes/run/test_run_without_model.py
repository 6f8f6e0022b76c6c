"""A Trainer output_dir whose adapter names a base that cannot be reached (a run copied off a cluster): the run
autopsy needs no model and still runs; the notebooks that load the model say skip, naming the base and --base."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from workbench.errors import UsageError
from workbench.model.target import resolve_target

UNREACHABLE = "someorg/private-base-7b"  # a hub id this machine cannot reach (HF_HUB_OFFLINE)


def lora_trainer_run(out: Path) -> tuple[Path, Path]:
    """A real Trainer run of a LoRA on a tiny local Llama: (output_dir, the base folder it was trained on)."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    torch.manual_seed(0)
    base = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32))
    base_dir = out.parent / f"{out.name}-base"
    base.save_pretrained(base_dir)
    model = get_peft_model(LlamaForCausalLM.from_pretrained(base_dir),
                           LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"]))
    rows = [{"input_ids": [(i + j) % 64 for j in range(8)], "labels": [(i + j) % 64 for j in range(8)]}
            for i in range(16)]
    args = TrainingArguments(str(out), max_steps=4, per_device_train_batch_size=4, learning_rate=1e-2,
                             logging_steps=1, save_steps=2, report_to=[], use_cpu=True, disable_tqdm=True)
    Trainer(model=model, args=args, train_dataset=rows).train()
    return out, base_dir


def point_base_at(run: Path, base: str) -> None:
    """Every adapter_config.json of the run records `base`, as when the run trained on a hub id."""
    for config in run.rglob("adapter_config.json"):
        data = json.loads(config.read_text())
        data["base_model_name_or_path"] = base
        config.write_text(json.dumps(data))


@pytest.fixture(scope="module")
def orphan_run(tmp_path_factory) -> Path:
    run, _ = lora_trainer_run(tmp_path_factory.mktemp("orphan") / "out")
    point_base_at(run, UNREACHABLE)
    return run


def test_the_target_resolves_without_its_model_and_names_the_fix(orphan_run, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    target = resolve_target(str(orphan_run), hub="cache")
    assert target.run is not None and target.model_unavailable and UNREACHABLE in target.model_unavailable
    assert f"a local copy of {UNREACHABLE}" in target.base_fix and "--base" in target.base_fix
    assert target.as_contract()["model_unavailable"] == target.model_unavailable
    again = resolve_target(**target.options(), hub="cache")  # what a notebook kernel resolves
    assert again.run == target.run and again.model_unavailable == target.model_unavailable
    with pytest.raises(UsageError, match=UNREACHABLE):
        target.require_model()
    inside = resolve_target(str(orphan_run / "checkpoint-2"), hub="cache")  # a checkpoint-N folder of the run
    assert inside.run is not None and inside.model_unavailable


def test_an_adapter_folder_that_is_no_run_still_exits_2(orphan_run, tmp_path, monkeypatch):
    import shutil

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    shutil.copytree(orphan_run / "checkpoint-4", tmp_path / "adapter",
                    ignore=shutil.ignore_patterns("trainer_state.json"))
    with pytest.raises(UsageError, match=UNREACHABLE):
        resolve_target(str(tmp_path / "adapter"), hub="cache")


@pytest.mark.slow
def test_diagnose_runs_the_autopsy_and_skips_the_model_notebooks(orphan_run, tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-m", "workbench", "diagnose", str(orphan_run), "--notebooks", "00",
                             "04", "08", "--reports-dir", str(tmp_path)], capture_output=True, text=True, env=env,
                            timeout=600, stdin=subprocess.DEVNULL)
    assert result.returncode in (0, 1), result.stderr
    assert "only the run autopsy runs" in result.stdout and "Traceback" not in result.stderr
    [report] = tmp_path.glob("*/*/findings.json")
    data = json.loads(report.read_text())
    by_notebook = {}
    for f in data["findings"]:
        by_notebook.setdefault(f["notebook"], {})[f["id"]] = f
    autopsy = by_notebook["08_training_run"]
    assert {"run.loss", "run.gradients", "run.schedule", "run.eval", "run.adapter_progress", "run.versions"} <= \
        set(autopsy)
    assert all(f["verdict"] != "skip" for i, f in autopsy.items() if i in ("run.loss", "run.adapter_progress"))
    for name in ("00_saved_files", "04_forward_checks"):
        assert by_notebook[name] and all(f["verdict"] == "skip" and "--base" in f["fix"] and UNREACHABLE in f["fix"]
                                         for f in by_notebook[name].values())
    assert [n["name"] for n in data["notebooks"]] == ["08_training_run"]  # the skipped ones never ran
    failing = [f for f in data["findings"] if f["verdict"] in ("fail", "error")]
    assert result.returncode == (1 if failing else 0)
