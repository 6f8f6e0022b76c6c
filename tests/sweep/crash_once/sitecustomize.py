"""Imported at start-up by every Python process with this folder on PYTHONPATH — the Ray test's sweep and, through
the sweep's worker environment, its Ray workers. With WORKBENCH_CRASH_ONCE naming a marker file, the first task of
the member WORKBENCH_CRASH_MEMBER names (of any member where it is unset) to start in a Ray worker kills that
worker's process (`os._exit`): a worker lost mid-task, exactly once, whatever the timing, so that the sweep's own
retry is what the test sees. The driver, the local engine and the kernels are left alone (the check is Ray's own:
a task runs in a process of WORKER_MODE)."""

import importlib.abc
import importlib.util
import os
import sys

MARKER = os.environ.get("WORKBENCH_CRASH_ONCE")
MEMBER = os.environ.get("WORKBENCH_CRASH_MEMBER")
PATCHED = "workbench.sweep.ray_engine"  # whose `diagnose_member` a member's Ray task calls


def _in_ray_worker() -> bool:
    from ray._private import worker

    return worker.global_worker.mode == worker.WORKER_MODE


def _crashing_first(original):
    def diagnose_member(member, *args, **kwargs):
        if _in_ray_worker() and MEMBER in (None, member.name):
            try:
                os.close(os.open(MARKER, os.O_CREAT | os.O_EXCL))  # atomic: one worker wins, even side by side
            except FileExistsError:
                pass
            else:
                os._exit(1)
        return original(member, *args, **kwargs)

    return diagnose_member


class _PatchOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != PATCHED:
            return None
        sys.meta_path.remove(self)  # the real spec, found by the finders after this one
        spec = importlib.util.find_spec(name)
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            module.diagnose_member = _crashing_first(module.diagnose_member)

        spec.loader.exec_module = exec_module
        return spec


def _run_the_sitecustomize_this_one_shadows() -> None:
    """Python imports one sitecustomize, the first on sys.path: this folder's hides the next one
    (tests/quick_site's, which the test's Ray workers carry after it). That one runs as Python would have run
    it."""
    import importlib.machinery

    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.machinery.PathFinder.find_spec(
        "sitecustomize", [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != here])
    if spec is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


if MARKER:
    sys.meta_path.insert(0, _PatchOnImport())
_run_the_sitecustomize_this_one_shadows()
