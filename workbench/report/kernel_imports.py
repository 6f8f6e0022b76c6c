"""What every workbench kernel imports first (`kernels.Kernel`'s warm-up, `kernel_server`'s one import)."""

# sent the moment a kernel starts, before papermill connects: the stack's imports (~4 s on 2 cores) then overlap the
# runner's own start-up (papermill, nbconvert) instead of following it. gc.freeze() then moves what the imports
# created (it lives as long as the kernel) out of the cyclic collector's reach: each gc.collect() the probes run
# when they free a model scans the objects made since, 0.08 s instead of 0.26 s on a tiny checkpoint
WARM_UP = ("import torch, transformers, pandas, workbench.notebook\nfrom transformers import AutoConfig, PreTrainedModel\n"
           "import gc\ngc.freeze()")
