"""The checks of a diagnosis, run in this process, as the notebooks run them.

    findings = model_level_findings(folder, setup="qlora")   # notebooks 00–04: the same steps, recorders, catalog
    findings = model_level_findings(output_dir, notebooks=("00_saved_files", "08_training_run"), data="rows.jsonl")

Each notebook is opened with `open_notebook` and its steps run in the catalog's order through the same
`NotebookSession.run` the notebooks call, so a probe's crash is an `error` on its checks and a declared check the
notebook never reported is an `error` too (`workbench.contract.notebook_answers`, as the report runner makes it).
The options are the notebooks' own (`workbench.notebook.TARGET_OPTIONS`: adapter, base, data, training_args, …);
a notebook that does not apply to the target is answered `skip` on each of its checks by the report runner's own
rule (`report.runner.not_applicable`: the run autopsy on no Trainer output_dir, a model notebook when the model
cannot be resolved). One process runs many checkpoints: the shared model is freed between them
(`workbench.model.shared.reset`).
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
    from workbench.catalog import notebook as notebook_spec
    from workbench.contract import notebook_answers
    from workbench.model import shared
    from workbench.model.target import resolve_target
    from workbench.notebook import TARGET_OPTIONS, open_notebook
    from workbench.report.runner import not_applicable, skipped_findings

    values = {**TARGET_OPTIONS, **options, "checkpoint": str(folder), "setup": setup}
    target = resolve_target(**values)
    skipped = {path.stem for path in not_applicable([Path(name) for name in notebooks], target)}
    findings: list[Finding] = []
    shared.reset()
    try:
        with tempfile.TemporaryDirectory(prefix="workbench-arch-") as scratch:
            for name in notebooks:
                if name in skipped:
                    findings += skipped_findings(Path(name), target)
                    continue
                nb = open_notebook(name, **{**values, "findings_path": str(Path(scratch) / f"{name}.json")})
                for step in notebook_spec(name).steps:
                    nb.run(step.name)
                findings += notebook_answers(name, notebook_spec(name).checks, nb.recorder.findings,
                                             "it ran every step and reported no finding for it")
    finally:
        shared.reset()
    return findings
