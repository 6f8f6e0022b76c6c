"""One kernel server per test process (`workbench.report.kernel_server`): the diagnoses the slow tests run, in
the worker or in a CLI subprocess, get kernels forked from it instead of kernels that import the stack again (~4.7 s
of CPU each), and so do the torchrun ranks they launch (a full run: 24 kernels, 20 ranks, the census' 2 workers). A kernel asked for in an environment the server cannot honour (a test
that sets an HF_HOME of its own, say) starts as usual; so does every kernel asked for before the server has imported.
The server's log (what it forked, what it refused and why) is kept beside its socket while the session runs;
`WORKBENCH_TEST_KERNEL_SERVER_LOG=DIR` keeps each worker's in DIR."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from workbench.report.kernel_server import SERVER_ENV

_server: dict = {}


def start() -> None:
    """`WORKBENCH_TEST_KERNEL_SERVER=0 make test` runs the suite without one (every kernel and rank started as
    usual)."""
    if os.environ.get("WORKBENCH_TEST_KERNEL_SERVER") == "0":
        return
    folder = tempfile.mkdtemp(prefix="workbench-kernels-")
    path = os.path.join(folder, "server.sock")
    os.environ[SERVER_ENV] = path
    log = open(os.path.join(folder, "server.log"), "wb")  # noqa: SIM115 - closed in stop()
    process = subprocess.Popen([sys.executable, "-m", "workbench.report.kernel_server", path],
                               stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    _server.update(process=process, folder=folder, log=log, env=dict(os.environ))


def stop() -> None:
    if not _server:
        return
    process = _server["process"]
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    _server["log"].close()
    os.environ.pop(SERVER_ENV, None)
    keep = os.environ.get("WORKBENCH_TEST_KERNEL_SERVER_LOG")  # a folder: each worker's server log kept there
    if keep:
        os.makedirs(keep, exist_ok=True)
        shutil.copy(os.path.join(_server["folder"], "server.log"), os.path.join(keep, f"server-{os.getpid()}.log"))
    shutil.rmtree(_server["folder"], ignore_errors=True)
    _server.clear()


def running():
    """This worker's server: its process, with `socket` (its path, bound once the server's imports are done) and `log`
    (its log file) set on it; None where the session runs without one."""
    if not _server:
        return None
    process = _server["process"]
    process.socket = _server["env"][SERVER_ENV]
    process.log = Path(_server["folder"]) / "server.log"
    return process


def wait_for_socket(process, path: str, timeout: float = 120.0) -> None:
    """Until a server's socket is bound (once its imports are done: a kernel asked for before then starts as usual),
    failing with the end of its log if it stops or `timeout` seconds pass first."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        assert process.poll() is None and time.monotonic() < deadline, process.log.read_text()[-2000:]
        time.sleep(0.1)


def server_children(since: float, wait: float = 10.0) -> list:
    """This worker's server's children started at `since` (a time.time()) or later and still running after
    `wait` seconds: a launch that is over leaves none of its ranks. [] where no server runs."""
    import psutil

    if not _server:
        return []
    children = [p for p in psutil.Process(_server["process"].pid).children() if p.create_time() >= since - 1]
    _, alive = psutil.wait_procs(children, timeout=wait)
    return [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]


def would_fork(env: dict[str, str]) -> bool:
    """Whether this worker's server forks a process asked for in `env` (it serves the worker's environment as it
    was when the server started, with the settings `quiet_and_offline` makes, which the test workers have)."""
    from workbench.report.kernel_server import refusal

    return bool(_server) and refusal(env, _server["env"], imported=()) is None


# A server that stops before the session's end leaves a slower run, not a wrong one: every kernel and rank after it
# starts with its imports (a client gone before its answer once stopped one at 227 s of a 300 s run). The session
# says so at its end, from each worker (its `workeroutput`) or from the one process.
_STOPPED_KEY = "workbench_kernel_server_stopped"


def stopped_early() -> str | None:
    """A line naming this process' server if it is no longer running, with the end of its log; else None."""
    if not _server or _server["process"].poll() is None:
        return None
    _server["log"].flush()
    tail = (Path(_server["folder"]) / "server.log").read_text(errors="replace").strip().splitlines()[-3:]
    return (f"test process {os.getpid()}: its kernel server stopped (exit {_server['process'].returncode}) before "
            f"the session's end; later kernels and ranks started with their imports. Its log ends: "
            f"{' | '.join(tail) or '(empty)'}")


def pytest_sessionfinish(session, exitstatus):
    line = stopped_early()
    output = getattr(session.config, "workeroutput", None)
    if output is not None:
        output[_STOPPED_KEY] = line
    elif line:
        session.config.__dict__.setdefault(_STOPPED_KEY, []).append(line)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    line = (getattr(node, "workeroutput", None) or {}).get(_STOPPED_KEY)
    if line:
        node.config.__dict__.setdefault(_STOPPED_KEY, []).append(line)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    lines = config.__dict__.get(_STOPPED_KEY)
    if lines:
        terminalreporter.section("kernel server", sep="=", yellow=True)
        for line in lines:
            terminalreporter.write_line(line)
