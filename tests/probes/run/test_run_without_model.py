"""A Trainer output_dir whose adapter names a base that cannot be reached (a run copied off a cluster): the run
autopsy needs no model and still runs; the notebooks that load the model say skip, naming the base and --base."""

import json
from pathlib import Path

import pytest
import torch

from workbench.errors import UsageError
from workbench.model.target import resolve_target

pytestmark = pytest.mark.slow  # a real Trainer run, built once for the module

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

# the CLI end to end on such a run: tests/entry_forms (test_cli_output_dir_with_an_unreachable_hub_base)
