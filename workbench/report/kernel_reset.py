"""Run in a kernel kept across diagnoses (a sweep's members in series): what a fresh kernel would not carry over
from the previous diagnosis, undone before the next one begins.

    import workbench.report.kernel_reset                                         # as the first diagnosis begins
    forget_the_namespace()                                                       # a cell of its own, then
    begin_next_diagnosis(["00_saved_files", "08_training_run"], "recipe:load")   # -> False: start a fresh kernel

- the notebooks' variables, IPython's output cache, history references and execution count (`InteractiveShell.reset`
  with a new session, as a fresh kernel numbers its cells), and the last error's traceback (`sys.last_*`,
  IPython's `InteractiveTB.tb`): their frames would otherwise keep the previous member's model resident while the
  next one loads;
- the shared prepared model, the results computed ahead of it and the record of own-copy steps
  (`workbench.model.shared.reset`), and the record of full model loads (`workbench.model.loading.LOADS`), which each
  notebook's cost block counts;
- the environment: every variable as it was when this module was first imported (before the first diagnosis'
  notebooks ran: an accelerate plugin sets `FSDP_*` variables a later notebook's torchrun ranks would inherit),
  and the notebooks the next diagnosis runs (`WORKBENCH_NOTEBOOKS`, which `prepare_shared` reads);
- a user's set-up module (`--setup module:function`), imported again by the next diagnosis as a fresh kernel would
  (a module that keeps the model it loaded in a global would otherwise hand the previous member's model on);
- the random generators, seeded afresh from the system as a new process seeds them;
- the memory glibc keeps after the previous model was freed (`malloc_trim`), so that memory checks read what a fresh
  kernel would, and the process' peak memory (`workbench.peak_memory`): where that cannot be reset, the answer is
  False and the caller starts a fresh kernel, so that no report states another diagnosis' peak as its own;
- on a GPU, where the kernel made a CUDA context: the caching allocator's free blocks and each device's peak
  statistics (`torch.cuda.empty_cache`, `reset_peak_memory_stats`), as a fresh kernel has them.

`release_the_model()` gives the previous diagnosis' model and memory back early, for a kept kernel that waits idle
between diagnoses while its machine's memory is given to others (a Ray worker between tasks).

What the stack's imports made (modules, `gc.freeze`'d objects, caches of library tables) is the same for every
diagnosis and stays: that is the start-up the kept kernel saves.
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

STARTING_ENVIRONMENT = dict(os.environ)  # the kernel's own, taken before the first diagnosis' notebooks run


def forget_the_namespace() -> None:
    """Clear the kernel's user namespace, output cache and execution count (IPython's `reset` with a new history
    session) and the last error's traceback; the modules stay imported."""
    from IPython import get_ipython

    for name in ("last_type", "last_value", "last_traceback", "last_exc"):
        if hasattr(sys, name):
            setattr(sys, name, None)
    shell = get_ipython()
    if shell is not None:
        if getattr(shell, "InteractiveTB", None) is not None:
            shell.InteractiveTB.tb = None
        shell.reset(new_session=True)


def begin_next_diagnosis(notebooks: list[str], setup: str) -> bool:
    """Make this kernel as a fresh one for the next diagnosis (module docstring); False when its peak memory
    cannot be reset."""
    from workbench.model import shared
    from workbench.model.loading import LOADS
    from workbench.peak_memory import reset_peak_rss
    from workbench.runtime import restore_environment

    LOADS.clear()
    restore_environment({**STARTING_ENVIRONMENT, shared.NOTEBOOKS_ENV: ",".join(notebooks)})
    _forget_user_module(setup)
    random.seed()
    if "torch" in sys.modules:
        sys.modules["torch"].seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    _free_the_model()
    return reset_peak_rss()


def _forget_user_module(setup: str) -> None:
    """Drop a `module:function` set-up's module (and its submodules) from sys.modules when it is the user's own code:
    not the workbench's, not an installed package's (their classes must stay the ones already imported)."""
    name = setup.partition(":")[0] if ":" in setup else ""
    module = sys.modules.get(name)
    path = getattr(module, "__file__", None)
    if not path:
        return
    where = Path(path).resolve()
    installed = {Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve(), Path(__file__).resolve().parents[1]}
    if any(where.is_relative_to(folder) for folder in installed):
        return
    for loaded in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[loaded]


def release_the_model() -> None:
    """Between two diagnoses of a kept kernel that may wait idle (a Ray worker between tasks): the namespace, the
    shared model and the memory they held given back now, not when the next diagnosis begins."""
    forget_the_namespace()
    _free_the_model()


def _free_the_model() -> None:
    """The shared model and what was computed ahead of it dropped, the heap's and CUDA's freed memory given back."""
    from workbench.model import shared

    shared.reset()
    _give_back_freed_memory()
    _reset_cuda_memory()


def _reset_cuda_memory() -> None:
    """Where this kernel has made a CUDA context: the caching allocator's free blocks given back (every device, one
    call) and each device's peak statistics reset, without switching devices (`torch.cuda.device` would make a
    context on a GPU the kernel never used), so that a reader of `torch.cuda.max_memory_allocated` sees what a fresh
    kernel would. eval.memory resets its own peaks before it measures: this is for every other reader."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return
    torch.cuda.empty_cache()
    for device in range(torch.cuda.device_count()):
        torch.cuda.reset_peak_memory_stats(device)


def _give_back_freed_memory() -> None:
    """glibc's `malloc_trim(0)`: the heap's free pages returned to the system (no-op elsewhere)."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
