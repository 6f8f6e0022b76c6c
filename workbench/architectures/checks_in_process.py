"""The checks of a diagnosis, run in this process, as the notebooks run them.

    findings = model_level_findings(folder, setup="qlora")   # notebooks 00–04: the same steps, recorders, catalog
    findings = model_level_findings(output_dir, notebooks=("00_saved_files", "08_training_run"), data="rows.jsonl")

A diagnosis like `workbench diagnose`'s (`report.diagnosis.Diagnosis`): the same plan (a notebook that does not
apply to the target is answered `skip` on each of its checks), each notebook's steps in the catalog's order through
the same `NotebookSession.run` the notebooks call (a probe's crash is an `error` on its checks), assembled by the same
rule (`contract.notebook_answers`: a declared check the notebook never reported is an `error` too). The options are
the notebooks' own (`workbench.notebook.TARGET_OPTIONS`: adapter, base, data, training_args, …). One process runs
many checkpoints: the shared model is freed between them (`workbench.model.shared.reset`).
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from workbench.findings import Finding

MODEL_LEVEL_NOTEBOOKS = ("00_saved_files", "01_dtype_distribution", "02_dataparallel", "03_peft_attributes",
                         "04_forward_checks")


def model_level_findings(folder: str | Path, setup: str = "plain",
                         notebooks: tuple[str, ...] = MODEL_LEVEL_NOTEBOOKS, **options: Any) -> list[Finding]:
    """The findings of `notebooks` (default 00–04) on `folder` under `setup` and the notebooks' other `options`
    (no report written; sidecars in a temp dir)."""
    from workbench.model import shared
    from workbench.model.target import resolve_target
    from workbench.notebook import TARGET_OPTIONS
    from workbench.report.diagnosis import Diagnosis
    from workbench.runtime import quiet_and_offline

    quiet_and_offline()
    target = resolve_target(**{**TARGET_OPTIONS, **options, "checkpoint": str(folder), "setup": setup})
    diagnosis = Diagnosis.plan(target, notebooks)
    shared.reset()
    try:
        with tempfile.TemporaryDirectory(prefix="workbench-arch-") as scratch:
            diagnosis.run_in_process(Path(scratch))
    finally:
        shared.reset()
    return diagnosis.findings
