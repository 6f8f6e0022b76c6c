"""The architecture census: every model-level check on a tiny random checkpoint of every auto-mapped model type.

    python -m workbench families                       # all, under plain and qlora: docs/families.{md,json}
    python -m workbench families --only llama,whisper  # a few, printed (nothing written unless --out)

One worker process per set-up walks the architectures in order (`census_worker`), building each checkpoint once
in a shared folder and running notebooks 00–04's steps on it in process (`checks_in_process`); a record per
architecture and set-up is appended to a JSONL file as it completes. An architecture that takes longer than
`TIMEOUT_S` is recorded as such; a worker that dies (a segfault in a kernel) is restarted after the architecture
it died on, which is recorded with the exit code.

A record: `model_type`, `setup`, `head`, `class_name`, `built` (the tiny checkpoint saved, loaded and ran one
forward on a batch the workbench built), `reason` (why not built, or the known incompatibility behind a verdict),
`verdicts` (check id → verdict), `problems` (the fail / error / warn findings' titles), `seconds`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from workbench.architectures.known_incompatibilities import known_incompatibility

SETUPS = ("plain", "qlora")
TIMEOUT_S = 180
FALSE_ALARM = ("fail", "error", "warn")
NO_BATCH = "Could not build a batch this model accepts"


def record_for(arch, setup: str, folder: Path | None, findings: list, build_error: str | None,
               seconds: float) -> dict[str, Any]:
    """One census record from what building and diagnosing produced (module docstring)."""
    record: dict[str, Any] = {"model_type": arch.model_type, "setup": setup, "head": arch.head,
                              "class_name": arch.class_name, "built": False, "reason": None, "verdicts": {},
                              "problems": [], "seconds": round(seconds, 1)}
    if build_error:
        record["reason"] = build_error if build_error.startswith("timed out") else f"not built: {build_error}"
        return record
    no_batch = next((f for f in findings if f.title == NO_BATCH), None)
    record["verdicts"] = {f.id: f.verdict for f in findings}
    record["problems"] = [{"id": f.id, "verdict": f.verdict, "title": f.title, "detail": f.detail[:400]}
                          for f in findings if f.verdict in FALSE_ALARM and f.title != NO_BATCH]
    known = known_incompatibility(arch.model_type, setup)
    if no_batch is not None and setup == "plain":  # the tiny checkpoint runs no forward: not built
        record["reason"] = known or f"no batch runs the tiny checkpoint: {no_batch.detail[:400]}"
        record["verdicts"] = {k: v for k, v in record["verdicts"].items() if k not in _FORWARD_CHECKS}
        return record
    record["built"] = True
    if no_batch is not None:
        record["problems"].insert(0, {"id": "forward.*", "verdict": "error", "title": NO_BATCH,
                                      "detail": no_batch.detail[:400]})
    record["reason"] = known if record["problems"] else None
    return record


class ArchitectureTimeout(BaseException):
    """An architecture ran past TIMEOUT_S. A BaseException: the recorder turns a probe's Exception into an `error`
    finding and goes on, which would swallow the alarm."""


_FORWARD_CHECKS = ("grad.flow", "forward.mixed_precision_buffers", "forward.scenarios", "forward.dtype_flow")


def census_worker(setup: str, out: Path, parent: Path, only: list[str], skip: set[str]) -> None:
    """Append a record per architecture to `out` (JSONL), skipping those in `skip` (already recorded)."""
    import signal
    import warnings

    from workbench.architectures.checkpoints import build_tiny_checkpoint
    from workbench.architectures.checks_in_process import model_level_findings
    from workbench.architectures.model_types import architectures

    warnings.filterwarnings("ignore")
    os.environ["WORKBENCH_BATCH"] = "1"
    import gc

    import transformers.modeling_utils  # noqa: F401 - what every record imports, frozen next

    # the imports' objects live as long as the worker: each gc.collect() that frees a record's model skips them
    gc.freeze()

    def timed_out(*_):
        raise ArchitectureTimeout(f"timed out: took longer than {TIMEOUT_S} s")

    signal.signal(signal.SIGALRM, timed_out)
    for arch in architectures():
        if (only and arch.model_type not in only) or arch.model_type in skip:
            continue
        _mark(out, arch.model_type)  # a worker that dies here is restarted after this architecture
        start, folder, findings, build_error = time.monotonic(), None, [], None
        signal.alarm(TIMEOUT_S)
        try:
            try:
                folder = build_tiny_checkpoint(arch, parent)
            except Exception as exc:  # noqa: BLE001 - the reason is the record
                build_error = f"{type(exc).__name__}: {str(exc)[:300]}"
            if folder is not None:
                findings = model_level_findings(folder, setup=setup)
        except ArchitectureTimeout as exc:  # no verdict: the record says so rather than keep half of them
            build_error, findings = str(exc), []
        finally:
            signal.alarm(0)
        record = record_for(arch, setup, folder, findings, build_error, time.monotonic() - start)
        with out.open("a") as fh:
            fh.write(json.dumps(record) + "\n")


def _mark(out: Path, model_type: str) -> None:
    out.with_suffix(".current").write_text(model_type)


def _recorded(out: Path) -> set[str]:
    if not out.exists():
        return set()
    return {json.loads(line)["model_type"] for line in out.read_text().splitlines() if line.strip()}


def run_census(setups: tuple[str, ...] = SETUPS, only: list[str] | None = None,
               work: Path | None = None) -> list[dict[str, Any]]:
    """Every record of the census (module docstring): one worker per set-up, run side by side, restarted after
    an architecture that kills it. Checkpoints are built once, by the first set-up's worker, in `work`."""
    from workbench.architectures.checkpoints import build_tiny_checkpoint
    from workbench.architectures.model_types import architectures
    from workbench.report.kernel_client import served_module

    work = Path(work or tempfile.mkdtemp(prefix="workbench-census-"))
    parent = work / "checkpoints"
    parent.mkdir(parents=True, exist_ok=True)
    archs = [a for a in architectures() if not only or a.model_type in only]
    for arch in archs:  # built once, before the workers share them (a failure is recorded by each worker)
        try:
            build_tiny_checkpoint(arch, parent)
        except Exception:  # noqa: BLE001, S112 - each worker records its reason
            continue
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WORKBENCH_BATCH": "1", "TRANSFORMERS_VERBOSITY": "error",
           "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    outs = {setup: work / f"{setup}.jsonl" for setup in setups}
    wanted = {a.model_type for a in archs}
    pending = set(setups)
    while pending:
        procs = {}
        for setup in pending:
            command = [sys.executable, "-m", *served_module("workbench.architectures.census",
                                                            [setup, str(outs[setup]), str(parent), ",".join(only or [])])]
            procs[setup] = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL)
        for setup, proc in procs.items():
            code = proc.wait()
            done = _recorded(outs[setup])
            if code != 0 and wanted - done:  # died on the architecture it marked: recorded, then go on
                current = outs[setup].with_suffix(".current").read_text()
                arch = next(a for a in archs if a.model_type == current)
                record = record_for(arch, setup, None, [], f"the process died (exit code {code})", 0.0)
                with outs[setup].open("a") as fh:
                    fh.write(json.dumps(record) + "\n")
                continue
            pending.discard(setup)
    records = [json.loads(line) for setup in setups for line in outs[setup].read_text().splitlines() if line]
    return sorted(records, key=lambda r: (r["model_type"], setups.index(r["setup"])))


if __name__ == "__main__":  # a worker: SETUP OUT.jsonl CHECKPOINTS ONLY
    _setup, _out, _parent, _only = sys.argv[1:5]
    census_worker(_setup, Path(_out), Path(_parent), [t for t in _only.split(",") if t], _recorded(Path(_out)))
