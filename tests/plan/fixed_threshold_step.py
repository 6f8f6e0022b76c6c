"""`python -m workbench.plan.real_step ARGS` with glibc's mmap threshold fixed at 128 KiB, for a process forked from a
kernel server (tests/served_kernels.py), where a MALLOC_* variable comes too late: glibc reads those as a process
starts, and the server would refuse the environment. `mallopt(M_MMAP_THRESHOLD, 131072)` is what
`MALLOC_MMAP_THRESHOLD_=131072` makes at start: glibc's tunable for that variable calls the same
`do_set_mmap_threshold`, which sets the threshold and turns its dynamic growth off (glibc 2.26+ malloc/malloc.c,
malloc/arena.c)."""

from __future__ import annotations

import ctypes
import sys

M_MMAP_THRESHOLD = -3  # glibc malloc.h
FIXED_THRESHOLD = 131072

if __name__ == "__main__":
    if ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, FIXED_THRESHOLD) != 1:
        sys.exit("mallopt(M_MMAP_THRESHOLD) refused: not glibc's malloc")
    from workbench.plan.real_step import main

    sys.exit(main())
