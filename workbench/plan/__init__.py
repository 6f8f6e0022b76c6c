"""`workbench plan`: will a training run fit, before it is queued? One real training step of the user's model code —
the real PEFT wrap, optimizer, gradient checkpointing and loss — on fake tensors at full size (no weight is read),
its memory tracked by torch's own MemTracker; what fake tensors cannot see (bitsandbytes storage, the CUDA context
and allocator, kernels that differ by device) added as cited data, each on its own line."""
