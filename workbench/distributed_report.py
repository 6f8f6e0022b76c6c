"""`distributed.ddp` and `distributed.fsdp`: the prepared model under torchrun, on N local ranks.

    report = distributed_report(target, ranks=2)   # torchrun; every rank runs the target's own set-up
    report                                          # per-rank results side by side, the name-prefix table
    report.findings()

DDP: parameter names gain `module.` (a name-based selection that found N tensors on the bare model finds 0 on the
wrapper: the seeds' "Base parameters enabled: 0"); gradients present and equal on every rank after all-reduce,
although each rank had its own batch; trainable tensors that get no gradient (DDP then needs
`find_unused_parameters=True`); the Trainer's own `find_unused_parameters` against reentrant gradient
checkpointing ("Expected to mark a variable ready only once"), with the fixes tried. FSDP2: `fully_shard` on the
decoder blocks and the root with `MixedPrecisionPolicy(param_dtype=<compute dtype>)`, one step under the dtype
tracer; a buffer the policy leaves in fp32 that promotes activations is named. The ranks' work is in
`workbench.distributed_probe`; the launch (free port, timeout, no process left behind) in `workbench.torchrun`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from workbench.distributed_probe import READY_TWICE, UNFINISHED
from workbench.findings import Finding
from workbench.recorder import probe
from workbench.text_render import TextRepr
from workbench.torchrun import RankRun, backend_for, launch_ranks

CHECK_IDS = {"ddp": "distributed.ddp", "fsdp": "distributed.fsdp"}
GRAD_TOLERANCE = 1e-5  # relative to the tensor's gradient norm; all-reduce leaves every rank bit-identical
REENTRANT_FIX = ("gradient_checkpointing_kwargs={'use_reentrant': False} (transformers 5's default), or "
                 "TrainingArguments(ddp_find_unused_parameters=False), or ddp_static_graph=True")


@dataclasses.dataclass(repr=False)
class DistributedReport(TextRepr):
    """Each rank's result file, the launch, and the findings both checks draw from them."""

    ranks: int
    backend: str
    checks: tuple[str, ...]
    results: dict[int, dict[str, Any]]
    launch: dict[str, Any]  # RankRun.as_evidence()
    skipped: dict[str, str] | None = None  # why nothing was launched: title, detail, fix

    # ----- reading the rank files -----
    def section(self, name: str, rank: int = 0) -> dict[str, Any] | None:
        return (self.results.get(rank) or {}).get("sections", {}).get(name)

    def complete(self, name: str) -> bool:
        return all(self.section(name, r) is not None for r in range(self.ranks))

    def trials(self, rank: int = 0) -> list[dict[str, Any]]:
        return (self.section("ddp", rank) or {}).get("trials", [])

    def trial(self, role: str) -> list[dict[str, Any]]:
        """The first trial with this role, one entry per rank."""
        first = next((t for t in self.trials(0) if t["role"] == role), None)
        return self.trial_named(first["label"]) if first else []

    def trial_named(self, label: str) -> list[dict[str, Any]]:
        return [next((t for t in self.trials(r) if t["label"] == label), {}) for r in range(self.ranks)]

    def prefix_rows(self) -> list[dict[str, Any]]:
        return ((self.section("ddp") or {}).get("names") or {}).get("selections", [])

    # ----- findings -----
    def findings(self) -> list[Finding]:
        out = []
        for name in self.checks:
            problem = self._launch_problem(name)
            out.append(problem or (ddp_finding(self) if name == "ddp" else fsdp_finding(self)))
        return out

    def _launch_problem(self, name: str) -> Finding | None:
        """An `error` when some rank has no result for this check: refused, crashed (its traceback), timed out."""
        check = CHECK_IDS[name]
        if self.skipped:
            return Finding(check, "skip", self.skipped["title"], self.skipped["detail"], {"ranks": self.ranks},
                           self.skipped["fix"])
        if self.complete(name):
            return None
        stages = {r: (self.results.get(r) or {}).get("stage", "not started") for r in range(self.ranks)}
        evidence = {"stages": stages, "launch": self.launch}
        crashed = {r: d["error"] for r, d in sorted(self.results.items()) if d.get("error")}
        if crashed:  # the first to fail is the cause; the others often fail on a collective it left unmatched
            rank, error = min(crashed.items(), key=lambda item: item[1].get("at", 0))
            evidence.update(traceback=error["traceback"], rank=rank,
                            errors={r: f"{e['type']}: {e['message'][:300]}" for r, e in crashed.items()})
            return Finding(check, "error", f"Rank {rank} crashed during {error['stage']}: {error['type']}: "
                           f"{error['message'][:200]}",
                           f"Ranks reached: {_stages(stages)}. The traceback of rank {rank} is in the evidence.",
                           evidence, f"Read rank {rank}'s traceback: the set-up runs on every rank, as under "
                           "torchrun (RANK, LOCAL_RANK, WORLD_SIZE set); fix what fails there and re-run.")
        if self.launch.get("timed_out"):
            return Finding(check, "error", f"Timed out after {self.launch['timeout_s']:g} s",
                           f"Ranks reached: {_stages(stages)}; torchrun and every rank were stopped "
                           f"(pids {self.launch.get('killed')}).", evidence,
                           "A rank that never finishes is stuck in its set-up or in a collective another rank never "
                           "reached; a large model may just need longer: distributed_report(target, timeout=...).")
        return Finding(check, "error", f"No {name} result from every rank (torchrun exited "
                       f"{self.launch.get('returncode')})", f"Ranks reached: {_stages(stages)}. The end of "
                       "torchrun's output is in the evidence.", evidence, "Read torchrun's output in the evidence.")

    # ----- display -----
    def _repr_html_(self) -> str:
        from workbench.html import esc, findings_table

        if self.skipped:
            return findings_table(self.findings())
        head = (f"<h3>Under torchrun: {self.ranks} rank(s), {esc(self.backend)}</h3>"
                f"<p>{esc(self.launch.get('command', ''))} — {self.launch.get('seconds', 0)} s</p>")
        parts = [head, findings_table(self.findings()), "<h4>Rank by rank</h4>", _table(self.rank_rows())]
        if self.prefix_rows():
            names = (self.section("ddp") or {}).get("names", {})
            bare, wrapped = (names.get("bare_example") or [""])[0], (names.get("wrapped_example") or [""])[0]
            parts += ["<h4>Name-based selections: bare model and under DDP</h4>",
                      f"<p><code>{esc(bare)}</code> is <code>{esc(wrapped)}</code> on the DDP wrapper: a selection "
                      "anchored at the start of the name finds nothing there.</p>", _table(self.prefix_rows())]
        fsdp = self.section("fsdp") or {}
        if fsdp.get("buffers"):
            parts += ["<h4>Floating buffers the FSDP2 policy leaves alone</h4>", _table(fsdp["buffers"])]
        if fsdp.get("flow"):
            parts += ["<h4>FSDP2 step, traced around the break</h4>", _table(fsdp["flow"])]
        parts.append(f"<details><summary>torchrun output</summary><pre>{esc(self.launch.get('output_tail', ''))}"
                     "</pre></details>")
        return "".join(parts)

    def rank_rows(self) -> list[dict[str, Any]]:
        """One row per fact, one column per rank: what each rank did, side by side."""
        rows: dict[str, dict[str, Any]] = {}

        def put(fact: str, rank: int, value: Any) -> None:
            rows.setdefault(fact, {"": fact})[f"rank {rank}"] = value

        for r in range(self.ranks):
            data = self.results.get(r) or {}
            put("pid / device", r, f"{data.get('pid', '-')} / {data.get('device', '-')}")
            put("reached", r, f"{data.get('stage', 'not started')} ({_seconds(data)} s)")
            for trial in self.trials(r):
                put(f"DDP {trial['label']}", r, _clip(trial["error"]) or "ok, loss " + ", ".join(
                    f"{x:.4f}" for x in [trial.get("local_loss"), *trial["losses"]] if x is not None))
            fsdp = self.section("fsdp", r)
            if fsdp:
                put("FSDP2 step", r, _clip(fsdp["shard_error"] or fsdp["error"]) or f"ok, loss {fsdp['loss']:.4f}")
            if data.get("error"):
                put("crashed", r, f"{data['error']['type']}: {data['error']['message'][:200]}")
        return list(rows.values())


# ----- distributed.ddp -----

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


def ddp_finding(report: DistributedReport) -> Finding:
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


def _ddp_warn_finding(report: DistributedReport, unused: list[str], unfinished: bool, lost: list[dict],
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


def _ddp_error_finding(report: DistributedReport, user: list[dict], error: str, evidence: dict) -> Finding:
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


def unused_tensors(report: DistributedReport) -> list[str]:
    """Trainable tensors with no gradient on any rank after the first synchronised step."""
    per_rank = report.trial("trainer") or report.trial("baseline")
    grads = [t.get("grads") or {} for t in per_rank]
    return [n for n in grads[0] if all(g.get(n) is None for g in grads)] if grads else []


def ddp_evidence(report: DistributedReport) -> dict[str, Any]:
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
            "versions": (report.results.get(0) or {}).get("versions"), "launch": _launch_summary(report)}


def _agreement_summary(per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    a = grad_agreement(per_rank)
    return {**a, "differ": a["differ"][:20], "present_on_some_ranks_only": a["present_on_some_ranks_only"][:20]}


def _prefix_text(report: DistributedReport) -> str:
    rows = report.prefix_rows()
    lost = [r for r in rows if r["lost"]]
    prefix = ((report.section("ddp") or {}).get("names") or {}).get("prefix", "module.")
    if not lost:
        return f"Names under DDP gain {prefix!r}; no selection tried here loses a match."
    return (f"Names under DDP gain {prefix!r}: {len(lost)} of {len(rows)} name-based selections find fewer tensors "
            f"on the wrapper, e.g. {lost[0]['selection']} finds {lost[0]['bare']} on the bare model and "
            f"{lost[0]['under_ddp']} under DDP (a selection made after wrapping prints 'Base parameters enabled: 0').")


def _prefix_fix(report: DistributedReport) -> str:
    if not any(r["lost"] for r in report.prefix_rows()):
        return ""
    return ("Select parameters on the unwrapped model (ddp_model.module, or accelerator.unwrap_model(model)) or "
            "before wrapping; strip 'module.' from names and state_dict keys (workbench.grad_flow.normalize_name) "
            "before matching or saving.")


def _what_if_text(report: DistributedReport) -> str:
    what_if = report.trial("what if")
    error = next((t["error"] for t in what_if if t.get("error")), None)
    if not what_if:
        return ""
    if error and READY_TWICE in error:
        return (" Were gradient checkpointing turned on with use_reentrant=True, DDP with find_unused_parameters=True "
                f"would raise '{READY_TWICE}' (tried here): keep use_reentrant=False.")
    return " Reentrant gradient checkpointing under find_unused_parameters=True was tried too: " + (error or "it runs.")


def _data_loading_text(report: DistributedReport) -> str:
    facts = (report.section("ddp") or {}).get("data_loading") or {}
    if not facts:
        return ""
    cuda = facts.get("cuda_collate") or {}
    if not cuda.get("tested"):
        tail = "whether a collate touching CUDA survives them is tested on GPU machines only"
    elif cuda.get("fails"):
        tail = (f"a collate touching CUDA fails in them ({cuda.get('error')}): keep CUDA out of collate_fn (move the "
                "batch in the training step) or DataLoader(multiprocessing_context='spawn')")
    else:
        tail = "a collate touching CUDA works in them"
    return f" DataLoader workers start with {facts['start_method']!r}; {tail}."


# ----- distributed.fsdp -----

def fsdp_finding(report: DistributedReport) -> Finding:
    per_rank = [report.section("fsdp", r) or {} for r in range(report.ranks)]
    sec = next((s for s in per_rank if s.get("shard_error") or s.get("error") or s.get("promoting")), per_rank[0])
    evidence = {k: sec.get(k) for k in ("compute_dtype", "policy", "quantized", "units", "shard_error", "error",
                                        "diagnosis", "promoting", "keep_fp32", "inputs", "loss")}
    evidence.update(buffers=sec.get("buffers", [])[:40], traceback=sec.get("traceback"),
                    per_rank={r: s.get("shard_error") or s.get("error") or "ok" for r, s in enumerate(per_rank)},
                    versions=(report.results.get(0) or {}).get("versions"), launch=_launch_summary(report))
    compute = sec.get("compute_dtype")
    if sec.get("shard_error"):
        if sec.get("quantized"):
            return Finding("distributed.fsdp", "skip", "fully_shard refuses this quantized model",
                           sec["shard_error"], evidence, "FSDP with bitsandbytes needs bnb_4bit_quant_storage set to "
                           "the compute dtype (FSDP-QLoRA); or train with DDP.")
        return Finding("distributed.fsdp", "warn", f"fully_shard raises on this model: {sec['shard_error'][:200]}",
                       f"Applied to {len(sec['units'])} block(s) from _no_split_modules, then the root.", evidence,
                       "Read the traceback in the evidence.")
    promoting, diagnosis = sec.get("promoting") or [], sec.get("diagnosis")
    if promoting or (sec.get("error") and diagnosis):
        return _fsdp_leak_finding(sec, promoting, diagnosis, evidence)
    if sec.get("error"):
        return Finding("distributed.fsdp", "warn", "The FSDP2 step fails, not on a dtype mismatch",
                       f"{sec['error']} (the dtype tracer saw no mismatch; this may be particular to this machine's "
                       f"{report.backend} backend).", evidence, "Read the traceback in the evidence.")
    quiet = [b for b in sec.get("buffers", []) if not b["rotary"]]
    units = f"{len(sec['units'])} block(s) and the root sharded under {sec['policy']}"
    if sec.get("keep_fp32") or quiet:
        return Finding("distributed.fsdp", "info", f"The FSDP2 step runs ({units}); some tensors stay off {compute}",
                       (f"{len(sec['keep_fp32'])} parameter(s) kept in fp32 on purpose (_keep_in_fp32_modules, e.g. "
                        f"{sec['keep_fp32'][0]['name']}) are cast to {compute} by the policy too. "
                        if sec.get("keep_fp32") else "")
                       + (f"{len(quiet)} buffer(s) stay off {compute} without promoting anything, e.g. "
                          f"{quiet[0]['name']} ({quiet[0]['dtype']})." if quiet else ""), evidence,
                       "Give modules that must compute in fp32 their own fully_shard(module, mp_policy="
                       "MixedPrecisionPolicy(param_dtype=torch.float32)).")
    rotary = sum(b["rotary"] for b in sec.get("buffers", []))
    return Finding("distributed.fsdp", "pass", f"The FSDP2 step runs: {units}",
                   f"loss {sec['loss']:.4f}; no buffer promotes activations"
                   + (f" ({rotary} rotary inv_freq buffer(s) stay fp32 on purpose)" if rotary else "")
                   + (". 4-bit weights keep bitsandbytes' storage dtype: the policy shards them but does not cast them"
                      if sec.get("quantized") else "") + ".", evidence)


def _fsdp_leak_finding(sec: dict, promoting: list[dict], diagnosis: dict | None, evidence: dict) -> Finding:
    compute = sec["compute_dtype"]
    broke = f"The step fails: {sec['error']}. " if sec.get("error") else ""
    traced = f"Traced: {diagnosis['summary']}. " if diagnosis else ""
    if promoting:
        first = promoting[0]
        frozen = "frozen " if first["module_frozen"] else ""
        return Finding("distributed.fsdp", "fail",
                       f"Under FSDP2 {sec['policy']}, buffer {first['name']} ({first['dtype']}) of {frozen}module "
                       f"{first['module'] or '(root)'} promotes activations to {first['out']}",
                       broke + traced + f"The policy casts parameters to {compute} but never buffers: "
                       f"`{first['module']}` takes {first['in']} in and gives {first['out']} out.", evidence,
                       f"Cast the buffer before fully_shard: model.get_submodule('{first['module']}')."
                       f"{first['buffer']}.data = ….to(torch.{compute}) (or .to(torch.{compute}) the frozen module); "
                       f"or give that module its own fully_shard(..., mp_policy=MixedPrecisionPolicy("
                       f"param_dtype=torch.{compute}, output_dtype=torch.{compute})).")
    return Finding("distributed.fsdp", "fail", f"Under FSDP2 {sec['policy']}, `{diagnosis['module']}` receives "
                   f"{diagnosis['input_dtype']} (its weight is {diagnosis['module_weight']})",
                   broke + traced, evidence,
                   f"Make `{diagnosis.get('producer') or diagnosis['module']}` output {compute}: cast its buffers or "
                   f"weights to {compute} before fully_shard, or give it its own fully_shard with "
                   f"MixedPrecisionPolicy(output_dtype=torch.{compute}).")


# ----- helpers -----

def _launch_summary(report: DistributedReport) -> dict[str, Any]:
    return {k: v for k, v in report.launch.items() if k != "output_tail"}


def _clip(text: str | None, chars: int = 140) -> str | None:
    return text if not text or len(text) <= chars else text[: chars - 1] + "…"


def _stages(stages: dict[int, str]) -> str:
    return ", ".join(f"rank {r}: {s}" for r, s in stages.items())


def _seconds(data: dict[str, Any]) -> Any:
    return max(data.get("stages", {}).values(), default=0)


def _table(rows: list[dict[str, Any]]) -> str:
    import pandas as pd

    from workbench.html import frame_html

    return frame_html(pd.DataFrame(rows).fillna("")) if rows else ""


def _memory_refusal(target, ranks: int) -> dict[str, str] | None:
    """Every rank loads the model: refuse before launching when the copies cannot fit (params' memory_limit_bytes
    or what is available), as a single load is refused."""
    from workbench.resources import available_bytes, estimated_load_bytes

    need = estimated_load_bytes(target) * ranks
    limit = target.params.get("memory_limit_bytes")
    have, where = (int(limit), "memory_limit_bytes in the parameters") if limit else available_bytes()
    if need <= 0.9 * have:
        return None
    return {"title": "Not launched: the ranks would not fit in memory",
            "detail": f"{ranks} ranks each load the model: about {need / 1e9:.2f} GB of weights, gradients on top, "
                      f"but {where} is {have / 1e9:.2f} GB.",
            "fix": "Diagnose with fewer ranks (ranks=1 still shows the name prefixes), --quant 4bit, or on a machine "
                   "with more memory."}


@probe("distributed.ddp", "distributed.fsdp")
def distributed_report(target, ranks: int = 2, timeout: float = 600.0, *,
                       ddp_find_unused_parameters: bool | None = None,
                       checks: tuple[str, ...] = ("ddp", "fsdp")) -> DistributedReport:
    """Run the target's set-up on `ranks` local ranks under torchrun (gloo on the CPU, nccl with a GPU per rank)
    and diagnose DDP and FSDP2 there. `ddp_find_unused_parameters`: what your TrainingArguments set (None: the
    Trainer's own choice). At most `timeout` seconds; every process is stopped by then."""
    from workbench.runner import notebook_parameters

    ranks = int(ranks)
    if ranks < 0:
        raise ValueError(f"ranks={ranks}: use 0 (not asked) or more")
    if ranks == 0:  # what a report gets without --distributed N: said, not silently absent
        return DistributedReport(0, "none", tuple(checks), {}, {}, {
            "title": "Not asked: no torchrun diagnosis", "detail": "The distributed checks launch the set-up on N "
            "local ranks under torchrun; this diagnosis was run without ranks.",
            "fix": "Run `python -m workbench diagnose CKPT --distributed 2` (or distributed_report(target, ranks=2))."})
    backend = backend_for(ranks)
    refused = _memory_refusal(target, ranks) if backend == "gloo" else None
    if refused:
        return DistributedReport(ranks, backend, tuple(checks), {}, {}, refused)
    spec = {"target": notebook_parameters(target), "checks": list(checks), "backend": backend, "timeout": timeout,
            "ddp_find_unused_parameters": ddp_find_unused_parameters, "launcher_pid": os.getpid()}
    with tempfile.TemporaryDirectory(prefix="workbench-torchrun-") as out:
        spec_path = Path(out) / "spec.json"
        spec_path.write_text(json.dumps(spec))
        run: RankRun = launch_ranks("workbench.distributed_probe", ["--spec", str(spec_path), "--out", out],
                                    ranks=ranks, timeout=timeout, out_dir=out)
    return DistributedReport(ranks, backend, tuple(checks), run.results, run.as_evidence())
