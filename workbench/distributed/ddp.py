"""`distributed.ddp`: the prepared model under DistributedDataParallel, rank by rank, and the verdict on all ranks.

Rank side (run by `workbench.distributed.rank` under torchrun): `ddp_section` wraps the model in DDP for a
baseline (find_unused_parameters=False, each rank's own gradients seen under no_sync() first), the Trainer's own
wrapping, the fixes for what failed, and what reentrant checkpointing would do; it counts what name-based
selections find on the bare model and under the wrapper's `module.` prefix. Parent side
(`workbench.distributed.probes`): `ddp_finding` merges the ranks' trials into one finding: gradients present and
equal after all-reduce, trainable tensors without a gradient, the Trainer's `find_unused_parameters` against
reentrant gradient checkpointing ("Expected to mark a variable ready only once").
"""

from __future__ import annotations

import gc
import traceback
from typing import TYPE_CHECKING, Any

from workbench.distributed.dataloader import data_loading_facts, data_loading_text
from workbench.distributed.step import rank_inputs, short_error, train_step
from workbench.findings import Finding

if TYPE_CHECKING:
    from workbench.distributed.probes import DistributedResult

READY_TWICE = "Expected to mark a variable ready only once"
UNFINISHED = "Expected to have finished reduction in the prior iteration"
GRAD_TOLERANCE = 1e-5  # relative to the tensor's gradient norm; all-reduce leaves every rank bit-identical
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
    from workbench.model.components import unwrap_model
    from workbench.probes.forward.grad_flow import _checkpointing_state
    from workbench.probes.dtype.islands import compute_dtype_of

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


# ----- parent side: the finding -----

def grad_agreement(per_rank: list[dict[str, Any]], key: str = "grads") -> dict[str, Any]:
    """Tensors whose gradient differs between ranks, or is present on some ranks only ([sum, norm] per rank)."""
    grads = [t.get(key) or {} for t in per_rank]
    differ, partial, worst = [], [], 0.0
    for name, first in grads[0].items():
        values = [g.get(name) for g in grads]
        if any(v is None for v in values):
            if any(v is not None for v in values):
                partial.append(name)
            continue
        scale = max(abs(first[1]), 1e-30)
        gap = max(abs(v[i] - first[i]) / scale for v in values for i in (0, 1))
        worst = max(worst, gap)
        if gap > GRAD_TOLERANCE:
            differ.append(name)
    return {"compared": len(grads[0]), "differ": differ, "present_on_some_ranks_only": partial,
            "max_relative_difference": worst}


def ddp_finding(report: DistributedResult) -> Finding:
    sec = report.section("ddp") or {}
    evidence = ddp_evidence(report)
    if not sec.get("trainable"):
        return Finding("distributed.ddp", "skip", "Nothing is trainable: DDP has nothing to synchronise",
                       "DistributedDataParallel refuses a model without trainable parameters. " + _prefix_text(report),
                       evidence, "Use a training set-up (qlora, sft, or yours) to diagnose DDP.")
    baseline, user = report.trial("baseline"), report.trial("trainer") or report.trial("baseline")
    user_error = next((t["error"] for t in user if t.get("error")), None)
    if user_error and (READY_TWICE in user_error or UNFINISHED in user_error):
        return _ddp_error_finding(report, user, user_error, evidence)
    if user_error:
        return Finding("distributed.ddp", "error", "The training step fails under DDP, not in DDP itself",
                       user_error, evidence, "Fix the step itself first (see grad.flow and forward.scenarios).")
    for per_rank in (baseline, user):
        if per_rank and not any(t.get("error") for t in per_rank):
            agreement = grad_agreement(per_rank)
            if agreement["differ"] or agreement["present_on_some_ranks_only"]:
                bad = agreement["differ"] + agreement["present_on_some_ranks_only"]
                return Finding("distributed.ddp", "fail",
                               f"Gradients differ between ranks after all-reduce: {len(bad)} tensor(s), e.g. {bad[0]}",
                               f"Under {per_rank[0]['label']}, the step ran without an error but the ranks hold "
                               f"different gradients (largest relative gap {agreement['max_relative_difference']:.2e})"
                               ": the replicas drift apart silently.", evidence,
                               "Something bypasses DDP's gradient hooks (parameters replaced after wrapping, grads "
                               "written by hand, no_sync() left on); wrap the model after every change to it.")
    unused = unused_tensors(report)
    unfinished = any(UNFINISHED in (t.get("error") or "") for t in baseline)
    lost = [r for r in report.prefix_rows() if r["lost"] and r["source"].startswith("parameters file")]
    if unused or unfinished or lost:
        return _ddp_warn_finding(report, unused, unfinished, lost, evidence)
    agreement = grad_agreement(user)
    before = grad_agreement(baseline, "local_grads")
    return Finding("distributed.ddp", "pass",
                   f"All {agreement['compared']} trainable tensors get a gradient, equal on all {report.ranks} ranks "
                   "after all-reduce",
                   (f"Each rank had its own batch: {len(before['differ'])} of {before['compared']} gradients "
                    f"differed before all-reduce, none after (largest relative gap "
                    f"{agreement['max_relative_difference']:.1e}). " if report.ranks > 1 else
                    "One rank: nothing to compare gradients with (use ranks=2 or more). ")
                   + _prefix_text(report) + _what_if_text(report) + _data_loading_text(report), evidence)


def _ddp_warn_finding(report: DistributedResult, unused: list[str], unfinished: bool, lost: list[dict],
                      evidence: dict) -> Finding:
    """Hazards the run survives: tensors off the forward path (the Trainer's find_unused_parameters=True copes, at
    a cost), and your own parameters-file patterns that stop matching under the `module.` prefix."""
    sec = report.section("ddp") or {}
    titles, details, fixes = [], [], []
    if unused or unfinished:
        titles.append(f"{len(unused)} trainable tensor(s) get no gradient: DDP needs find_unused_parameters=True")
        details.append(f"No gradient for e.g. {', '.join(unused[:3]) or '(none seen on the first step)'}. "
                       "With find_unused_parameters=False the next "
                       f"step raises '{UNFINISHED}…' (tried here); the Trainer passes find_unused_parameters=True "
                       f"for this model ({sec['trainer']['why']}), which copes.")
        fixes.append("Freeze what the forward does not use (requires_grad_(False)) to keep DDP's cheaper "
                     "find_unused_parameters=False, or keep TrainingArguments(ddp_find_unused_parameters=True).")
    if lost:
        titles.append(f"your pattern {lost[0]['selection']} finds {lost[0]['bare']} tensor(s) on the bare model and "
                      f"{lost[0]['under_ddp']} under DDP")
        fixes.append(_prefix_fix(report))
    title = "; ".join(titles)
    return Finding("distributed.ddp", "warn", title[:1].upper() + title[1:],
                   " ".join(details + [_prefix_text(report)]) + _data_loading_text(report), evidence, " ".join(fixes))


def _ddp_error_finding(report: DistributedResult, user: list[dict], error: str, evidence: dict) -> Finding:
    sec = report.section("ddp") or {}
    label = user[0]["label"]
    worked = [t["label"].removeprefix("fix: ") for t in report.trials(0) if t["role"] in ("fix", "baseline")
              and not t["error"]]
    if READY_TWICE in error:
        cp = sec["checkpointing"]
        how = ("use_reentrant not passed (torch.utils.checkpoint then runs reentrant)" if cp["use_reentrant"] is None
               else f"use_reentrant={cp['use_reentrant']}")
        return Finding("distributed.ddp", "fail",
                       f"DDP {label} raises 'Expected to mark a variable ready only once'",
                       f"Gradient checkpointing is on with {how}: each checkpointed "
                       "block runs its backward re-entrantly, and with find_unused_parameters=True DDP marks its "
                       f"parameters ready twice. The Trainer chooses these arguments ({sec['trainer']['why']}). "
                       f"Verified here to work: {', '.join(worked) or 'none of the fixes tried'}.",
                       evidence, REENTRANT_FIX)
    return Finding("distributed.ddp", "fail", f"DDP {label} raises '{UNFINISHED}…'",
                   f"{len(unused_tensors(report))} trainable tensor(s) get no gradient, and this wrapping does not "
                   f"look for unused parameters. Verified here to work: {', '.join(worked) or 'none'}.", evidence,
                   "TrainingArguments(ddp_find_unused_parameters=True), or freeze what the forward does not use.")


def unused_tensors(report: DistributedResult) -> list[str]:
    """Trainable tensors with no gradient on any rank after the first synchronised step."""
    per_rank = report.trial("trainer") or report.trial("baseline")
    grads = [t.get("grads") or {} for t in per_rank]
    return [n for n in grads[0] if all(g.get(n) is None for g in grads)] if grads else []


def ddp_evidence(report: DistributedResult) -> dict[str, Any]:
    sec = report.section("ddp") or {}
    trials = [{"label": t["label"], "role": t["role"], "ddp_kwargs": t["ddp_kwargs"],
               "per_rank": [(r.get("error") or f"ok, losses {r.get('losses')}") for r in report.trial_named(t["label"])]}
              for t in report.trials(0)]
    return {"ranks": report.ranks, "backend": report.backend, "model": sec.get("model"),
            "compute_dtype": sec.get("compute_dtype"), "inputs": sec.get("inputs"), "trainable": sec.get("trainable"),
            "trainer_ddp_kwargs": sec.get("trainer"), "checkpointing": sec.get("checkpointing"), "trials": trials,
            "agreement": {t["label"]: _agreement_summary(report.trial_named(t["label"])) for t in report.trials(0)
                          if "grads" in t},
            "unused": unused_tensors(report)[:40], "names": sec.get("names"), "data_loading": sec.get("data_loading"),
            "versions": (report.results.get(0) or {}).get("versions"), "launch": report.launch_summary()}


def _agreement_summary(per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    a = grad_agreement(per_rank)
    return {**a, "differ": a["differ"][:20], "present_on_some_ranks_only": a["present_on_some_ranks_only"][:20]}


def _prefix_text(report: DistributedResult) -> str:
    rows = report.prefix_rows()
    lost = [r for r in rows if r["lost"]]
    prefix = ((report.section("ddp") or {}).get("names") or {}).get("prefix", "module.")
    if not lost:
        return f"Names under DDP gain {prefix!r}; no selection tried here loses a match."
    return (f"Names under DDP gain {prefix!r}: {len(lost)} of {len(rows)} name-based selections find fewer tensors "
            f"on the wrapper, e.g. {lost[0]['selection']} finds {lost[0]['bare']} on the bare model and "
            f"{lost[0]['under_ddp']} under DDP (a selection made after wrapping prints 'Base parameters enabled: 0').")


def _prefix_fix(report: DistributedResult) -> str:
    if not any(r["lost"] for r in report.prefix_rows()):
        return ""
    return ("Select parameters on the unwrapped model (ddp_model.module, or accelerator.unwrap_model(model)) or "
            "before wrapping; strip 'module.' from names and state_dict keys (workbench.probes.forward.grad_flow.normalize_name) "
            "before matching or saving.")


def _what_if_text(report: DistributedResult) -> str:
    what_if = report.trial("what if")
    error = next((t["error"] for t in what_if if t.get("error")), None)
    if not what_if:
        return ""
    if error and READY_TWICE in error:
        return (" Were gradient checkpointing turned on with use_reentrant=True, DDP with find_unused_parameters=True "
                f"would raise '{READY_TWICE}' (tried here): keep use_reentrant=False.")
    return " Reentrant gradient checkpointing under find_unused_parameters=True was tried too: " + (error or "it runs.")


def _data_loading_text(report: DistributedResult) -> str:
    return data_loading_text((report.section("ddp") or {}).get("data_loading"))
