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
    no_gradient: Path  # only a head the loss never reaches is trainable (input grads on): grad_norm 0.0 throughout
    overfit: Path  # four rows learned by heart, eval on other text: eval loss rises while training falls
    lr_zero: Path  # learning_rate=0.0
    constant_scheduler: Path  # Trainer(optimizers=(AdamW, a constant LambdaLR)); the model card says "linear"
    plateau_scheduler: Path  # lr_scheduler_type reduce_lr_on_plateau, eval improving: a constant rate is its contract
    fp16_skips: Path  # fp16 with a GradScaler that overflows at times, the default fused AdamW
    fp16_skips_unfused: Path  # the same with optim="adamw_torch"


NAN_STEP = 8
CLASSIFIER_GA = 4
OVERFIT_EVALS = 6  # eval_steps 5 over max_steps 30


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


def _train(out: Path, *, model=None, train=None, evaluation=None, final_save: bool = True, card: bool = False,
           optimizers=(None, None), prepare=None, **arguments) -> Path:
    """Train with the real Trainer. `optimizers` goes to Trainer(optimizers=...); `prepare(trainer)` runs between
    building the Trainer and `train()`; `card` writes the Trainer's model card (`create_model_card`, as
    `push_to_hub` does)."""
    from transformers import Trainer, TrainingArguments

    model = model if model is not None else _model()
    options = {"per_device_train_batch_size": 4, "learning_rate": 1e-2, "max_steps": 30, "logging_steps": 1,
               "save_steps": 10, "warmup_steps": 2, "report_to": [], "disable_tqdm": True, "seed": 0,
               "use_cpu": True, "dataloader_num_workers": 0, "save_only_model": True}
    if evaluation is not None:
        options.update(eval_strategy="steps", eval_steps=5, per_device_eval_batch_size=8)
    options.update(arguments)
    trainer = Trainer(model=model, args=TrainingArguments(output_dir=str(out), **options),
                      train_dataset=train if train is not None else _rows(64, seed=1), eval_dataset=evaluation,
                      optimizers=optimizers)
    if prepare is not None:
        prepare(trainer)
    trainer.train()
    if final_save:
        trainer.save_model()
        trainer.save_state()
    if card:
        trainer.create_model_card()
    return out


def _head_off_the_loss():
    """GPT-2 with its multiple-choice head: the language-model loss never reaches that head. Everything else frozen
    and the embedding output made to require grad (`enable_input_require_grads`, as peft's
    prepare_model_for_kbit_training does), so the loss has a graph but no trainable tensor is on it."""
    import torch
    from transformers import GPT2DoubleHeadsModel

    torch.manual_seed(0)
    model = GPT2DoubleHeadsModel(_model().config)
    model.requires_grad_(False)
    model.multiple_choice_head.requires_grad_(True)
    model.enable_input_require_grads()
    return model


def _constant_schedule(model):
    """The optimizer and scheduler a user passes as Trainer(optimizers=...): AdamW and a constant LambdaLR."""
    import torch

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)


def _fp16_grad_scaler(trainer) -> None:
    """What accelerate builds for fp16 on an accelerator (accelerate 1.15 accelerator.py, `mixed_precision ==
    "fp16" and self.device.type != "cpu"`: native_amp and a GradScaler), made here with torch's CPU GradScaler since
    accelerate builds none on the CPU (fp16=True there trains in fp32 without a scaler). growth_interval 2 doubles
    the scale every two clean steps, so it overflows again now and then and the scaler skips those steps."""
    import torch

    trainer.accelerator.native_amp = True
    trainer.accelerator.scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16, growth_interval=2)


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
    quick = {"save_strategy": "no"}  # the runs below need the final save only
    no_gradient = _train(root / "no_gradient", model=_head_off_the_loss(), max_steps=6, **quick)
    reversed_rows = [{"input_ids": ids, "labels": list(ids)}
                     for ids in ([(start - j) % VOCAB for j in range(SEQ)] for start in range(8))]
    overfit = _train(root / "overfit", train=_rows(4, seed=5), evaluation=reversed_rows, learning_rate=3e-2,
                     warmup_steps=0, **quick)
    lr_zero = _train(root / "lr_zero", max_steps=6, learning_rate=0.0, **quick)
    constant_model = _model()
    constant = _train(root / "constant_scheduler", model=constant_model, optimizers=_constant_schedule(constant_model),
                      max_steps=20, card=True, **quick)
    plateau = _train(root / "plateau_scheduler", evaluation=_rows(16, seed=2), max_steps=20, warmup_steps=0,
                     lr_scheduler_type="reduce_lr_on_plateau", card=True, **quick)
    fp16 = _train(root / "fp16_skips", max_steps=20, fp16=True, prepare=_fp16_grad_scaler, card=True, **quick)
    fp16_unfused = _train(root / "fp16_skips_unfused", max_steps=20, fp16=True, optim="adamw_torch",
                          prepare=_fp16_grad_scaler, card=True, **quick)
    return PlantedRuns(healthy=healthy, nan_at_step=nan, masked_labels=masked_run, warmup_past_end=warmup,
                       classifier_ga=classifier, eval_leak=leak, classifier_plain=classifier_plain,
                       no_final_save=no_final, no_gradient=no_gradient, overfit=overfit, lr_zero=lr_zero,
                       constant_scheduler=constant, plateau_scheduler=plateau, fp16_skips=fp16,
                       fp16_skips_unfused=fp16_unfused)


def expected_initial_loss(classes: int) -> float:
    return math.log(classes)
