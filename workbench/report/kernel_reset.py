"""Run in a kernel kept across diagnoses (a sweep's members in series): what a fresh kernel would not carry over
from the previous diagnosis, undone before the next one begins.

    forget_the_namespace()                                                       # a cell of its own, then
    begin_next_diagnosis(["00_saved_files", "08_training_run"], "recipe:load")   # -> False: start a fresh kernel

- the notebooks' variables, IPython's output cache and history references (`InteractiveShell.reset`, as
  `%reset -f` does: a notebook's `prepared` would otherwise keep the previous member's model resident while the next
  one loads);
- the shared prepared model, the results computed ahead of it and the record of own-copy steps
  (`workbench.model.shared.reset`), and the record of full model loads (`workbench.model.loading.LOADS`), which each
  notebook's cost block counts;
- the notebooks the diagnosis runs (`WORKBENCH_NOTEBOOKS`, which `prepare_shared` reads);
- a user's set-up module (`--setup module:function`), imported again by the next diagnosis as a fresh kernel would
  (a module that keeps the model it loaded in a global would otherwise hand the previous member's model on);
- the random generators, seeded afresh from the system as a new process seeds them;
- the process' peak memory (`workbench.peak_memory`): where it cannot be reset, the answer is False and the caller
  starts a fresh kernel, so that no report states another diagnosis' peak as its own.

What the stack's imports made (modules, `gc.freeze`'d objects, caches of library tables) is the same for every
diagnosis and stays: that is the start-up the kept kernel saves.
"""

from __future__ import annotations

import os
import random
import sys


def forget_the_namespace() -> None:
    """Clear the kernel's user namespace and output cache (IPython's `reset`, keeping the history session); the
    modules stay imported."""
    from IPython import get_ipython

    shell = get_ipython()
    if shell is not None:
        shell.reset(new_session=False)


def begin_next_diagnosis(notebooks: list[str], setup: str) -> bool:
    """Make this kernel as a fresh one for the next diagnosis (module docstring); False when its peak memory
    cannot be reset."""
    from workbench.model import shared
    from workbench.model.loading import LOADS
    from workbench.peak_memory import reset_peak_rss

    shared.reset()
    LOADS.clear()
    os.environ[shared.NOTEBOOKS_ENV] = ",".join(notebooks)
    _forget_user_module(setup)
    random.seed()
    if "torch" in sys.modules:
        sys.modules["torch"].seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    return reset_peak_rss()


def _forget_user_module(setup: str) -> None:
    """Drop a `module:function` set-up's module (and its submodules) from sys.modules when it is the user's own code:
    not the workbench's, not an installed package's (their classes must stay the ones already imported)."""
    from pathlib import Path

    name = setup.partition(":")[0] if ":" in setup else ""
    module = sys.modules.get(name)
    path = str(getattr(module, "__file__", None) or "")
    installed = (sys.prefix, sys.base_prefix, str(Path(__file__).resolve().parents[1]))
    if not path or path.startswith(installed):
        return
    for loaded in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[loaded]
