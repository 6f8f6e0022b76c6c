"""`distributed.ddp`, parent side: the verdict on all ranks' DDP trials (`ddp.ddp_section` ran them under torchrun).

Gradients present and equal after all-reduce, trainable tensors without a gradient, the Trainer's
`find_unused_parameters` against reentrant gradient checkpointing ("Expected to mark a variable ready only once"),
what name-based selections find under the wrapper's `module.` prefix.
"""

from __future__ import annotations

from typing import Any

from workbench.distributed.dataloader import data_loading_text
from workbench.distributed.ddp import READY_TWICE, REENTRANT_FIX, UNFINISHED
from workbench.distributed.rank_results import RankResults
from workbench.findings import Finding

GRAD_TOLERANCE = 1e-5  # relative to the tensor's gradient norm; all-reduce leaves every rank bit-identical


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


def ddp_finding(report: RankResults) -> Finding:
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


def _ddp_warn_finding(report: RankResults, unused: list[str], unfinished: bool, lost: list[dict],
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


def _ddp_error_finding(report: RankResults, user: list[dict], error: str, evidence: dict) -> Finding:
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


def unused_tensors(report: RankResults) -> list[str]:
    """Trainable tensors with no gradient on any rank after the first synchronised step."""
    per_rank = report.trial("trainer") or report.trial("baseline")
    grads = [t.get("grads") or {} for t in per_rank]
    return [n for n in grads[0] if all(g.get(n) is None for g in grads)] if grads else []


def ddp_evidence(report: RankResults) -> dict[str, Any]:
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


def _prefix_text(report: RankResults) -> str:
    rows = report.prefix_rows()
    lost = [r for r in rows if r["lost"]]
    prefix = ((report.section("ddp") or {}).get("names") or {}).get("prefix", "module.")
    if not lost:
        return f"Names under DDP gain {prefix!r}; no selection tried here loses a match."
    return (f"Names under DDP gain {prefix!r}: {len(lost)} of {len(rows)} name-based selections find fewer tensors "
            f"on the wrapper, e.g. {lost[0]['selection']} finds {lost[0]['bare']} on the bare model and "
            f"{lost[0]['under_ddp']} under DDP (a selection made after wrapping prints 'Base parameters enabled: 0').")


def _prefix_fix(report: RankResults) -> str:
    if not any(r["lost"] for r in report.prefix_rows()):
        return ""
    return ("Select parameters on the unwrapped model (ddp_model.module, or accelerator.unwrap_model(model)) or "
            "before wrapping; strip 'module.' from names and state_dict keys (workbench.probes.forward.grad_flow.normalize_name) "
            "before matching or saving.")


def _what_if_text(report: RankResults) -> str:
    what_if = report.trial("what if")
    error = next((t["error"] for t in what_if if t.get("error")), None)
    if not what_if:
        return ""
    if error and READY_TWICE in error:
        return (" Were gradient checkpointing turned on with use_reentrant=True, DDP with find_unused_parameters=True "
                f"would raise '{READY_TWICE}' (tried here): keep use_reentrant=False.")
    return " Reentrant gradient checkpointing under find_unused_parameters=True was tried too: " + (error or "it runs.")


def _data_loading_text(report: RankResults) -> str:
    return data_loading_text((report.section("ddp") or {}).get("data_loading"))
