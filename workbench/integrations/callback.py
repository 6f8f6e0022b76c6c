"""`WorkbenchCallback`: the workbench inside your training script, as a `transformers.TrainerCallback`.

    from workbench.integrations import WorkbenchCallback
    trainer = Trainer(..., callbacks=[WorkbenchCallback(raise_on="fail")])
    trainer.train()      # pre-flight before the first step; the autopsy when training ends

`on_train_begin` runs the pre-flight (`workbench.integrations.preflight`) on the live Trainer and writes a dated
report under `output_dir/workbench/` (findings.json and index.html at once; each notebook's page, with its figures,
when training ends or stops, or at exit after a crash); with `raise_on="fail"` (or `"warn"`) a finding at or above that verdict stops
training before its first step with `WorkbenchStop`, which names the findings and the report. `error` findings (a
probe that could not run) are reported and never stop training: they say nothing about your run. `on_train_end`
appends the autopsy (`workbench.integrations.autopsy`) to the same report, and `on_save` brings it up to date at
every checkpoint the run saves (findings.json and index.html: a run killed later still has it up to its last save).

Under torchrun only the world's process zero runs the probes and writes; every other rank waits at a barrier and
learns from process zero whether training stops, so no rank is left alone in a collective.
"""

from __future__ import annotations

import atexit
import logging
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from workbench.findings import Finding, sort_findings, verdict_rank
from workbench.integrations.autopsy import run_autopsy
from workbench.integrations.live_report import LiveReport
from workbench.integrations.live_trainer import calling_trainer, quant_of, source_folder
from workbench.integrations.preflight import SETUP, live_target, run_preflight
from workbench.report.diagnosis import Diagnosis

logger = logging.getLogger("workbench")
RAISE_ON = (None, "fail", "warn")


class WorkbenchStop(RuntimeError):
    """Training stopped by the pre-flight: the findings at or above `raise_on`, and the report that shows them."""

    def __init__(self, findings: list[Finding], report: Path | None, raise_on: str) -> None:
        self.findings = findings
        self.report = report
        named = "; ".join(f"{f.id} {f.verdict.upper()}: {f.title}" for f in findings[:8])
        more = f" (and {len(findings) - 8} more)" if len(findings) > 8 else ""
        super().__init__(f"workbench pre-flight stopped training before its first step (raise_on={raise_on!r}): "
                         f"{named}{more}. Report: {report}")


class WorkbenchCallback(TrainerCallback):
    """The workbench's pre-flight before the first step and its run autopsy after the last (module docstring)."""

    def __init__(self, raise_on: str | None = None, *, autopsy: bool = True, loss_accumulation: bool = False,
                 data_samples: int | None = 20000) -> None:
        if raise_on not in RAISE_ON:
            raise ValueError(f"raise_on={raise_on!r}: use one of {RAISE_ON}")
        self.raise_on = raise_on
        self.autopsy = autopsy
        self.loss_accumulation = loss_accumulation
        self.data_samples = data_samples
        self.report = None  # the LiveReport, on process zero once the pre-flight ran
        self.preflight_seconds: float | None = None

    @property
    def report_folder(self) -> Path | None:
        return self.report.folder if self.report is not None else None

    def on_train_begin(self, args, state, control, model=None, processing_class=None, **kwargs: Any):
        stop: tuple | None = None  # (findings, report, raise_on) when process zero stops training
        if state.is_world_process_zero:
            trainer = calling_trainer(self)
            try:
                stop = self._preflight(trainer, model if model is not None else getattr(trainer, "model", None),
                                       processing_class, args)
            except Exception:  # noqa: BLE001 - the workbench failing says nothing about the run: training goes on
                logger.exception("workbench: the pre-flight could not run; training goes on")
        stop = _from_process_zero(stop)
        if stop is not None:
            raise WorkbenchStop(*stop)
        return control

    def on_save(self, args, state, control, model=None, **kwargs: Any):
        # the checkpoint is written when on_save is called: the autopsy reads it with the log so far. No figures
        # (write_pages) and no barrier: process zero's other ranks wait for it at the next collective only
        self._autopsy(args, state, model, when=f"at step {state.global_step}'s save")
        return control

    def on_train_end(self, args, state, control, model=None, **kwargs: Any):
        self._autopsy(args, state, model, when="at the end of training")
        if state.is_world_process_zero and self.report is not None:
            self.report.write_pages()
            atexit.unregister(self._write_pages)
        _barrier()
        return control

    def _autopsy(self, args, state, model, when: str) -> None:
        """The run autopsy on process zero, replacing the report's earlier one (a failure is logged: a report that
        cannot be completed must not fail the run)."""
        if not (self.autopsy and state.is_world_process_zero and self.report is not None):
            return
        try:
            self.report.publish([run_autopsy(args, state, model, self.report.diagnosis, self.report.folder)])
            logger.warning("workbench: run autopsy %s added to %s", when, self.report.index)
        except Exception:  # noqa: BLE001
            logger.exception("workbench: the run autopsy %s could not run", when)

    def _preflight(self, trainer, model, processing_class, args) -> tuple | None:
        start = time.perf_counter()
        source = source_folder(model)
        name = (source.name if source is not None else type(model).__name__)
        contract = {"checkpoint": str(source) if source else f"{type(model).__name__} (in memory)",
                    "model_dir": str(source) if source else None, "adapter": None, "base": None,
                    "quant": quant_of(model), "gpus": max(1, int(getattr(args, "_n_gpu", 1) or 1)), "setup": SETUP,
                    "output_dir": str(Path(args.output_dir).resolve())}
        diagnosis = Diagnosis(live_target(trainer, model), contract=contract)
        self.report = LiveReport.create(args.output_dir, name, diagnosis)
        ran = run_preflight(trainer, model, processing_class, diagnosis, self.report.folder,
                            loss_accumulation=self.loss_accumulation, data_samples=self.data_samples)
        self.report.publish(ran)
        findings = diagnosis.findings
        self.preflight_seconds = time.perf_counter() - start
        logger.warning("workbench: pre-flight report %s (%.1f s)", self.report.index, self.preflight_seconds)
        limit = verdict_rank(self.raise_on) if self.raise_on else None  # VERDICT_ORDER: a lower rank is worse
        stopping = [f for f in sort_findings(findings)
                    if limit is not None and f.verdict != "error" and verdict_rank(f.verdict) <= limit]
        if stopping:
            self.report.write_pages()
            return stopping, self.report.index, self.raise_on
        atexit.register(self._write_pages)  # a run that crashes mid-training still gets its pages
        return None

    def _write_pages(self) -> None:
        if self.report is not None:
            self.report.write_pages()


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _from_process_zero(value):
    """Process zero's value on every rank (other ranks wait here while process zero runs the probes)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return value
    box = [value if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]
