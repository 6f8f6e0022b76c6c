"""`workbench explain --reproduce`: replay the failing step on a tiny twin of the user's model, then bisect the
set-up's toggles to the smallest change that makes it pass.

    twin = build_twin(target, folder)           # the user's config (architecture, dtype, sub-configs), sizes shrunk
    replay = REPLAYS["grad.no_grad_fn"]         # the step the symptom fails in, with the toggles that decide it
    result = reproduce(replay, twin_target)     # the failing run's error text, then each toggle flipped

The twin keeps the architecture class, the dtype and every non-size field of the checkpoint's config.json; its
sizes are shrunk by `architectures.tiny_config.shrunk_fields` (2 layers, width 64), its weights random from seed 0.
It goes through the user's own set-up (`--setup`: plain, qlora, qlora_trl_legacy, sft or module:function), so the
PEFT wrap, the quantization and the casts are the ones the user's run made. Each replay runs the real libraries on
the CPU: the real PEFT model, real gradient checkpointing, torch's own GradScaler and autocast. What needs a GPU is
said, never pretended: nn.DataParallel needs CUDA devices, so its replica is replayed as what it is on CPU too — the
forward in a worker thread started under autocast (autocast is thread-local) — and the result says so.

Reproduced means the replay raised an error whose text matches the symptom's own patterns; the bisection then
flips one toggle at a time (then pairs, if no single flip passes) and names the flips after which the step passes.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from pathlib import Path
from typing import Any, Callable

DEFAULT_SETUP = "qlora"


@dataclasses.dataclass(frozen=True)
class Toggle:
    name: str
    failing: Any  # the value the failing run had (as the symptom's cause implies)
    passing: Any  # the value of the change
    change: str  # the change in the user's terms


@dataclasses.dataclass(frozen=True)
class Replay:
    symptoms: tuple[str, ...]
    step: str  # what is replayed, in words
    toggles: tuple[Toggle, ...]
    run: Callable[[Any, dict[str, Any]], None] | None  # (twin target, toggle values) -> raises what the step raises
    simulated: str = ""  # what stands in for a GPU-only part, said in the result
    # (twin target, every set of toggle values) -> each one's error or None: replays that launch processes run
    # their trials in one launch
    batch: Callable[[Any, list[dict[str, Any]]], list[str | None]] | None = None


@dataclasses.dataclass
class Trial:
    values: dict[str, Any]
    flipped: tuple[str, ...]
    error: str | None
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        return {"flipped": list(self.flipped), "values": self.values, "passes": self.error is None,
                "error": self.error, "seconds": round(self.seconds, 2)}


@dataclasses.dataclass
class Reproduction:
    symptom: str
    step: str
    twin: str
    setup: str
    reproduced: bool
    trials: list[Trial]
    smallest_changes: list[str]
    simulated: str = ""
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"symptom": self.symptom, "step": self.step, "twin": self.twin, "setup": self.setup,
                "reproduced": self.reproduced, "smallest_changes": self.smallest_changes,
                "simulated": self.simulated or None, "note": self.note or None,
                "trials": [t.as_dict() for t in self.trials]}

    def text(self) -> str:
        lines = [f"Reproduction on a tiny twin ({self.twin}, set-up {self.setup}): {self.step}"]
        if self.simulated:
            lines.append(f"  simulated: {self.simulated}")
        first = self.trials[0] if self.trials else None
        if not self.reproduced:
            lines.append(f"  not reproduced: {self.note or (first.error if first else '')}")
            return "\n".join(lines)
        lines.append(f"  the failing set-up raises: {first.error}")
        for t in self.trials[1:]:
            lines.append(f"  flip {' + '.join(t.flipped)}: " + ("passes" if t.error is None else f"still fails "
                                                                                                 f"({t.error[:120]})"))
        lines.append("  smallest change that makes the step pass: " + ("; or ".join(self.smallest_changes)
                                                                       if self.smallest_changes else "none found"))
        return "\n".join(lines)


# ----- the twin -----

def _merge(base: dict[str, Any], shrunk: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in shrunk.items():
        out[key] = _merge(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict) else value
    return out


def build_twin(model_dir: Path, folder: Path) -> Path:
    """A tiny checkpoint of the same architecture class and dtype as `model_dir`'s config.json, saved in `folder`
    (the tokenizer files copied when present, so chat templates and special tokens stay the user's)."""
    import shutil

    import torch
    import transformers
    from transformers import AutoConfig

    from workbench.architectures.checkpoints import config_the_class_takes, fill_zero_weights
    from workbench.architectures.tiny_config import VOCAB, config_token_ids, shrunk_fields

    config = AutoConfig.from_pretrained(model_dir)  # never the checkpoint's own code
    names = list(getattr(config, "architectures", None) or [])
    model_class = next((getattr(transformers, n) for n in names if hasattr(transformers, n)), None)
    if model_class is None:
        from workbench.architectures.model_types import architectures

        arch = next((a for a in architectures() if a.model_type == config.model_type), None)
        if arch is None:
            raise ValueError(f"{model_dir}: no transformers class for model_type {config.model_type!r}")
        model_class = getattr(transformers, arch.class_name)
    vocab = max([VOCAB, *[i + 1 for i in config_token_ids(config)]])
    data = _merge(config.to_dict(), shrunk_fields(config, vocab))
    data.pop("quantization_config", None)  # the set-up quantizes, as the user's run did
    twin_config = config_the_class_takes(model_class, type(config).from_dict(data))
    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or torch.float32
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    torch.manual_seed(0)
    model = model_class(twin_config)
    fill_zero_weights(model)
    folder.mkdir(parents=True, exist_ok=True)
    model.to(dtype).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                 "preprocessor_config.json", "generation_config.json"):
        if (Path(model_dir) / name).is_file() and vocab >= getattr(config, "vocab_size", 0):
            shutil.copy(Path(model_dir) / name, folder / name)
    return folder


# ----- the replays -----

def _prepared(target):
    from workbench.model.setups import prepare_model

    return prepare_model(target)


def _batch(model, target) -> dict:
    from workbench.model.batch import target_inputs

    inputs, _how = target_inputs(model, target)
    return inputs


def _compute_dtype(model):
    from workbench.model.dtypes import compute_dtype_of

    return compute_dtype_of(model)


def _dataparallel_step(target, values: dict[str, Any]) -> None:
    """The Trainer's forward: under autocast in the compute dtype (bf16=True), in the main thread or in a worker
    thread started inside it (DataParallel's replica); the model's floating tensors cast to the compute dtype first
    when `cast_to_compute` (the fix that removes fp32 islands)."""
    import torch

    from workbench.model.forward import autocast

    prepared = _prepared(target)
    model = prepared.model
    dtype = _compute_dtype(model)
    if values["cast_to_compute"]:
        for p in (*model.parameters(), *model.buffers()):
            if p.is_floating_point() and p.dtype != dtype and p.__class__.__name__ != "Params4bit":
                p.data = p.data.to(dtype)
    inputs = _batch(model, target)
    model.train()
    errors: list[BaseException] = []

    def forward() -> None:
        try:
            model(**inputs)
        except BaseException as exc:  # noqa: BLE001 - the replica's error is the evidence
            errors.append(exc)

    context = autocast("cpu", dtype) if values["autocast"] else torch.autocast("cpu", enabled=False)
    with context:
        if values["data_parallel"]:
            worker = threading.Thread(target=forward)
            worker.start()
            worker.join()
        else:
            forward()
    if errors:
        raise errors[0]


def _checkpointing_step(target, values: dict[str, Any]) -> None:
    """A training step with gradient checkpointing as the Trainer turns it on (`distributed.ddp.enable_checkpointing`:
    use_reentrant as given), the embeddings' output requiring grad or not (enable_input_require_grads)."""
    from workbench.distributed.ddp import enable_checkpointing

    prepared = _prepared(target)
    model = prepared.model
    inner = getattr(model, "get_base_model", lambda: model)()
    enable_checkpointing(inner, reentrant=values["reentrant"])  # as the Trainer turns it on
    if values["input_grads"]:
        inner.enable_input_require_grads()
    else:  # every hook that makes the embeddings' output require grad: peft's prepare and transformers' own
        embeddings = inner.get_input_embeddings()
        for key, hook in list(embeddings._forward_hooks.items()):
            if getattr(hook, "__name__", "") == "make_inputs_require_grads":
                del embeddings._forward_hooks[key]
    model.train()
    out = model(**_batch(model, target))
    out.loss.backward()


def _fp16_step(target, values: dict[str, Any]) -> None:
    """A step as the Trainer runs fp16=True: autocast fp16, torch's GradScaler, unscale before clipping; the
    trainable tensors in fp16 (a model loaded in float16 whose adapter or modules_to_save copies stay fp16) or
    fp32."""
    import torch

    from workbench.model.forward import autocast

    prepared = _prepared(target)
    model = prepared.model
    trainable = [p for p in model.parameters() if p.requires_grad]
    for p in trainable:
        p.data = p.data.to(torch.float16 if values["trainable_fp16"] else torch.float32)
    optimizer = torch.optim.AdamW(trainable, lr=1e-4)
    scaler = torch.amp.GradScaler("cpu", enabled=values["grad_scaler"])
    model.train()
    with autocast("cpu", torch.float16 if values["grad_scaler"] else torch.bfloat16):
        loss = model(**_batch(model, target)).loss
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    scaler.step(optimizer)
    scaler.update()


DDP_RANKS = 2
DDP_TIMEOUT = 300.0


def _ddp_trials(target, trials: list[dict[str, Any]]) -> list[str | None]:
    """Every trial under real torchrun, two gloo ranks, in one launch (`workbench.explain.ddp_replay`); a trial's
    error is the first rank's that raised."""
    import json
    import os
    import tempfile

    from workbench.distributed.launcher import launch_ranks

    with tempfile.TemporaryDirectory(prefix="workbench-ddp-replay-") as folder:
        spec = Path(folder) / "spec.json"
        spec.write_text(json.dumps({"target": {"checkpoint": str(target.model_dir), "setup": target.setup,
                                               "quant": target.quant},
                                    "trials": trials, "timeout": DDP_TIMEOUT, "launcher_pid": os.getpid()}))
        run = launch_ranks("workbench.explain.ddp_replay", ["--spec", str(spec), "--out", folder],
                           ranks=DDP_RANKS, timeout=DDP_TIMEOUT, out_dir=folder)
    per_rank = [r.get("sections", {}).get("trials", {}).get("results", []) for r in run.results.values()]
    crashed = next((r["error"] for r in run.results.values() if r.get("error")), None)
    why = (f"{crashed['type']}: {crashed['message'][:300]}" if crashed else run.output_tail[-300:])
    out: list[str | None] = []
    for i in range(len(trials)):
        errors = [rows[i]["error"] for rows in per_rank if i < len(rows) and rows[i]["error"]]
        done = bool(per_rank) and all(i < len(rows) for rows in per_rank)
        out.append(errors[0] if errors else None if done else f"the ranks did not finish this trial ({why})")
    return out


REPLAYS: dict[str, Replay] = {r.symptoms[0]: r for r in (
    Replay(("dtype.linear_operands",), "the Trainer's training forward under bf16 autocast",
           (Toggle("data_parallel", True, False, "no DataParallel wrap: one GPU per process (torchrun "
                                                 "--nproc_per_node N, or CUDA_VISIBLE_DEVICES=0)"),
            Toggle("cast_to_compute", False, True, "no fp32 islands: every non-quantized tensor in the compute "
                                                   "dtype (model.to(torch.bfloat16) after the set-up)"),
            Toggle("autocast", True, False, "autocast off (bf16=False)")),
           _dataparallel_step,
           simulated="nn.DataParallel needs CUDA devices: its replica is replayed as the forward in a worker "
                     "thread started under autocast, which is what a replica is (autocast is thread-local)"),
    Replay(("grad.no_grad_fn", "grad.checkpoint_inputs_no_grad"), "a training step (forward, loss.backward()) "
           "with gradient checkpointing",
           (Toggle("reentrant", True, False, "gradient_checkpointing_kwargs={'use_reentrant': False}"),
            Toggle("input_grads", False, True, "model.enable_input_require_grads() before training")),
           _checkpointing_step),
    Replay(("precision.fp16_unscale",), "a Trainer fp16=True step: GradScaler scale, backward, unscale_",
           (Toggle("trainable_fp16", True, False, "trainable tensors in fp32 (load in float32 or cast the "
                                                  "trainable parameters to float32 after get_peft_model)"),
            Toggle("grad_scaler", True, False, "bf16=True instead of fp16=True (no GradScaler)")),
           _fp16_step),
    Replay(("distributed.marked_ready_twice",), "two DDP training steps on 2 ranks (torchrun, gloo), gradient "
           "checkpointing on as the Trainer turns it on",
           (Toggle("reentrant", True, False, "gradient_checkpointing_kwargs={'use_reentrant': False}"),
            Toggle("find_unused", True, False, "TrainingArguments(ddp_find_unused_parameters=False)"),
            Toggle("static_graph", False, True, "DDP static_graph=True (accelerate's "
                                                "DistributedDataParallelKwargs(static_graph=True))")),
           None, batch=_ddp_trials),
)}


def replay_for(symptom_id: str) -> Replay | None:
    return next((r for r in REPLAYS.values() if symptom_id in r.symptoms), None)


def _try(replay: Replay, target, values: dict[str, Any], flipped: tuple[str, ...]) -> Trial:
    from workbench.model.shared import free_shared

    start = time.monotonic()
    try:
        replay.run(target, values)
        error = None
    except Exception as exc:  # noqa: BLE001 - the replayed step's own error is the result
        error = f"{type(exc).__name__}: {str(exc)[:400]}"
    finally:
        free_shared()
    return Trial(dict(values), flipped, error, time.monotonic() - start)


def _batched(replay: Replay, target, failing: dict[str, Any]) -> list[Trial]:
    """The failing set-up, every single flip and every pair, run in one launch."""
    combos = [()] + [c for size in (1, 2) for c in itertools.combinations(replay.toggles, size)]
    values = [{**failing, **{t.name: t.passing for t in combo}} for combo in combos]
    start = time.monotonic()
    errors = replay.batch(target, values)
    each = (time.monotonic() - start) / len(values)
    return [Trial(v, tuple(t.name for t in combo), e, each) for v, combo, e in zip(values, combos, errors)]


def reproduce(replay: Replay, target, symptom) -> tuple[bool, list[Trial], list[str]]:
    """The failing set-up first (reproduced when its error matches the symptom), then single flips, then pairs."""
    failing = {t.name: t.failing for t in replay.toggles}
    ran = _batched(replay, target, failing) if replay.batch is not None else None
    first = ran[0] if ran else _try(replay, target, failing, ())
    trials = [first]
    if first.error is None or not any(r.search(first.error) for r in symptom.regexes):
        return False, trials, []
    changes: list[str] = []
    for size in (1, 2):
        for combo in itertools.combinations(replay.toggles, size):
            if any(set(c.split(" + ")) <= {t.name for t in combo} for c in changes):
                continue
            values = {**failing, **{t.name: t.passing for t in combo}}
            trial = next(t for t in ran if t.values == values) if ran else \
                _try(replay, target, values, tuple(t.name for t in combo))
            trials.append(trial)
            if trial.error is None:
                changes.append(" + ".join(t.name for t in combo))
        if changes:
            break
    by_name = {t.name: t.change for t in replay.toggles}
    return True, trials, [" + ".join(by_name[n] for n in c.split(" + ")) for c in changes]


def reproduce_for(explanation, args) -> dict[str, Any]:
    """`--reproduce`: the twin of --ckpt's model, the replay of the explained symptom, the bisection."""
    import tempfile

    from workbench.model.target import resolve_target

    symptom = explanation.symptom
    replay = replay_for(symptom.id)
    if replay is None:
        from workbench.explain.reproduce import REPLAYS as known

        return {"symptom": symptom.id, "reproduced": None,
                "note": f"no replay for {symptom.id} yet; the replays cover {', '.join(sorted(known))}"}
    from workbench.model.target import config_folder

    config_dir = config_folder(args.ckpt, args.base)
    setup = args.setup or DEFAULT_SETUP
    with tempfile.TemporaryDirectory(prefix="workbench-twin-") as folder:
        twin_dir = build_twin(config_dir, Path(folder) / "twin")
        twin = resolve_target(str(twin_dir), setup=setup, quant=args.quant or "none")
        reproduced, trials, changes = reproduce(replay, twin, symptom)
        twin_name = type_name(twin_dir)
    result = Reproduction(symptom.id, replay.step, f"{twin_name} from {config_dir}/config.json",
                          setup, reproduced, trials, changes, replay.simulated,
                          "" if reproduced else "the twin's step did not raise this symptom's error: the cause is "
                                                "not in this set-up's toggles, or needs the real sizes")
    return {**result.as_dict(), "text": result.text()}


def type_name(folder: Path) -> str:
    import json

    config = json.loads((folder / "config.json").read_text())
    return f"{(config.get('architectures') or ['?'])[0]} ({config.get('model_type')})"
