"""One local Hub per test process (tests/hub/hub_server.py), started before its kernel server (tests/served_kernels.py).

huggingface_hub reads HF_ENDPOINT, HF_HOME and its timeouts once, when it is imported, so the kernel server refuses to
fork a kernel for a diagnosis whose environment names another Hub or cache: that kernel imports the stack again
(~6 s of CPU). With this process' Hub and cache in the environment the server imports under, the Hub tests' diagnoses
(`tests/hub/conftest.py`'s `run_workbench`) run in forked kernels: each test gives the worker's Hub its repos
(`serving`) and starts from an empty cache (`fresh_home`). The suite stays offline (HF_HUB_OFFLINE=1) everywhere
else, so no other test reaches this Hub; without a kernel server (the fast tier), the Hub tests start a Hub and a
cache of their own.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tests.hub.hub_server import HubServer

# what tests/hub/conftest.py's run_workbench gives each command: the seconds huggingface_hub waits for a response
TIMEOUTS = {"HF_HUB_ETAG_TIMEOUT": "5", "HF_HUB_DOWNLOAD_TIMEOUT": "5"}
_hub: dict = {}


def start() -> None:
    """Start this process' Hub and name it, its cache and the timeouts in the environment."""
    folder = Path(tempfile.mkdtemp(prefix="workbench-hub-"))
    server = HubServer({}).__enter__()
    variables = {"HF_ENDPOINT": server.endpoint, "HF_HOME": str(folder / "home" / "hf"), **TIMEOUTS}
    _hub.update(server=server, folder=folder, before={k: os.environ.get(k) for k in variables})
    os.environ.update(variables)


def stop() -> None:
    """Stop the Hub, remove its cache and give the variables back their values from before `start`."""
    if not _hub:
        return
    _hub["server"].__exit__(None, None, None)
    shutil.rmtree(_hub["folder"], ignore_errors=True)
    for name, value in _hub["before"].items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    _hub.clear()


@contextlib.contextmanager
def serving(repos: dict[str, Path]) -> Iterator[HubServer]:
    """This process' Hub serving `repos` (its byte counts from zero), or a Hub of the block's own where none runs."""
    if not _hub:
        with HubServer(repos) as own:
            yield own
        return
    server = _hub["server"]
    server.serve(repos)
    try:
        yield server
    finally:
        server.serve({})


def fresh_home() -> Path | None:
    """The home whose `hf` folder is this process' HF_HOME, emptied for the test that asks; None where no Hub runs."""
    if not _hub:
        return None
    home = _hub["folder"] / "home"
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir()
    return home
