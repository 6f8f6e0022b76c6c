"""What every workbench kernel imports first (`kernels.Kernel`'s warm-up, `kernel_server`'s one import)."""

from __future__ import annotations

import os

# sent the moment a kernel starts, before papermill connects: the stack's imports (~4 s on 2 cores) then overlap the
# runner's own start-up (papermill, nbconvert) instead of following it. gc.freeze() then moves what the imports
# created (it lives as long as the kernel) out of the cyclic collector's reach: each gc.collect() the probes run
# when they free a model scans the objects made since, 0.08 s instead of 0.26 s on a tiny checkpoint
WARM_UP = ("import torch, transformers, pandas, workbench.notebook\nfrom transformers import AutoConfig, PreTrainedModel\n"
           "__import__('workbench.report.kernel_imports', fromlist=['_']).import_the_training_stack_if_planned()\n"
           "import gc\ngc.freeze()")


def import_the_training_stack() -> None:
    """peft (which imports bitsandbytes) and the Trainer (which imports datasets): what notebooks 01, 02, 03 and 09
    import as they run, about 170,000 objects. Imported before the warm-up's freeze, they are out of every later
    collection's scan: a diagnosis runs several full ones (the Trainer's `accelerator.free_memory()` runs one per
    `train()`, five in notebook 09's loss_accumulation alone), 0.1 s each on this project's machine otherwise."""
    import peft  # noqa: F401
    import transformers.trainer  # noqa: F401


def import_the_training_stack_if_planned(notebooks: str | None = None) -> None:
    """`import_the_training_stack` where the diagnosis prepares the model (a notebook of `notebooks`, default the
    kernel's WORKBENCH_NOTEBOOKS, runs the set-up's `prepared` step): a diagnosis of the saved files or the data alone
    does not pay for it."""
    from workbench.model.prefetch import loads_the_model
    from workbench.model.shared import NOTEBOOKS_ENV

    planned = os.environ.get(NOTEBOOKS_ENV, "") if notebooks is None else notebooks
    if loads_the_model([name for name in planned.split(",") if name]):
        import_the_training_stack()
