"""The workbench's command line run by its own entry point (`workbench.cli.main`) in the test's process.

A `python -m workbench` subprocess imports the CLI's stack again (papermill, nbconvert, jupyter_client: about 2.5 s
of CPU on 2 cores), which the test worker has already imported; the kernels, torchrun ranks and workers the command
starts are still processes of their own, as for a user. What a fresh process checks (the CLI's own imports,
`python -m workbench` itself, environment variables read when a module is imported, such as the Hub's endpoint) stays
with the tests that start one: tests/test_light_import.py, tests/test_packaging.py, tests/hub/.

    result = workbench_here("diagnose", folder, "--notebooks", "00", cwd=tmp_path)
    result.returncode, result.stdout, result.stderr   # as subprocess.run(..., capture_output=True, text=True) gives
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
    stdout, stderr = io.StringIO(), io.StringIO()
    saved_env = {k: os.environ.get(k) for k in env or {}}
    saved_cwd, saved_stdin = os.getcwd(), sys.stdin
    try:
        os.environ.update(env or {})
        if cwd is not None:
            os.chdir(cwd)
        sys.stdin = io.TextIOWrapper(io.BytesIO(stdin.encode()), encoding="utf-8")  # .buffer, as a pipe's
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
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
