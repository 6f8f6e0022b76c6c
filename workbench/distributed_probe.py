"""One rank of the distributed diagnosis, started by `workbench.torchrun` (never imported by a notebook):

    python -m torch.distributed.run --nproc_per_node 2 ... -m workbench.distributed_probe --spec SPEC --out DIR

Each rank re-resolves the target from SPEC (the arguments a notebook kernel receives) and builds the model through
the target's own set-up, so the user's `--setup module:function` is what runs. Then: DDP trials (gradients
present and equal after all-reduce, unused parameters, the Trainer's `find_unused_parameters` against reentrant
checkpointing), the DataLoader's start method, and an FSDP2 step under `MixedPrecisionPolicy` on a fresh copy of
the model. After every stage the rank rewrites DIR/rank<N>.json (`torchrun.RankLog`), so a rank that crashes
or hangs still says what it found and where it stopped; an exception is written with its traceback, and the
rank exits 1. Each rank uses its own batch (labels shuffled by rank), so gradients differ until DDP averages them.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.metadata
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

from workbench.torchrun import RankLog, start_watchdog

READY_TWICE = "Expected to mark a variable ready only once"
UNFINISHED = "Expected to have finished reduction in the prior iteration"


# ----- inputs and one training step -----

def rank_inputs(model, target, rank: int) -> tuple[dict, str]:
    """The workbench's sample inputs, with labels shuffled by rank: each rank has its own batch."""
    import torch

    from workbench.inputs import sample_inputs
    from workbench.scenarios import with_labels

    inputs, how = sample_inputs(model, target.model_dir, inputs_file=target.params.get("forward_inputs"))
    inputs = with_labels(model, inputs)
    if "labels" in inputs:
        generator = torch.Generator().manual_seed(1000 + rank)
        order = torch.randperm(inputs["labels"].shape[-1], generator=generator).to(inputs["labels"].device)
        inputs["labels"] = inputs["labels"][..., order]
        return inputs, how + f"; labels shuffled with seed {1000 + rank} on this rank"
    if "input_ids" in inputs:
        inputs["input_ids"] = torch.roll(inputs["input_ids"], shifts=rank + 1, dims=-1)
        return inputs, how + f"; token ids rolled by {rank + 1} on this rank"
    return inputs, how + "; the same batch on every rank"


def train_step(module, inputs: dict, autocast_dtype=None) -> float:
    """Forward (under autocast when a half dtype is given) and backward; the loss, or the logits' mean."""
    import torch

    from workbench.scenarios import _logits, device_type_of

    half = autocast_dtype in (torch.bfloat16, torch.float16)
    with torch.autocast(device_type_of(module), dtype=autocast_dtype) if half else contextlib.nullcontext():
        out = module(**inputs)
    loss = out.loss if getattr(out, "loss", None) is not None else _logits(out).float().mean()
    loss.backward()
    return float(loss.detach().float())


def grad_checksums(model) -> dict[str, list[float] | None]:
    """Per trainable tensor: [sum, norm] of its gradient in float64, or None when it has none."""
    import torch

    out: dict[str, list[float] | None] = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            g = None if p.grad is None else p.grad.detach().to(torch.float64)
            out[name] = None if g is None else [float(g.sum()), float(g.norm())]
    return out


def short_error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:400] if str(exc).strip() else ''}"


# ----- DDP -----

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
    from workbench.components import unwrap_model

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

    from workbench.components import ComponentClassifier

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
    from workbench.components import unwrap_model
    from workbench.grad_flow import _checkpointing_state
    from workbench.islands import compute_dtype_of

    compute = compute_dtype_of(model)
    inputs, how = rank_inputs(model, target, rank)
    inner, _ = unwrap_model(model)
    checkpointing = {**_checkpointing_state(model),
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


# ----- DataLoader workers -----

def _cuda_collate(batch):
    import torch

    return torch.tensor(batch, device="cuda")  # touches CUDA inside the worker


def data_loading_facts() -> dict[str, Any]:
    """The start method DataLoader workers get, and, on a GPU, whether a collate touching CUDA survives them."""
    import multiprocessing

    import torch
    from torch.utils.data import DataLoader

    chosen = multiprocessing.get_start_method(allow_none=True)
    method = chosen or multiprocessing.get_all_start_methods()[0]  # the first is the platform's default
    facts: dict[str, Any] = {"start_method": method, "set_explicitly": chosen is not None,
                             "python": sys.version.split()[0]}
    if not torch.cuda.is_available():
        facts["cuda_collate"] = {"tested": False, "reason": (
            "no CUDA device on this machine: 'Cannot re-initialize CUDA in forked subprocess' needs CUDA "
            "initialised in the parent before its DataLoader workers fork")}
        return facts
    torch.cuda.init()
    loader = DataLoader([1, 2], batch_size=1, num_workers=1, collate_fn=_cuda_collate, timeout=60)
    try:
        next(iter(loader))
        facts["cuda_collate"] = {"tested": True, "fails": False}
    except Exception as exc:  # noqa: BLE001 - the failure is the fact
        facts["cuda_collate"] = {"tested": True, "fails": True, "error": short_error(exc)[:300],
                                 "reinit_error": "Cannot re-initialize CUDA in forked subprocess" in str(exc)}
    return facts


# ----- FSDP2 -----

def off_dtype_buffers(model, compute) -> list[dict[str, Any]]:
    """Floating buffers in another dtype than the compute dtype; FSDP's policy casts parameters, never these."""
    from workbench.islands import ROTARY_BUFFERS

    found = []
    for mod_name, module in model.named_modules():
        frozen = not any(p.requires_grad for p in module.parameters())
        for short, buf in module.named_buffers(recurse=False):
            if buf.dtype.is_floating_point and buf.dtype != compute:
                found.append({"module": mod_name, "buffer": short, "name": f"{mod_name}.{short}",
                              "dtype": str(buf.dtype).removeprefix("torch."), "module_frozen": frozen,
                              "rotary": short in ROTARY_BUFFERS})
    found.sort(key=lambda b: (b["rotary"], not b["module_frozen"], b["name"]))
    return found


def keep_fp32_parameters(model, compute) -> list[dict[str, str]]:
    """Parameters transformers keeps in fp32 on purpose (`_keep_in_fp32_modules`); the policy casts them too."""
    from workbench.census import keep_in_fp32_matcher
    from workbench.components import unwrap_model

    inner, prefix = unwrap_model(model)
    keep = keep_in_fp32_matcher(inner)
    return [{"name": n, "dtype": str(p.dtype).removeprefix("torch.")} for n, p in model.named_parameters()
            if p.dtype.is_floating_point and p.dtype != compute
            and keep(n[len(prefix) + 1:] if prefix and n.startswith(prefix + ".") else n)]


def shard(model, policy) -> list[str]:
    """fully_shard on every block transformers declares unsplittable (`_no_split_modules`, what accelerate's FSDP
    wraps by default), innermost first, then on the root."""
    from torch.distributed.fsdp import fully_shard

    from workbench.components import unwrap_model

    inner, _ = unwrap_model(model)
    block_types = set(getattr(inner, "_no_split_modules", None) or ())
    units = [name for name, m in model.named_modules() if name and type(m).__name__ in block_types]
    for name in reversed(units):
        fully_shard(model.get_submodule(name), mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return units


def promoting_buffers(calls, buffers: list[dict[str, Any]], compute: str) -> list[dict[str, Any]]:
    """Modules owning an off-dtype buffer that took the compute dtype in and gave another dtype out."""
    owners = {b["module"]: b for b in buffers if not b["rotary"]}
    seen, out = set(), []
    for call in calls:
        owner = owners.get(call.path)
        if owner and call.outputs and call.outputs[0] != compute and compute in call.inputs and call.path not in seen:
            seen.add(call.path)
            out.append({**owner, "in": ",".join(call.inputs), "out": call.outputs[0]})
    return out


def fsdp_section(model, target, rank: int) -> dict[str, Any]:
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from workbench.components import unwrap_model
    from workbench.islands import compute_dtype_of
    from workbench.tracer import DtypeTracer

    compute = compute_dtype_of(model)
    name = str(compute).removeprefix("torch.")
    inner, _ = unwrap_model(model)
    inputs, how = rank_inputs(model, target, rank)
    section: dict[str, Any] = {
        "compute_dtype": name, "policy": f"MixedPrecisionPolicy(param_dtype=torch.{name})", "inputs": how,
        "quantized": bool(getattr(inner, "is_loaded_in_4bit", False) or getattr(inner, "is_loaded_in_8bit", False)),
        "buffers": off_dtype_buffers(model, compute), "keep_fp32": keep_fp32_parameters(model, compute),
        "units": [], "shard_error": None, "error": None, "loss": None, "diagnosis": None, "promoting": [],
        "flow": []}
    try:
        section["units"] = shard(model, MixedPrecisionPolicy(param_dtype=compute))
    except Exception as exc:  # noqa: BLE001 - a model fully_shard refuses is the finding
        section["shard_error"] = short_error(exc)
        section["traceback"] = "".join(traceback.format_exception(exc))[-3000:]
        return section
    model.train()
    with DtypeTracer(model) as tracer:
        try:
            section["loss"] = train_step(model, inputs)  # no autocast: the policy is the mixed precision
        except Exception as exc:  # noqa: BLE001 - the failing step is the finding
            section["error"] = short_error(exc)
            section["traceback"] = "".join(traceback.format_exception(exc))[-3000:]
    section["promoting"] = promoting_buffers(tracer.calls, section["buffers"], name)
    if section["error"]:
        section["diagnosis"] = tracer.diagnosis()
        section["flow"] = tracer.flow()
    del tracer
    torch.distributed.barrier()
    return section


# ----- the rank -----

def build(target, device):
    """The model through the target's own set-up, on this rank's GPU when there is one."""
    from workbench.setups import prepare_model

    model = prepare_model(target).model
    on_cpu = all(p.device.type == "cpu" for p in model.parameters())
    if device.type == "cuda" and on_cpu and not getattr(model, "hf_device_map", None):
        model = model.to(device)
    return model


def run_rank(spec: dict[str, Any], log: RankLog) -> None:
    import datetime as dt

    import torch
    import torch.distributed as dist

    from workbench.runtime import quiet_and_offline
    from workbench.target import resolve_target

    torch.set_num_threads(1)  # ranks share the machine's cores
    quiet_and_offline()
    backend = spec.get("backend", "gloo")
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    dist.init_process_group(backend, timeout=dt.timedelta(seconds=float(spec.get("timeout", 600))))
    versions = {"torch": torch.__version__}
    for package in ("transformers", "peft", "accelerate", "bitsandbytes"):  # from metadata: importing costs seconds
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[package] = importlib.metadata.version(package)
    log.update(backend=backend, device=str(device), versions=versions)
    target = resolve_target(**spec["target"])
    rank = dist.get_rank()
    if "ddp" in spec.get("checks", ("ddp", "fsdp")):
        log.stage("set-up for DDP")
        model = build(target, device)
        log.stage("DDP trials")
        log.section("ddp", ddp_section(model, target, spec, rank))
        del model
        gc.collect()
    if "fsdp" in spec.get("checks", ("ddp", "fsdp")):
        log.stage("set-up for FSDP")  # a fresh model: fully_shard replaces parameters in place for good
        model = build(target, device)
        log.stage("FSDP2 step")
        log.section("fsdp", fsdp_section(model, target, rank))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True, help="JSON: target arguments, checks, backend, timeout")
    parser.add_argument("--out", required=True, help="folder for rank<N>.json")
    args = parser.parse_args(argv)
    log = RankLog(Path(args.out), int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)))
    code = 0
    try:
        spec = json.loads(Path(args.spec).read_text())
        start_watchdog(spec.get("launcher_pid"), float(spec.get("timeout", 600)) + 30)
        run_rank(spec, log)
        log.stage("done")
    except Exception as exc:  # noqa: BLE001 - written with its traceback for the parent to report
        log.fail(exc)
        traceback.print_exc()
        code = 1
    finally:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and code == 0:
            dist.destroy_process_group()
    return code


if __name__ == "__main__":
    sys.exit(main())
