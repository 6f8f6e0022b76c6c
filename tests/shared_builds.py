"""What the pytest-xdist workers of one test session build once and share: the first worker to ask builds under a
file lock in the session's common temporary folder, the others find what it wrote (session fixtures are per
worker; a demo, a family checkpoint or the planted Trainer runs built twice cost seconds each)."""

from __future__ import annotations

import contextlib
from pathlib import Path

from workbench.demo.build import DemoPaths, build_demo


def shared_root(tmp_path_factory) -> Path:
    """The session's temporary folder common to the pytest-xdist workers (each worker's own is popen-gwN in it)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if base.name.startswith("popen-gw") else base


@contextlib.contextmanager
def built_once(tmp_path_factory, name: str):
    """Within the block, this session's workers build `name` one at a time (a file lock in the shared folder): the
    first builds it, the others find what it wrote. Yields the folder to build in or read from."""
    from filelock import FileLock

    root = shared_root(tmp_path_factory)
    with FileLock(str(root / f"{name}.lock")):
        yield root / name


def shared_demo(tmp_path_factory) -> DemoPaths:
    """The bundled demo, built once per test session for every worker (`build_demo` reuses a stamped build)."""
    with built_once(tmp_path_factory, "cache") as cache:
        return build_demo(cache / "demo")
