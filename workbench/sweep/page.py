"""The sweep's comparison page: notebooks/12_sweep.ipynb executed by papermill in the project's kernel, in the
sweep's folder, and exported as its index.html (the report template: code hidden, images inline)."""

from __future__ import annotations

import os
from pathlib import Path

from workbench.catalog import SWEEP_NOTEBOOK
from workbench.paths import NOTEBOOK_DIR, PROJECT_ROOT


def pythonpath_with_checkout() -> str:
    """PYTHONPATH for a kernel or a Ray worker that must import this workbench: a clone's checkout first (an
    environment may hold another install of it), then what was there."""
    checkout = (PROJECT_ROOT / "notebooks").is_dir() and (PROJECT_ROOT / "workbench").is_dir()
    return os.pathsep.join(filter(None, [str(PROJECT_ROOT) if checkout else "", os.environ.get("PYTHONPATH")]))


def write_comparison(sweep_dir: Path, *, history: bool, cell_timeout: int, kernel=None) -> str | None:
    """index.html of the sweep from the comparison notebook; the notebook's error, or None when it ran clean.
    `kernel`: the kernel the members were diagnosed in, one after another (the local engine's), run in once its last
    member's namespace and model are given back (`Kernel.release_the_model`): the page then starts no kernel of its
    own (~1.5 s of a sweep on 2 cores). Without one, or where it cannot be released, a light kernel of its own."""
    from workbench.report.html_export import export_html
    from workbench.report.kernels import Kernel
    from workbench.report.runner import ensure_kernel, run_notebook

    notebook = NOTEBOOK_DIR / f"{SWEEP_NOTEBOOK}.ipynb"
    parameters = {"sweep_dir": str(sweep_dir), "history": history}
    if kernel is not None and _released(kernel):
        run = run_notebook(notebook, sweep_dir, parameters, kernel, cell_timeout, export=False)
    else:
        ensure_kernel()
        # the kernel is told where this workbench is through its own environment (this process's is left as it
        # is); it reads reports with pandas and matplotlib: no warm-up of the training stack
        with Kernel(warm_up=False, env={"PYTHONPATH": pythonpath_with_checkout()}) as own:
            run = run_notebook(notebook, sweep_dir, parameters, own, cell_timeout, export=False)
    executed = sweep_dir / f"{SWEEP_NOTEBOOK}.ipynb"
    if executed.exists():
        try:
            export_html(executed, sweep_dir / "index.html")
        except Exception as exc:  # noqa: BLE001 - the page is the sweep's result: its failure is said
            return run.error or f"HTML export failed: {type(exc).__name__}: {exc}"
    return run.error


def _released(kernel) -> bool:
    """The members' kernel with the last member's namespace and model given back; False where that cannot be done
    (a kernel that died and could not be started again included): the page then runs in a kernel of its own."""
    try:
        return kernel.release_the_model()
    except Exception:  # noqa: BLE001 - the page does not depend on the members' kernel
        return False
