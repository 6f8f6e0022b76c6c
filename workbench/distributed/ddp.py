"""`distributed.ddp`, rank side (run by `workbench.distributed.rank` under torchrun): the prepared model under
DistributedDataParallel.

`ddp_section` wraps the model in DDP for a baseline (find_unused_parameters=False, each rank's own gradients seen
under no_sync() first), the Trainer's own wrapping, the fixes for what failed, and what reentrant checkpointing
would do; it counts what name-based selections find on the bare model and under the wrapper's `module.` prefix.
The verdict on all ranks is `ddp_verdict.ddp_finding`, in the parent.
"""

from __future__ import annotations

import gc
import traceback
from typing import Any

from workbench.distributed.dataloader import data_loading_facts
from workbench.distributed.train_step import rank_inputs, short_error, train_step

READY_TWICE = "Expected to mark a variable ready only once"
UNFINISHED = "Expected to have finished reduction in the prior iteration"

REENTRANT_FIX = ("gradient_checkpointing_kwargs={'use_reentrant': False} (transformers 5's default), or "
                 "TrainingArguments(ddp_find_unused_parameters=False), or ddp_static_graph=True")


# ----- rank side: the trials -----

def grad_checksums(model) -> dict[str, list[float] | None]:
    """Per trainable tensor: [sum, norm] of its gradient in float64, or None when it has none."""
    import torch

    out: dict[str, list[float] | None] = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            g = None if p.grad is None else p.grad.detach().to(torch.float64)
            out[name] = None if g is None else [float(g.sum()), float(g.norm())]
    return out


def ddp_trial(model, inputs: dict, compute, label: str, role: str, *, steps: int = 2, local_first: bool = False,
              **ddp_kwargs: Any) -> dict[str, Any]:
    """Wrap in DistributedDataParallel, run `steps` synchronised steps (a prior-iteration error shows on the second),
    and, with `local_first`, one step under no_sync() first to see each rank's own gradients."""
    from torch.nn.parallel import DistributedDataParallel

    device = next((p.device for p in model.parameters()), None)
    device_ids = [device.index] if device is not None and device.type == "cuda" else None
    trial: dict[str, Any] = {"label": label, "role": role, "ddp_kwargs": ddp_kwargs, "losses": [], "error": None,
                             "failed_step": None}
    ddp = DistributedDataParallel(model, device_ids=device_ids, **ddp_kwargs)
    wrapped, bare = next(iter(ddp.named_parameters()))[0], next(iter(model.named_parameters()))[0]
    trial["wrapped_prefix"] = wrapped[: len(wrapped) - len(bare)]  # asked from the wrapper: "module."
    step = "local"
    try:
        if local_first:
            with ddp.no_sync():
                trial["local_loss"] = train_step(ddp, inputs, compute)
            trial["local_grads"] = grad_checksums(model)
            model.zero_grad(set_to_none=True)
        for step in range(steps):
            trial["losses"].append(train_step(ddp, inputs, compute))
            if step == 0:
                trial["grads"] = grad_checksums(model)
            model.zero_grad(set_to_none=True)
    except Exception as exc:  # noqa: BLE001 - the DDP error is the finding
        trial["error"] = short_error(exc)
        trial["failed_step"] = step
        trial["traceback"] = "".join(traceback.format_exception(exc))[-3000:]
    finally:
        model.zero_grad(set_to_none=True)
        del ddp  # its reducer's autograd hooks go with it: the next trial wraps the same model afresh
        gc.collect()
    return trial


def trainer_ddp_kwargs(model, find_unused: bool | None = None) -> dict[str, Any]:
    """find_unused_parameters / static_graph as the installed Trainer hands them to accelerate's DDP, asked from
    `Trainer._build_accelerator_args` on a stand-in (nothing is trained); its own rule if that cannot run."""
    import tempfile
    import types

    import transformers
    from transformers import PreTrainedModel, Trainer, TrainingArguments

    try:
        with tempfile.TemporaryDirectory(prefix="workbench-args-") as out:
            args = TrainingArguments(output_dir=out, report_to=[], ddp_find_unused_parameters=find_unused)
            built = Trainer._build_accelerator_args(types.SimpleNamespace(args=args, model=model))
        handler = built["kwargs_handlers"][0]
        kwargs = {"find_unused_parameters": bool(handler.find_unused_parameters),
                  "static_graph": bool(handler.static_graph)}
        source = f"transformers {transformers.__version__} Trainer._build_accelerator_args"
    except Exception as exc:  # noqa: BLE001 - a release without that helper: transformers 5.23's rule
        checkpointing = isinstance(model, PreTrainedModel) and any(
            getattr(m, "gradient_checkpointing", False) for m in model.modules())
        rule = find_unused if find_unused is not None else (
            not checkpointing if isinstance(model, PreTrainedModel) else True)
        kwargs = {"find_unused_parameters": rule, "static_graph": False}
        source = f"transformers 5.23's rule (the installed Trainer could not be asked: {short_error(exc)})"
    why = ("ddp_find_unused_parameters as given" if find_unused is not None else
           "not gradient checkpointing (a PreTrainedModel)" if isinstance(model, PreTrainedModel) else
           f"{type(model).__name__} is not a PreTrainedModel: the Trainer passes True")
    return {"kwargs": kwargs, "source": source, "why": why}


def enable_checkpointing(model, reentrant: bool) -> None:
    """Gradient checkpointing on the transformers model inside any wrapper, as the Trainer turns it on."""
    from workbench.model.components import unwrap_model

    inner, _ = unwrap_model(model)
    kwargs = {"use_reentrant": reentrant}
    if hasattr(inner, "activation_checkpointing_enable"):
        inner.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        inner.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def ddp_trials(model, inputs: dict, compute, trainer: dict, checkpointing: dict) -> list[dict[str, Any]]:
    """The baseline (find_unused_parameters=False), the Trainer's wrapping, the fixes for what failed, and — when the
    set-up left checkpointing off — what reentrant checkpointing would do under find_unused_parameters=True."""
    baseline = ddp_trial(model, inputs, compute, "find_unused_parameters=False", "baseline", local_first=True,
                         find_unused_parameters=False)
    trials = [baseline]
    wanted = trainer["kwargs"]
    user = baseline
    if wanted != {"find_unused_parameters": False, "static_graph": False}:
        user = ddp_trial(model, inputs, compute, "as the Trainer wraps it: " + ", ".join(
            f"{k}={v}" for k, v in wanted.items()), "trainer", **wanted)
        trials.append(user)
    if READY_TWICE in (user["error"] or ""):
        trials.append(ddp_trial(model, inputs, compute, "fix: static_graph=True", "fix",
                                **{**wanted, "static_graph": True}))
        enable_checkpointing(model, reentrant=False)
        trials.append(ddp_trial(model, inputs, compute, "fix: use_reentrant=False", "fix", **wanted))
        enable_checkpointing(model, reentrant=True)
    if UNFINISHED in (baseline["error"] or "") and not wanted["find_unused_parameters"]:
        trials.append(ddp_trial(model, inputs, compute, "fix: find_unused_parameters=True", "fix",
                                find_unused_parameters=True))
    if not checkpointing["enabled"] and checkpointing.get("supported"):
        enable_checkpointing(model, reentrant=True)
        trials.append(ddp_trial(model, inputs, compute, "what if: use_reentrant=True, find_unused_parameters=True",
                                "what if", find_unused_parameters=True))
    return trials


def name_selections(model, prefix: str, params: dict) -> list[dict[str, Any]]:
    """Name-based selections a training script makes, counted on the bare model's names and on the wrapper's
    (`prefix` + name): top-level modules and component prefixes anchored at the start, LoRA by substring, and the
    parameters file's component patterns as the workbench applies them (re.search)."""
    import re

    from workbench.model.components import ComponentClassifier

    names = [n for n, _ in model.named_parameters()]
    rules: dict[str, tuple[str, Any]] = {}
    for top in dict.fromkeys(n.split(".", 1)[0] for n in names if "." in n):
        rules[f'name.startswith("{top}.")'] = ("top-level module", lambda n, p=top + ".": n.startswith(p))
    for path, component in ComponentClassifier.from_model(model).prefixes:
        rules.setdefault(f'name.startswith("{path}.")', (f"{component} component",
                                                         lambda n, p=path + ".": n.startswith(p)))
    if any(".lora_" in n for n in names):
        rules['"lora_" in name'] = ("LoRA weights", lambda n: "lora_" in n)
    for component, patterns in (params.get("components") or {}).items():
        for pattern in patterns:
            rules[f"re.search({pattern!r}, name)"] = (f"parameters file: components.{component}",
                                                      lambda n, rx=re.compile(pattern): bool(rx.search(n)))
    rows = []
    for selection, (source, test) in rules.items():
        bare = sum(1 for n in names if test(n))
        wrapped = sum(1 for n in names if test(prefix + n))
        rows.append({"selection": selection, "source": source, "bare": bare, "under_ddp": wrapped,
                     "lost": bare - wrapped})
    return rows


def ddp_section(model, target, spec: dict, rank: int) -> dict[str, Any]:
    from workbench.model.checkpointing import checkpointing_state
    from workbench.model.components import unwrap_model
    from workbench.model.dtypes import compute_dtype_of

    compute = compute_dtype_of(model)
    inputs, how = rank_inputs(model, target, rank)
    inner, _ = unwrap_model(model)
    checkpointing = {**checkpointing_state(model),
                     "supported": bool(getattr(inner, "supports_gradient_checkpointing", False))}
    trainer = trainer_ddp_kwargs(model, spec.get("ddp_find_unused_parameters"))
    section: dict[str, Any] = {
        "model": type(model).__name__, "compute_dtype": str(compute).removeprefix("torch."), "inputs": how,
        "trainable": sum(p.requires_grad for p in model.parameters()), "checkpointing": checkpointing,
        "trainer": trainer, "trials": [], "data_loading": data_loading_facts() if rank == 0 else None}
    if section["trainable"]:
        model.train()
        section["trials"] = ddp_trials(model, inputs, compute, trainer, checkpointing)
    # DDP refuses a model with nothing trainable; its names would still gain the same prefix
    prefix = section["trials"][0]["wrapped_prefix"] if section["trials"] else "module."
    names = [n for n, _ in model.named_parameters()]
    section["names"] = {"prefix": prefix, "bare_example": names[:3], "wrapped_example": [prefix + n for n in names[:3]],
                        "selections": name_selections(model, prefix, target.params)}
    return section
