"""`make lab`: JupyterLab on the project's kernel, with the panel and the notebooks open, on a loopback port.

    python -m workbench lab            # prints the URL (with its token) and serves until Ctrl-C

A workspace naming the panel and the numbered notebooks is imported first, so the browser opens on them all; the
token is generated per start and only printed to the terminal. `lab_server()` is the same start as a context
manager, used by the browser test.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Iterator

from workbench.distributed.launcher import free_port
from workbench.errors import UsageError
from workbench.paths import NOTEBOOK_DIR
from workbench.report.kernel_server import SERVER_ENV

WORKSPACE = "workbench"
PANEL_NOTEBOOK = "panel.ipynb"


def workspace(notebook_dir: Path) -> dict:
    """A JupyterLab workspace with the panel first and the numbered notebooks beside it, the panel in front."""
    from workbench.catalog import SWEEP_NOTEBOOK

    names = [PANEL_NOTEBOOK] * (notebook_dir / PANEL_NOTEBOOK).exists() + sorted(
        p.name for p in notebook_dir.glob("[0-9][0-9]_*.ipynb") if p.stem != SWEEP_NOTEBOOK)
    data = {f"notebook:{n}": {"data": {"path": n, "factory": "Notebook"}} for n in names}
    data["layout-restorer:data"] = {"main": {"dock": {"type": "tab-area", "currentIndex": 0,
                                                      "widgets": [f"notebook:{n}" for n in names]},
                                             "current": f"notebook:{names[0]}" if names else None}}
    return {"data": data, "metadata": {"id": WORKSPACE}}


@dataclasses.dataclass
class LabServer:
    url: str  # the workspace URL with its token
    base: str
    token: str
    process: subprocess.Popen

    def notebook_url(self, name: str) -> str:
        return f"{self.base}/lab/tree/{name}?token={self.token}"


def _wait_ready(base: str, token: str, process: subprocess.Popen, timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            last = [line for line in log.read_text(errors="replace").splitlines() if line.strip()][-1:]
            raise UsageError(f"JupyterLab exited with code {process.returncode} before serving"
                             + (f": {last[0].strip()}" if last else "") + f" (log: {log})")
        try:
            with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise UsageError(f"JupyterLab did not answer on {base} within {timeout:.0f} s")


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@contextlib.contextmanager
def lab_server(notebook_dir: Path = NOTEBOOK_DIR, *, port: int | None = None, state_dir: Path | None = None,
               timeout: float = 120, quiet: bool = True, env: dict[str, str] | None = None) -> Iterator[LabServer]:
    """Start JupyterLab on 127.0.0.1 with a fresh token, the workspace imported; stop it (and its kernels) on exit."""
    import tempfile

    port = port or free_port("127.0.0.1")  # the OS picks it: two servers at once do not collide
    token = secrets.token_hex(16)
    state = Path(state_dir or tempfile.mkdtemp(prefix="workbench-lab-"))
    workspaces = state / "workspaces"
    workspaces.mkdir(parents=True, exist_ok=True)
    from jupyterlab_server.workspaces_handler import WorkspacesManager

    WorkspacesManager(str(workspaces)).save(WORKSPACE, json.dumps(workspace(notebook_dir)))
    # offline tool: no news or update checks, and no pop-up asking about them
    notification = state / "user-settings" / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    notification.parent.mkdir(parents=True, exist_ok=True)
    notification.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    base = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ServerApp.ip=127.0.0.1",
               f"--ServerApp.port={port}", "--ServerApp.port_retries=0", f"--ServerApp.root_dir={notebook_dir}",
               f"--IdentityProvider.token={token}", f"--LabApp.workspaces_dir={workspaces}",
               f"--LabApp.default_url=/lab/workspaces/{WORKSPACE}",
               "--LabApp.news_url=None", f"--LabApp.user_settings_dir={state / 'user-settings'}"]
    command += ["--allow-root"] * (os.geteuid() == 0)
    env = {**os.environ, **(env or {}), "JUPYTER_RUNTIME_DIR": str(state / "runtime")}
    if env.get(SERVER_ENV):  # beside a kernel server: its kernels forked from it, the stack imported
        command.append("--ServerApp.kernel_spec_manager_class=workbench.report.served_specs.ServedKernelSpecManager")
    log = state / "jupyterlab.log"
    with open(log, "ab") as out:  # the server's own log: shown when it fails to start
        process = subprocess.Popen(command, stdout=out if quiet else None, stderr=out if quiet else None, env=env,
                                   start_new_session=True)
    try:
        _wait_ready(base, token, process, timeout, log)
        yield LabServer(f"{base}/lab/workspaces/{WORKSPACE}?token={token}", base, token, process)
    finally:
        _stop(process)


def serve(port: int | None = None) -> int:
    """`python -m workbench lab`: start, print the URL, serve until Ctrl-C."""
    with lab_server(port=port, quiet=True) as lab:
        print(f"JupyterLab is running with the workbench panel and notebooks open:\n\n    {lab.url}\n\n"
              f"Open the URL in a browser (on a remote machine: ssh -L {lab.base.rsplit(':', 1)[1]}:127.0.0.1:"
              f"{lab.base.rsplit(':', 1)[1]} HOST). Press Ctrl-C to stop.", flush=True)
        try:
            lab.process.wait()
        except KeyboardInterrupt:
            print("stopping JupyterLab")
    return 0
