"""What every workbench kernel imports first (`kernels.Kernel`'s warm-up, `kernel_server`'s one import)."""

from __future__ import annotations

import os

# sent the moment a kernel starts, before papermill connects: the stack's imports (~4 s on 2 cores) then overlap the
# runner's own start-up (papermill, nbconvert) instead of following it. The cyclic collector is off while they run:
# each collection it would start scans every object the imports made so far, ~0.9 s of ~5 s on this project's machine
# (the cycles the imports leave, ~8 MB, stay: a collection to free them costs 0.5 s). gc.freeze() then moves what the
# imports created (it lives as long as the kernel) out of the collector's reach: each gc.collect() the probes run when
# they free a model scans the objects made since, 0.08 s instead of 0.26 s on a tiny checkpoint. Frozen before the
# collector is on again: on first, the next allocation would start a collection of every object made while it was
# off. `finally`: an import that fails (it fails again, visibly, in the first notebook) leaves the collector on
WARM_UP = ("import gc\ngc.disable()\ntry:\n"
           "    import torch, transformers, pandas, workbench.notebook\n"
           "    from transformers import AutoConfig, PreTrainedModel\n"
           "    __import__('workbench.report.kernel_imports', fromlist=['_']).import_the_training_stack_if_planned()\n"
           "finally:\n    gc.freeze()\n    gc.enable()")


# the notebooks that import the training stack as they run, measured on a plain checkpoint (`python -c` running one
# notebook's steps after the warm-up, then reading sys.modules): 01's 4-bit census builds its skeleton through
# transformers' bitsandbytes quantizer (peft, bitsandbytes); 02, 03 and 09 build Trainers (both). 00, 04, 05, 06, 07
# and 10 import neither; an adapter's set-up imports peft wherever it prepares the model.
TRAINING_STACK_NOTEBOOKS = ("01_dtype_distribution", "02_dataparallel", "03_peft_attributes", "09_training_step")


def import_the_training_stack() -> None:
    """peft (which imports bitsandbytes) and the Trainer (which imports datasets): about 170,000 objects. Imported
    before the warm-up's freeze, they are out of every later collection's scan: a diagnosis runs several full ones
    (the Trainer's `accelerator.free_memory()` runs one per `train()`, five in notebook 09's loss_accumulation
    alone), 0.1 s each on this project's machine otherwise."""
    import peft  # noqa: F401
    import transformers.trainer  # noqa: F401


def import_the_training_stack_if_planned(notebooks: str | None = None) -> None:
    """`import_the_training_stack` where the diagnosis runs a notebook that imports it anyway
    (`TRAINING_STACK_NOTEBOOKS`; `notebooks`: comma-separated names, default the kernel's WORKBENCH_NOTEBOOKS): a
    diagnosis of the saved files, the data or the forward checks alone does not pay for it."""
    from workbench.model.shared import NOTEBOOKS_ENV

    planned = os.environ.get(NOTEBOOKS_ENV, "") if notebooks is None else notebooks
    if set(planned.split(",")) & set(TRAINING_STACK_NOTEBOOKS):
        import_the_training_stack()
