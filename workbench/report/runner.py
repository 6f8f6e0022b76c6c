"""The report runner: papermill executes each notebook into a dated folder, nbconvert exports it to HTML,
and the notebooks' sidecars are assembled into findings.json and index.html by the diagnosis
(`report.diagnosis.Diagnosis`: planned, each notebook's answers recorded, published).

A notebook that raises is still saved (papermill marks the failing cell), exported, and recorded as `error`;
the next notebook still runs. The report is assembled in a hidden `.partial` folder and renamed into
`reports/YYYY-MM-DD/HHMMSS-<name>/` when complete, so an interrupted run never leaves a half report that looks
whole, and two runs started in the same second get different folders.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import logging
import os
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable

from workbench.errors import UsageError
from workbench.findings import FAILING_VERDICTS, Finding, sort_findings
from workbench.model.target import Target
from workbench.paths import NOTEBOOK_DIR
from workbench.report.contract import NotebookRun
from workbench.report.diagnosis import Diagnosis
from workbench.report.html_export import export_html
from workbench.report.kernels import KERNEL_ARGUMENTS, KERNEL_NAME, Kernel


def find_notebooks(folder: Path = NOTEBOOK_DIR, only: list[str] | None = None) -> list[Path]:
    """The report notebooks (numbered) in `folder`, in order; `only` picks by number or name prefix. The sweep's
    comparison notebook (`catalog.SWEEP_NOTEBOOK`) is numbered too, but is no report notebook."""
    from workbench.catalog import SWEEP_NOTEBOOK

    notebooks = sorted(p for p in folder.glob("[0-9][0-9]_*.ipynb") if p.stem != SWEEP_NOTEBOOK)
    if only:
        notebooks = [p for p in notebooks if any(p.stem.startswith(o) or p.stem == o for o in only)]
    if not notebooks:
        raise UsageError(f"no notebooks to run in {folder}" + (f" matching {only}" if only else ""))
    return notebooks


def ensure_kernel() -> str:
    """The project's kernel: registered by `make install`; after a `pip install`, registered here for this
    interpreter on first use (ipykernel's own installer: the environment's prefix, else the user's Jupyter folder)."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        spec = KernelSpecManager().get_kernel_spec(KERNEL_NAME)
    except NoSuchKernel:
        from ipykernel.kernelspec import install

        try:
            install(kernel_name=KERNEL_NAME, display_name="Python (workbench)", prefix=sys.prefix)
        except OSError:  # a read-only environment: the user's own Jupyter data folder
            try:
                install(kernel_name=KERNEL_NAME, display_name="Python (workbench)", user=True)
            except OSError as exc:
                raise UsageError(f"the Jupyter kernel {KERNEL_NAME!r} is not registered and could not be "
                                 f"({exc.strerror}); run `python -m ipykernel install --user --name {KERNEL_NAME}`"
                                 ) from None
        spec = KernelSpecManager().get_kernel_spec(KERNEL_NAME)
    return spec.argv[0] if spec.argv else KERNEL_NAME


def check_reports_dir(reports_dir: Path) -> None:
    """Refuse a --reports-dir that cannot be created before anything is started or imported for the diagnosis, and
    without creating it (a target refused next leaves nothing behind): its nearest existing folder must be a
    writable folder. `new_report_folder` still reports what mkdir itself meets."""
    existing = Path(reports_dir).expanduser().absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise UsageError(f"cannot create reports folder {reports_dir} ({existing} is a file, not a folder); pass a "
                         "writable --reports-dir")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"cannot create reports folder {reports_dir} ({existing} is not writable); pass a writable "
                         "--reports-dir")


def new_report_folder(reports_dir: Path, name: str, now: dt.datetime) -> tuple[Path, Path]:
    """(temporary folder to write in, final folder to rename it to)."""
    day = reports_dir / now.strftime("%Y-%m-%d")
    try:
        day.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create reports folder {day} ({exc.strerror}); pass a writable --reports-dir") \
            from None
    if not os.access(day, os.W_OK):
        raise UsageError(f"reports folder {day} is not writable; pass a writable --reports-dir")
    stem = f"{now.strftime('%H%M%S')}-{name}"
    final = day / stem
    suffix = 1
    while final.exists():
        suffix += 1
        final = day / f"{stem}-{suffix}"
    temp = day / f".{stem}.{uuid.uuid4().hex[:8]}.partial"
    temp.mkdir()
    return temp, final


def prepare_execution(notebooks: list[Path]) -> None:
    """What the first notebook's execution would do before its first cell, done now: papermill and the workbench's
    engine imported, nbformat's schema validator compiled (papermill validates each notebook it reads and writes;
    nbformat keeps one validator per format version, and one notebook read compiles it for all of them: the
    committed notebooks share theirs, 4.5). The CLI calls it while the fresh kernel is still importing the stack, on
    the core that kernel leaves idle: done after the kernel is ready, these 0.5-0.6 s were idle time of the kernel
    before notebook 00."""
    import nbformat
    import papermill  # noqa: F401

    import workbench.report.papermill_engine  # noqa: F401 - registers the engine

    for notebook in notebooks[:1]:
        nbformat.validate(nbformat.read(notebook, as_version=4))


def run_notebook(notebook: Path, folder: Path, parameters: dict[str, Any], kernel: Kernel | str,
                 cell_timeout: int | None = None, export: bool = True) -> NotebookRun:
    """Execute one notebook into `folder` and (unless `export=False`: call `export_run` later) export its HTML.
    `kernel`: a Kernel to run in (shared by the notebooks of a diagnosis), or a kernel name for a kernel of its
    own."""
    import papermill as pm

    from workbench.notebook import parameters_cell_mismatch
    from workbench.report.papermill_engine import ENGINE_NAME

    executed = folder / f"{notebook.stem}.ipynb"
    start = time.monotonic()
    error = parameters_cell_mismatch(notebook, parameters)
    if error:  # papermill would inject them silently and the notebook would ignore them: refuse instead
        return NotebookRun(notebook.stem, "error", None, 0.0, f"parameters contract broken: {error}")
    try:
        # no cwd=: papermill would os.chdir the whole process, which breaks notebooks run side by side; kernels
        # keep the user's working folder and every path handed to them is absolute
        own = not isinstance(kernel, Kernel)
        pm.execute_notebook(str(notebook), str(executed), parameters=parameters, engine_name=ENGINE_NAME,
                            kernel_name=kernel if own else kernel.name, km=None if own else kernel.manager(),
                            kc=None if own else kernel.client(),
                            progress_bar=False, log_output=False, report_mode=False,
                            extra_arguments=list(KERNEL_ARGUMENTS), execution_timeout=cell_timeout)
    except Exception as exc:  # noqa: BLE001 - PapermillExecutionError and kernel deaths alike: failure as artifact
        error = f"{type(exc).__name__}: {getattr(exc, 'evalue', None) or str(exc).strip().splitlines()[-1:]}"
    run = NotebookRun(notebook.stem, "error" if error else "ok", None, round(time.monotonic() - start, 2), error)
    return export_run(run, folder) if export else run


def export_run(run: NotebookRun, folder: Path) -> NotebookRun:
    """Export an executed notebook of `folder` to HTML beside it; an export that fails makes the run an error."""
    executed = folder / f"{run.name}.ipynb"
    if executed.exists():
        try:
            export_html(executed, folder / f"{run.name}.html")
            run.html = f"{run.name}.html"
        except Exception as exc:  # noqa: BLE001
            run.error = run.error or f"HTML export failed: {type(exc).__name__}: {exc}"
            run.status = "error"
    return run


def sidecar_findings(folder: Path, name: str) -> list[Finding]:
    """The findings notebook `name`'s kernel wrote in its sidecar (none when it wrote nothing readable)."""
    try:
        return [Finding.from_dict(d) for d in read_sidecar(folder, name).get("findings", [])]
    except (KeyError, TypeError, ValueError):
        return []


def read_sidecar(folder: Path, name: str) -> dict[str, Any]:
    """What notebook `name`'s kernel wrote beside the report (`findings.<name>.json`: its findings, cost and
    environment); empty when it wrote nothing readable."""
    try:
        sidecar = json.loads((folder / f"findings.{name}.json").read_text())
    except (OSError, ValueError):
        return {}
    return sidecar if isinstance(sidecar, dict) else {}


def notebook_parameters(target: Target, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """What each notebook's parameters cell receives: the target's options (re-resolved in the kernel) and extras
    of the contract (`workbench.notebook.NOTEBOOK_PARAMETERS`)."""
    return {**target.options(), **(extra or {})}


def parallel_jobs(target: Target, notebooks: int) -> int:
    """Notebooks to run side by side: one per core (at most 2), and only while a model copy per kernel fits easily
    (each kernel loads the model; the memory goal is never two copies of a big model at once)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    jobs = min(2, cores, notebooks)
    if jobs < 2:
        return 1
    from workbench.model.memory import two_copies_fit_easily

    return jobs if two_copies_fit_easily(target) else 1


def kernel_variables(notebooks: list[Path]) -> dict[str, str]:
    """What a diagnosis tells its kernels through their environment (each kernel is another process; this process's
    own environment is left as it is): the user's folder importable (`--setup module:function`, in the kernel and in
    the ranks torchrun starts from it), batch mode (probes print plain progress lines instead of widgets), and the
    notebooks this diagnosis runs (`workbench.model.shared` runs their own-copy steps before it prepares a model too
    big for two copies)."""
    from workbench.model.shared import NOTEBOOKS_ENV

    return {"PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")])),
            "WORKBENCH_BATCH": "1", NOTEBOOKS_ENV: ",".join(nb.stem for nb in notebooks)}


def start_kernel(only: list[str] | None = None) -> Kernel:
    """The diagnosis' one kernel, started now: the stack's imports in it overlap the caller's own work (the CLI
    starts it before validating the target). `only`: the notebooks `diagnose` will run (as its `only=`), which the
    kernel is told. Hand it to `diagnose(kernel=...)`, or `close()` it."""
    ensure_kernel()
    kernel = Kernel(env=kernel_variables(find_notebooks(NOTEBOOK_DIR, only=only)))
    kernel.manager()
    return kernel


def diagnose(target: Target, *, reports_dir: Path, only: list[str] | None = None, extra_parameters=None,
             echo: Callable[[str], None] = print, notebook_dir: Path = NOTEBOOK_DIR,
             cell_timeout: int | None = 1800, jobs: int | None = 1,
             kernel: Kernel | None = None, keep_kernel: bool = False) -> tuple[Path, list[Finding]]:
    """The notebooks into a dated report folder: planned, executed by papermill, assembled and published by the
    diagnosis (`report.diagnosis.Diagnosis`); (folder, findings). `jobs`: notebooks side by side, each in its own
    kernel (None: by cores and memory). `kernel`: one already started (`start_kernel`), used when the notebooks run
    one at a time and closed at the end, unless `keep_kernel` (a sweep's members in series: the caller closes it,
    and `Kernel.begin_diagnosis` resets it between diagnoses)."""
    try:
        kernel_python = ensure_kernel()
        notebooks = find_notebooks(Path(notebook_dir), only=only)
        now = dt.datetime.now().astimezone()
        diagnosis = Diagnosis.plan(target, notebooks, created=now)
        temp, final = new_report_folder(Path(reports_dir).resolve(), target.name, now)
        echo(f"diagnosing {target.checkpoint} -> {final} (kernel {KERNEL_NAME}: {kernel_python})")
        if target.run is not None:
            echo(f"Trainer output directory: diagnosing {target.run.describe()}")
        if target.model_unavailable:
            echo(f"the model cannot be resolved ({target.model_unavailable}): only the run autopsy runs; "
                 f"{target.base_fix}")
        notebooks = [nb for nb in notebooks if diagnosis.part(nb.stem).runs]
        jobs = jobs or parallel_jobs(target, len(notebooks))
        # notebooks of your own (another notebook_dir) may not need the stack: their kernel is not warmed up with it
        # (beside a kernel server it is forked all the same, the stack there at no cost)
        execution = PapermillExecution(diagnosis, temp, notebook_parameters(target, extra_parameters),
                                       kernel_variables(notebooks), cell_timeout, echo,
                                       warm_up=Path(notebook_dir) == NOTEBOOK_DIR)
        with papermill_log_in(temp):
            if jobs == 1:
                runs = execution.in_one_kernel(notebooks, kernel, keep=keep_kernel)
            else:
                echo(f"running {jobs} notebooks at a time, each in its own kernel (each holds its own copy of the "
                     "model)")
                runs = execution.side_by_side(notebooks, jobs)
        diagnosis.report.cost = diagnosis_cost(temp, runs, kernels=execution.kernels_started,
                                               kernel_kept=execution.kernel_kept)
        diagnosis.report.environment = kernel_environment(temp, runs)
        return diagnosis.publish(temp, into=final, listing=Path(reports_dir).resolve()), diagnosis.findings
    finally:
        if kernel is not None and not keep_kernel:
            kernel.close()


@contextlib.contextmanager
def papermill_log_in(folder: Path):
    """papermill's and nbclient's own log lines ("Timeout waiting for execute reply", ...) go to the report's
    papermill.log, not the console: the console shows one line per notebook, with the error it ended on."""
    papermill_log = logging.getLogger("papermill")
    handler = logging.FileHandler(folder / "papermill.log")
    papermill_log.addHandler(handler)
    papermill_log.propagate = False
    try:
        yield
    finally:
        papermill_log.removeHandler(handler)
        handler.close()
        papermill_log.propagate = True


@dataclasses.dataclass
class PapermillExecution:
    """The diagnosis' execute step for `workbench diagnose`: each running part's notebook through papermill into
    `folder`, its sidecar recorded into the diagnosis as the notebook ends."""

    diagnosis: Diagnosis
    folder: Path
    parameters: dict[str, Any]  # every notebook's (the sidecar path added per notebook)
    variables: dict[str, str]  # the kernels' environment (`kernel_variables`)
    cell_timeout: int | None
    echo: Callable[[str], None]
    warm_up: bool
    kernels_started: int = 0
    kernel_kept: bool = False  # the notebooks began in a kernel an earlier diagnosis ran in (reset since)
    _assembling: Any = dataclasses.field(default_factory=threading.Lock)  # side-by-side notebooks, one at a time

    def in_one_kernel(self, notebooks: list[Path], kernel: Kernel | None = None, keep: bool = False
                      ) -> list[NotebookRun]:
        """The notebooks in order in one kernel (`kernel`, else a new one), the prepared model shared; a notebook that
        kills or hangs its kernel leaves the next ones a fresh one. Each notebook's HTML is exported in a thread of
        this process while the kernel runs the next notebook. `keep`: the kernel is left running at the end (for
        the next diagnosis of a sweep in series)."""
        from concurrent.futures import ThreadPoolExecutor

        own = kernel is None
        kernel = kernel or Kernel(warm_up=self.warm_up, env=self.variables)
        self.kernel_kept = kernel.diagnoses > 1 and kernel.started == 0 and kernel.alive()
        kernel.manager()  # started (and importing the stack) before this process imports papermill
        exports = ThreadPoolExecutor(max_workers=1)
        runs = []
        try:
            for i, notebook in enumerate(notebooks, 1):
                fresh = i > 1 and not kernel.alive()  # the previous notebook killed or hung it
                run = self._run(i, len(notebooks), notebook, kernel, "fresh" if fresh else "shared", export=False)
                exports.submit(export_run, run, self.folder)
                if run.error and ("Timeout" in run.error or "DeadKernel" in run.error or not kernel.alive()):
                    kernel.discard()  # a hung or dead kernel: the next notebook starts a fresh one
                runs.append(run)
        finally:
            if not keep:
                kernel.discard()  # its console flushed into the log before it is copied
            kernel.save_log(self.folder / "kernel.log")
            self.kernels_started = kernel.started
            if own:
                kernel.close()
            exports.shutdown(wait=True)  # every HTML written (and every export error on its run) before the index
        return runs

    def side_by_side(self, notebooks: list[Path], jobs: int) -> list[NotebookRun]:
        """`jobs` notebooks at a time, each in a kernel of its own (each holds its own copy of the model)."""
        from concurrent.futures import ThreadPoolExecutor

        def in_own_kernel(item: tuple[int, Path]) -> NotebookRun:
            i, notebook = item
            with Kernel(warm_up=self.warm_up, env=self.variables) as kernel:
                return self._run(i, len(notebooks), notebook, kernel, "own", export=True)

        with ThreadPoolExecutor(max_workers=jobs) as pool:
            runs = list(pool.map(in_own_kernel, enumerate(notebooks, 1)))
        self.kernels_started = len(runs)
        return runs

    def _run(self, i: int, n: int, notebook: Path, kernel: Kernel, kind: str, export: bool) -> NotebookRun:
        self.echo(f"[{i}/{n}] {notebook.stem} ...")
        sidecar = str(self.folder / f"findings.{notebook.stem}.json")
        run = run_notebook(notebook, self.folder, {**self.parameters, "findings_path": sidecar}, kernel,
                           self.cell_timeout, export=export)
        run.kernel = kind
        with self._assembling:
            answers = self.diagnosis.record(run, sidecar_findings(self.folder, notebook.stem))
        verdicts = ", ".join(f"{f.id} {f.verdict}" for f in sort_findings(answers))
        self.echo(f"[{i}/{n}] {notebook.stem} {run.status} ({run.seconds:.1f} s): {verdicts}"
                  + (f"\n      {run.error}" if run.error else "")
                  + ("\n      (in a fresh kernel: the previous notebook's kernel died or hung)" if kind == "fresh"
                     else ""))
        return run


def diagnosis_cost(folder: Path, runs: list[NotebookRun], kernels: int, kernel_kept: bool = False) -> dict[str, Any]:
    """The optional `cost` block of findings.json: full model loads, kernels started (0 with `kernel_kept`: the
    kernel of an earlier diagnosis, reset), seconds per notebook and per probe step (its checks), peak memory."""
    loads: list[dict[str, Any]] = []
    steps: list[dict[str, Any]] = []
    peak = 0
    for run in runs:
        sidecar = read_sidecar(folder, run.name)
        cost = sidecar.get("cost") or {}
        loads += [{"notebook": run.name, **load} for load in cost.get("model_loads", [])]
        timed = sidecar.get("steps") if isinstance(sidecar.get("steps"), list) else []
        steps += [{"notebook": run.name, **step} for step in timed if isinstance(step, dict)]
        peak = max(peak, int(cost.get("peak_rss_bytes") or 0))
    return {"model_loads": len(loads), "loads": loads, "kernels_started": kernels, "kernel_kept": kernel_kept,
            "seconds": round(sum(r.seconds for r in runs), 2),
            "notebook_seconds": {r.name: r.seconds for r in runs}, "steps": steps, "peak_rss_bytes": peak or None}


def kernel_environment(folder: Path, runs: list[NotebookRun]) -> dict[str, Any] | None:
    """The software the notebooks ran with, as their kernel wrote it in its sidecar (None when no sidecar says)."""
    return next((env for run in runs if (env := read_sidecar(folder, run.name).get("environment"))), None)


def exit_code(findings: list[Finding]) -> int:
    return 1 if any(f.verdict in FAILING_VERDICTS for f in findings) else 0
