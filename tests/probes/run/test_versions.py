"""run.versions on model cards the real Trainer writes (`trainer.create_model_card()` on a tiny model, versions
edited to the release under test) and configs `save_pretrained` writes: a row fires only when its versions match
and its condition holds for this run; a condition the files do not record says "cannot tell"."""

import re
from pathlib import Path

from workbench.probes.run.versions import known_regressions, print_regressions, versions_probe


def tiny(head: str):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, num_labels=3, pad_token_id=0)
    return (LlamaForSequenceClassification if head == "seq_cls" else LlamaForCausalLM)(config)


def trainer_run(out: Path, head="causal", transformers_version=None, **args) -> Path:
    """An output_dir as the Trainer leaves it: checkpoint-4/ with the model and trainer_state.json, the model card
    at the root (Trainer.create_model_card), the recorded transformers version edited when asked."""
    from transformers import Trainer, TrainingArguments

    model = tiny(head)
    trainer = Trainer(model=model, args=TrainingArguments(str(out), report_to=[], per_device_train_batch_size=2,
                                                          max_steps=4, use_cpu=True, **args))
    trainer.save_model(str(out / "checkpoint-4"))
    trainer.state.global_step = 4
    trainer.state.save_to_json(str(out / "checkpoint-4" / "trainer_state.json"))
    trainer.create_model_card()
    if transformers_version:
        for path in (out / "README.md", out / "checkpoint-4" / "config.json"):
            text = path.read_text()
            text = re.sub(r"- Transformers \S+", f"- Transformers {transformers_version}", text)
            text = re.sub(r'"transformers_version": "[^"]+"', f'"transformers_version": "{transformers_version}"', text)
            path.write_text(text)
    return out


def only(result):
    [f] = result.findings()
    assert f.id == "run.versions"
    return f


def test_the_table_has_confirmed_rows_with_citations(capsys):
    rows = known_regressions()
    assert len(rows) >= 15 and len({r.id for r in rows}) == len(rows)
    assert all(r.urls and all(u.startswith("https://github.com/") for u in r.urls) for r in rows)
    assert all(r.severity in ("fail", "warn") and r.when and r.fix and r.source for r in rows)
    assert print_regressions() == 0
    out = capsys.readouterr().out
    assert "transformers-5-classification-heads-ga" in out and "issues/47688" in out


def test_sequence_classification_under_gradient_accumulation_fails_and_its_twin_passes(tmp_path):
    f = only(versions_probe(trainer_run(tmp_path / "cls", head="seq_cls", gradient_accumulation_steps=4)))
    assert f.verdict == "fail" and "transformers-5-classification-heads-ga" in f.title, f
    assert "gradient_accumulation_steps 4" in f.detail and "head sequence_classification" in f.detail
    assert "model_accepts_loss_kwargs = False" in f.fix
    assert f.evidence["versions"]["transformers"] == "5.23.0"
    twin = only(versions_probe(trainer_run(tmp_path / "cls1", head="seq_cls")))
    assert twin.verdict == "pass" and "transformers 5.23.0" in twin.title, twin


def test_label_smoothing_with_accumulation_on_an_affected_release(tmp_path):
    run = trainer_run(tmp_path / "ls", transformers_version="4.50.0", gradient_accumulation_steps=2,
                      label_smoothing_factor=0.1)
    f = only(versions_probe(run))
    assert f.verdict == "fail" and "transformers-label-smoothing-ga" in f.title, f
    assert "label_smoothing_factor 0.1" in f.detail and "pull/47261" in f.detail
    # the same run on 5.23 (fixed in 5.15.0), and the same release without label smoothing: quiet
    fixed = only(versions_probe(trainer_run(tmp_path / "ls523", gradient_accumulation_steps=2,
                                            label_smoothing_factor=0.1)))
    assert fixed.verdict == "pass", fixed
    plain = only(versions_probe(trainer_run(tmp_path / "plain450", transformers_version="4.50.0",
                                            gradient_accumulation_steps=2)))
    assert plain.verdict == "pass", plain


def trl_card(folder: Path, trl="0.15.1", transformers="4.49.0", trainer="SFT") -> Path:
    """trl's model card (trl/templates/lm_model_card.md, rendered) with the versions under test."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "README.md").write_text(
        "---\nbase_model: tiny\nlibrary_name: transformers\nmodel_name: out\ntags:\n- generated_from_trainer\n"
        f"- trl\n- {trainer.lower()}\nlicence: license\n---\n\n# Model Card for out\n\n"
        "It has been trained using [TRL](https://github.com/huggingface/trl).\n\n## Training procedure\n\n"
        f"This model was trained with {trainer}.\n\n### Framework versions\n\n- TRL: {trl}\n"
        f"- Transformers: {transformers}\n- Pytorch: 2.6.0\n- Datasets: 3.3.2\n- Tokenizers: 0.21.0\n")
    return folder


def test_trl_sft_without_eos_and_its_fixed_release(tmp_path):
    f = only(versions_probe(trl_card(tmp_path / "sft015")))
    assert f.verdict == "warn" and "trl-0.15-sft-no-eos" in f.title, f
    assert "trainer SFT" in f.detail and "pull/3091" in f.detail
    assert only(versions_probe(trl_card(tmp_path / "sft016", trl="0.16.0"))).verdict in ("pass", "info")
    dpo = only(versions_probe(trl_card(tmp_path / "dpo015", trainer="DPO")))
    assert "trl-0.15-sft-no-eos" not in dpo.title


def test_a_condition_the_files_do_not_record_says_cannot_tell(tmp_path):
    # a DPO run on an affected pair of releases: the trl card records no gradient accumulation
    f = only(versions_probe(trl_card(tmp_path / "dpo", trl="0.13.0", transformers="4.48.1", trainer="DPO")))
    assert f.verdict == "info" and "Cannot tell" in f.title and "trl-dpo-ga-scaling" in f.title, f
    assert "gradient_accumulation_steps: not recorded" in f.detail
    # the caller's TrainingArguments settle it
    held = only(versions_probe(tmp_path / "dpo", training_args={"gradient_accumulation_steps": 8}))
    assert held.verdict == "fail" and "trl-dpo-ga-scaling" in held.title, held
    quiet = only(versions_probe(tmp_path / "dpo", training_args={"gradient_accumulation_steps": 1}))
    assert "trl-dpo-ga-scaling" not in quiet.title


def test_no_recorded_versions_is_info(tmp_path):
    (tmp_path / "checkpoint-2").mkdir()
    f = only(versions_probe(tmp_path))
    assert f.verdict == "info" and "No versions recorded" in f.title


def trained_classifier(out: Path, config_class: str, model_class: str, num_labels: int = 2) -> tuple[Path, float]:
    """One optimizer step of the real Trainer at gradient_accumulation_steps 4 on a tiny classifier, saved with its
    model card: config.json then records the problem_type its loss set. Returns the folder and the logged loss."""
    import math

    import torch
    import transformers
    from transformers import Trainer, TrainingArguments

    from workbench.architectures.tiny_config import tiny_config

    config = tiny_config(getattr(transformers, config_class), num_labels=num_labels, pad_token_id=0, vocab_size=32)
    torch.manual_seed(0)
    model = getattr(transformers, model_class)(config)
    g = torch.Generator().manual_seed(0)
    rows = [{"input_ids": torch.randint(1, 32, (8,), generator=g).tolist(),
             "labels": (i % 2) if num_labels > 1 else float(i % 2)} for i in range(16)]
    trainer = Trainer(model=model, train_dataset=rows, args=TrainingArguments(
        str(out), report_to=[], per_device_train_batch_size=2, gradient_accumulation_steps=4, max_steps=1,
        logging_steps=1, learning_rate=1e-5, use_cpu=True, save_strategy="no", disable_tqdm=True))
    trainer.train()
    trainer.save_model()
    trainer.save_state()
    trainer.create_model_card()
    [loss] = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    assert math.isfinite(loss)
    return out, loss


def test_classifiers_whose_loss_sees_the_accumulation_are_exempt(tmp_path):
    """ESM (accepts_loss_kwargs = False) and Zamba2's single-label head (num_items_in_batch reaches its loss) log
    a first loss near ln(2) under gradient accumulation 4, not 4·ln(2): the row stays quiet for them."""
    import math

    for config_class, model_class in (("EsmConfig", "EsmForSequenceClassification"),
                                      ("Zamba2Config", "Zamba2ForSequenceClassification")):
        run, first_loss = trained_classifier(tmp_path / model_class, config_class, model_class)
        assert abs(first_loss - math.log(2)) < 0.25, (model_class, first_loss)
        result = versions_probe(run)
        [row] = [r for r in result.rows if r.row.id == "transformers-5-classification-heads-ga"]
        assert row.status == "not_met" and any(r.startswith("exempt:") and model_class in r for r in row.reasons), row
        assert "transformers-5-classification-heads-ga" not in only(result).title


def test_zamba2_regression_head_stays_affected(tmp_path):
    run, _ = trained_classifier(tmp_path / "reg", "Zamba2Config", "Zamba2ForSequenceClassification", num_labels=1)
    result = versions_probe(run)
    assert result.facts.problem_type == "regression"  # MSELoss's mean: the accumulation inflates it
    f = only(result)
    assert f.verdict == "fail" and "transformers-5-classification-heads-ga" in f.title, f
