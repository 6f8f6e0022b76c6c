"""The workbench's command line run by its own entry point (`workbench.cli.main`) in the test's process.

A `python -m workbench` subprocess imports the CLI's stack again (papermill, nbconvert, jupyter_client: about 2.5 s
of CPU on 2 cores), which the test worker has already imported; the kernels, torchrun ranks and workers the command
starts are still processes of their own, as for a user. What a fresh process checks (the CLI's own imports,
`python -m workbench` itself, environment variables read when a module is imported, such as the Hub's endpoint) stays
with the tests that start one: tests/test_light_import.py, tests/test_packaging.py, tests/hub/.

    result = workbench_here("diagnose", folder, "--notebooks", "00", cwd=tmp_path)
    result.returncode, result.stdout, result.stderr   # as subprocess.run(..., capture_output=True, text=True) gives

A `diagnose` run here in the worker's own folder with the worker's variables runs its notebooks in the worker's kept
kernel, as `workbench sweep` runs its members in series (`diagnose_as_asked(kept_kernel=...)`): each diagnosis gets
the kernel made as a fresh one would be (`workbench.report.kernel_reset`), or a fresh kernel where that cannot be
done, and the stack's imports are paid once a worker instead of once a test. A run with `cwd` or a variable of its
own gets a fresh kernel (a kernel's folder and environment are its start's); the tests of the fresh kernel itself
(its start before the target is read, its log, one kernel a report) run `diagnose` in a process of their own or
call the runner directly.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path

# read by the command when it runs (not cached at import), so setting them for the call is what a process would see
RUNTIME_VARIABLES = {"OMP_NUM_THREADS", "WORKBENCH_CACHE", "PYTHONUNBUFFERED"}


def workbench_here(*args, cwd: Path | str | None = None, env: dict[str, str] | None = None,
                   stdin: str = "") -> subprocess.CompletedProcess:
    """`workbench ARGS` as `subprocess.run([sys.executable, "-m", "workbench", *ARGS], capture_output=True,
    text=True, stdin=DEVNULL)` reports it: exit code, stdout, stderr. `cwd`: the folder it runs in; `env`: variables
    set for the call (RUNTIME_VARIABLES, or the value this process already has); `stdin`: what it reads from standard input."""
    from workbench.cli import main

    unknown = {k for k, v in (env or {}).items() if k not in RUNTIME_VARIABLES and os.environ.get(k) != v}
    if unknown:
        raise ValueError(f"{sorted(unknown)} may be read when a module is imported: run a process for them")
    argv = [str(a) for a in args]
    kept = argv[:1] == ["diagnose"] and cwd is None and not any(os.environ.get(k) != v for k, v in (env or {}).items()) \
        and _as_the_worker_started()
    stdout, stderr = io.StringIO(), io.StringIO()
    saved_env = {k: os.environ.get(k) for k in env or {}}
    saved_cwd, saved_stdin = os.getcwd(), sys.stdin
    try:
        os.environ.update(env or {})
        if cwd is not None:
            os.chdir(cwd)
        sys.stdin = io.TextIOWrapper(io.BytesIO(stdin.encode()), encoding="utf-8")  # .buffer, as a pipe's
        in_kernel = diagnoses_in_the_kept_kernel() if kept else contextlib.nullcontext()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr), in_kernel:
            try:
                code = main(argv)
            except SystemExit as exc:  # argparse's usage errors
                code = exc.code if isinstance(exc.code, int) else 2
    finally:
        sys.stdin = saved_stdin
        os.chdir(saved_cwd)
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return subprocess.CompletedProcess(["workbench", *argv], code, stdout.getvalue(), stderr.getvalue())


_KEPT: list = []  # this worker's kept kernel, once started
# the worker's variables before any test ran (this module is imported as the tests are collected): a kernel takes its
# start's environment, so the kept one starts, and serves, only where a test has changed none of them
# (pytest's name of the running test, and what a library sets for itself in each process that imports it: torch's
# inductor, imported by bitsandbytes, its cache folder)
OWN_VARIABLES = {"PYTEST_CURRENT_TEST", "TORCHINDUCTOR_CACHE_DIR"}
WORKER_ENVIRONMENT = {k: v for k, v in os.environ.items() if k not in OWN_VARIABLES}


def _as_the_worker_started() -> bool:
    return {k: v for k, v in os.environ.items() if k not in OWN_VARIABLES} == WORKER_ENVIRONMENT


def kept_kernel():
    """This worker's kernel for the in-process diagnoses, started on first use and counted as begun, so that every
    test's diagnosis gets it reset (`Kernel.begin_diagnosis`), none the kernel as it started."""
    from workbench.report.runner import start_kernel

    if not _KEPT:
        kernel = start_kernel()
        kernel.begin_diagnosis([], "plain")
        _KEPT.append(kernel)
    return _KEPT[0]


def close_kept_kernel() -> None:
    while _KEPT:
        _KEPT.pop().close()


@contextlib.contextmanager
def diagnoses_in_the_kept_kernel():
    """`diagnose` given the worker's kept kernel, as `workbench sweep` gives its members one."""
    import workbench.diagnose_command as command

    diagnose_as_asked = command.diagnose_as_asked

    def in_the_kept_kernel(args, **options):
        return diagnose_as_asked(args, **{"kept_kernel": kept_kernel(), **options})

    command.diagnose_as_asked = in_the_kept_kernel
    try:
        yield
    finally:
        command.diagnose_as_asked = diagnose_as_asked
