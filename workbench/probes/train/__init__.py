"""Notebook 09: the training step as configured (accumulation, fp16, DDP with checkpointing, FSDP units)."""
