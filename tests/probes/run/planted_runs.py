"""Trainer output directories made by the real `transformers.Trainer` on a tiny GPT-2 on the CPU, one per planted
defect and one healthy run: what `diagnose OUTPUT_DIR` and the run.* checks read."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

VOCAB = 32
SEQ = 12


@dataclasses.dataclass(frozen=True)
class PlantedRuns:
    healthy: Path  # learns (counting sequences), eval on held-out rows, checkpoints every 10 steps, final save
    nan_at_step: Path  # the loss turns NaN at step NAN_STEP (logging_nan_inf_filter on, the default)
    masked_labels: Path  # every label -100
    warmup_past_end: Path  # warmup_steps 200, max_steps 20
    classifier_ga: Path  # a fresh sequence-classification head, gradient_accumulation_steps 4 (transformers #47688)
    eval_leak: Path  # eval rows are training rows, their random half masked: eval loss far below train
    classifier_plain: Path  # the same head without gradient accumulation: its first loss is ln(2)
    no_final_save: Path  # checkpoints only (checkpoint-10, checkpoint-20), no save at the root


NAN_STEP = 8
CLASSIFIER_GA = 4


def _rows(n: int, *, seed: int, kind: str = "count"):
    import torch

    g = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(n):
        start = int(torch.randint(0, VOCAB, (1,), generator=g))
        ids = [(start + j) % VOCAB for j in range(SEQ)]
        if kind == "half_random":  # counting, then random tokens nothing can predict
            ids[SEQ // 2:] = torch.randint(0, VOCAB, (SEQ - SEQ // 2,), generator=g).tolist()
        rows.append({"input_ids": ids, "labels": list(ids)})
    return rows


def _model(head: str = "lm"):
    import torch
    from transformers import GPT2Config, GPT2ForSequenceClassification, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=SEQ, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, pad_token_id=0, bos_token_id=VOCAB - 1,
                        eos_token_id=VOCAB - 1)
    if head == "classifier":
        config.num_labels = 2
        return GPT2ForSequenceClassification(config)
    return GPT2LMHeadModel(config)


class _NaNFrom:
    """A forward hook making the loss NaN from training step `step` on (each forward is one step: GA 1)."""

    def __init__(self, step: int) -> None:
        self.step, self.calls = step, 0

    def __call__(self, module, args, output):
        if module.training:
            self.calls += 1
            if self.calls == self.step:
                output.loss = output.loss * float("nan")
        return output


def _train(out: Path, *, model=None, train=None, evaluation=None, final_save: bool = True, **arguments) -> Path:
    from transformers import Trainer, TrainingArguments

    model = model if model is not None else _model()
    options = {"per_device_train_batch_size": 4, "learning_rate": 1e-2, "max_steps": 30, "logging_steps": 1,
               "save_steps": 10, "warmup_steps": 2, "report_to": [], "disable_tqdm": True, "seed": 0,
               "use_cpu": True, "dataloader_num_workers": 0, "save_only_model": True}
    if evaluation is not None:
        options.update(eval_strategy="steps", eval_steps=5, per_device_eval_batch_size=8)
    options.update(arguments)
    trainer = Trainer(model=model, args=TrainingArguments(output_dir=str(out), **options),
                      train_dataset=train if train is not None else _rows(64, seed=1), eval_dataset=evaluation)
    trainer.train()
    if final_save:
        trainer.save_model()
        trainer.save_state()
    return out


def build_planted_runs(root: Path) -> PlantedRuns:
    root = Path(root)
    healthy = _train(root / "healthy", evaluation=_rows(16, seed=2))
    nan_model = _model()
    nan_model.register_forward_hook(_NaNFrom(NAN_STEP))
    nan = _train(root / "nan_at_step", model=nan_model, max_steps=16)
    masked = [{**r, "labels": [-100] * SEQ} for r in _rows(32, seed=1)]
    masked_run = _train(root / "masked_labels", train=masked, max_steps=10)
    warmup = _train(root / "warmup_past_end", max_steps=20, warmup_steps=200)
    classifier_rows = [{"input_ids": r["input_ids"], "labels": i % 2} for i, r in enumerate(_rows(64, seed=3))]
    classifier = _train(root / "classifier_ga", model=_model("classifier"), train=classifier_rows, max_steps=8,
                        per_device_train_batch_size=2, gradient_accumulation_steps=CLASSIFIER_GA, learning_rate=1e-4)
    half = _rows(64, seed=1, kind="half_random")
    leaked = [{**r, "labels": r["labels"][:SEQ // 2] + [-100] * (SEQ - SEQ // 2)} for r in half[:16]]
    leak = _train(root / "eval_leak", train=half, evaluation=leaked)
    no_final = _train(root / "no_final_save", max_steps=20, final_save=False)
    classifier_plain = _train(root / "classifier_plain", model=_model("classifier"), train=classifier_rows,
                              max_steps=8, per_device_train_batch_size=8, learning_rate=1e-4)
    return PlantedRuns(healthy=healthy, nan_at_step=nan, masked_labels=masked_run, warmup_past_end=warmup,
                       classifier_ga=classifier, eval_leak=leak, classifier_plain=classifier_plain,
                       no_final_save=no_final)


def expected_initial_loss(classes: int) -> float:
    return math.log(classes)
