"""Every model-level check of a diagnosis (notebooks 00–04), run in this process, as the notebooks run them.

    findings = model_level_findings(folder, setup="qlora")   # the same steps, recorders and catalog as a report

Each notebook is opened with `open_notebook` and its steps run in the catalog's order through the same
`NotebookSession.run` the notebooks call, so a probe's crash is an `error` on its checks and a declared check the
notebook never reported is an `error` too (`workbench.contract.notebook_answers`, as the report runner makes it).
One process runs many checkpoints: the shared model is freed between them (`workbench.model.shared.reset`).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from workbench.findings import Finding

MODEL_LEVEL_NOTEBOOKS = ("00_saved_files", "01_dtype_distribution", "02_dataparallel", "03_peft_attributes",
                         "04_forward_checks")


def model_level_findings(folder: str | Path, setup: str = "plain",
                         notebooks: tuple[str, ...] = MODEL_LEVEL_NOTEBOOKS) -> list[Finding]:
    """The findings of notebooks 00–04 on `folder` under `setup` (no report written; sidecars in a temp dir)."""
    from workbench.catalog import notebook as notebook_spec
    from workbench.contract import notebook_answers
    from workbench.model import shared
    from workbench.notebook import open_notebook

    findings: list[Finding] = []
    shared.reset()
    try:
        with tempfile.TemporaryDirectory(prefix="workbench-arch-") as scratch:
            for name in notebooks:
                nb = open_notebook(name, checkpoint=str(folder), setup=setup,
                                   findings_path=str(Path(scratch) / f"{name}.json"))
                for step in notebook_spec(name).steps:
                    nb.run(step.name)
                findings += notebook_answers(name, notebook_spec(name).checks, nb.recorder.findings,
                                             "it ran every step and reported no finding for it")
    finally:
        shared.reset()
    return findings
