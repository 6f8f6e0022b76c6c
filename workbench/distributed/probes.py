"""`distributed.ddp` and `distributed.fsdp`: the prepared model under torchrun, on N local ranks.

    report = distributed_probe(target, ranks=2)   # torchrun; every rank runs the target's own set-up
    report                                          # per-rank results side by side, the name-prefix table
    report.findings()

DDP: parameter names gain `module.` (a name-based selection that found N tensors on the bare model finds 0 on the
wrapper: "Base parameters enabled: 0"); gradients present and equal on every rank after all-reduce,
although each rank had its own batch; trainable tensors that get no gradient (DDP then needs
`find_unused_parameters=True`); the Trainer's own `find_unused_parameters` against reentrant gradient
checkpointing ("Expected to mark a variable ready only once"), with the fixes tried. FSDP2: `fully_shard` on the
decoder blocks and the root with `MixedPrecisionPolicy(param_dtype=<compute dtype>)`, one step under the dtype
tracer; a buffer the policy leaves in fp32 that promotes activations is named. Each rank runs
`workbench.distributed.rank`; each check's trials and verdict are in `workbench.distributed.ddp` and
`workbench.distributed.fsdp`; the launch (free port, timeout, no process left behind) in `workbench.distributed.launcher`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from workbench.display.result import ProbeResult
from workbench.distributed.ddp_verdict import ddp_finding
from workbench.distributed.fsdp_verdict import fsdp_finding
from workbench.distributed.launcher import RankRun, backend_for, launch_ranks
from workbench.distributed.rank_results import RankResults
from workbench.findings import Finding

__all__ = ["DistributedResult", "distributed_probe"]

CHECK_IDS = {"ddp": "distributed.ddp", "fsdp": "distributed.fsdp"}


@dataclasses.dataclass(repr=False)
class DistributedResult(RankResults, ProbeResult):
    """Each rank's result file, the launch, and the findings both checks draw from them."""

    skipped: dict[str, str] | None = None  # why nothing was launched: title, detail, fix

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
            if error.get("not_applicable"):  # the set-up does not apply to this model: what the other notebooks say
                return Finding(check, "skip", error["not_applicable"], error["message"],
                               {"rank": rank, "stage": error["stage"]}, "")
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
                           "reached; a large model may just need longer: distributed_probe(target, timeout=...).")
        return Finding(check, "error", f"No {name} result from every rank (torchrun exited "
                       f"{self.launch.get('returncode')})", f"Ranks reached: {_stages(stages)}. The end of "
                       "torchrun's output is in the evidence.", evidence, "Read torchrun's output in the evidence.")

    # ----- display -----
    def details(self):
        from workbench.display.nodes import Code, Details, Display, Heading, Paragraph, Pre, Table
        if self.skipped:
            return Display()
        parts = [Heading(f"Under torchrun: {self.ranks} rank(s), {self.backend}", level=3),
                 Paragraph(f"{self.launch.get('command', '')} — {self.launch.get('seconds', 0)} s"),
                 Heading("Rank by rank"), Table.from_records(self.rank_rows())]
        if self.prefix_rows():
            names = (self.section("ddp") or {}).get("names", {})
            bare, wrapped = (names.get("bare_example") or [""])[0], (names.get("wrapped_example") or [""])[0]
            parts += [Heading("Name-based selections: bare model and under DDP"),
                      Paragraph(Code(bare), " is ", Code(wrapped), " on the DDP wrapper: a selection anchored at the "
                                "start of the name finds nothing there."), Table.from_records(self.prefix_rows())]
        fsdp = self.section("fsdp") or {}
        if fsdp.get("buffers"):
            parts += [Heading("Floating buffers the FSDP2 policy leaves alone"), Table.from_records(fsdp["buffers"])]
        if fsdp.get("flow"):
            parts += [Heading("FSDP2 step, traced around the break"), Table.from_records(fsdp["flow"])]
        parts.append(Details("torchrun output", Pre(self.launch.get("output_tail", ""))))
        return Display(*parts)

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


# ----- helpers -----

def _clip(text: str | None, chars: int = 140) -> str | None:
    return text if not text or len(text) <= chars else text[: chars - 1] + "…"


def _stages(stages: dict[int, str]) -> str:
    return ", ".join(f"rank {r}: {s}" for r, s in stages.items())


def _seconds(data: dict[str, Any]) -> Any:
    return max(data.get("stages", {}).values(), default=0)


def _memory_refusal(target, ranks: int) -> dict[str, str] | None:
    """Every rank loads the model: refuse before launching when the copies cannot fit (params' memory_limit_bytes
    or what is available), as a single load is refused."""
    from workbench.model.memory import available_bytes, estimated_load_bytes

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


def distributed_probe(target, ranks: int = 2, timeout: float = 600.0, *,
                       ddp_find_unused_parameters: bool | None = None,
                       checks: tuple[str, ...] = ("ddp", "fsdp")) -> DistributedResult:
    """Run the target's set-up on `ranks` local ranks under torchrun (gloo on the CPU, nccl with a GPU per rank)
    and diagnose DDP and FSDP2 there. `ddp_find_unused_parameters`: what your TrainingArguments set (None: the
    Trainer's own choice). At most `timeout` seconds; every process is stopped by then."""

    ranks = int(ranks)
    if ranks < 0:
        raise ValueError(f"ranks={ranks}: use 0 (not asked) or more")
    if ranks == 0:  # what a report gets without --distributed N: said, not silently absent
        return DistributedResult(0, "none", tuple(checks), {}, {}, {
            "title": "Not asked: no torchrun diagnosis", "detail": "The distributed checks launch the set-up on N "
            "local ranks under torchrun; this diagnosis was run without ranks.",
            "fix": "Run `python -m workbench diagnose CKPT --distributed 2` (or distributed_probe(target, ranks=2))."})
    backend = backend_for(ranks)
    refused = _memory_refusal(target, ranks) if backend == "gloo" else None
    if refused:
        return DistributedResult(ranks, backend, tuple(checks), {}, {}, refused)
    spec = {"target": target.options(), "checks": list(checks), "backend": backend, "timeout": timeout,
            "ddp_find_unused_parameters": ddp_find_unused_parameters, "launcher_pid": os.getpid()}
    with tempfile.TemporaryDirectory(prefix="workbench-torchrun-") as out:
        spec_path = Path(out) / "spec.json"
        spec_path.write_text(json.dumps(spec))
        run: RankRun = launch_ranks("workbench.distributed.rank", ["--spec", str(spec_path), "--out", out],
                                    ranks=ranks, timeout=timeout, out_dir=out)
    return DistributedResult(ranks, backend, tuple(checks), run.results, run.as_evidence())
