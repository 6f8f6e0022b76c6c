"""What the CPU's allocator makes of a step's tensors: glibc malloc, replayed on the step's allocation trace.

A CPU process's resident memory is not its live tensors. glibc (2.26 onwards, `malloc/malloc.c`) serves a request
at or above the mmap threshold with its own mmap, returned to the kernel on free; smaller ones come from the heap,
whose freed chunks stay resident (only a free top chunk larger than the trim threshold is given back). The
threshold starts at 128 KiB and is dynamic: freeing an mmapped chunk larger than it (up to 32 MiB on 64-bit,
`DEFAULT_MMAP_THRESHOLD_MAX`) raises it to that chunk's size and the trim threshold to twice that. A training step
frees mmapped activations of a few MiB early on, so later activations of that size land in the heap and its freed
space is kept: measured here, a LoRA step of a 90M Qwen2 at 8 × 512 reached 4.09 GiB of RSS above its weights for
2.71 GiB of live tensors; with `MALLOC_MMAP_THRESHOLD_` fixed at 128 KiB, 2.74 GiB. `glibc_peak` replays the trace
through that policy (best fit among free heap chunks before any mmap, coalescing, the top chunk extended and
trimmed) and returns the resident peak.

`GlibcHeap(...).malloc(key, n, aligned=True)` serves a request as glibc 2.36's `_int_memalign` serves torch's
`posix_memalign(64, n)` (c10/core/impl/alloc_cpu.cpp): a chunk of n + 64 + MINSIZE found or carved, its misaligned
head and spare tail freed again. The plan replays plain mallocs: on the tensors alone the padding changes nothing,
it needs the small chunks beside them that the tracker cannot see (bench/glibc_trace.py, docs/plan.md).

    peak = glibc_peak(tracker.trace)      # bytes of RSS above the weights at the step's peak
"""

from __future__ import annotations

import bisect

MMAP_THRESHOLD = 128 * 1024  # DEFAULT_MMAP_THRESHOLD_MIN
MMAP_THRESHOLD_MAX = 32 * 1024 * 1024  # 4 * 1024 * 1024 * sizeof(long)
TOP_PAD = 128 * 1024  # DEFAULT_TOP_PAD
PAGE = 4096
ALIGN = 16
HEADER = 8  # SIZE_SZ: the chunk's size field
MIN_CHUNK = 32  # MINSIZE
TENSOR_ALIGNMENT = 64  # c10's gAlignment


def _chunk(n: int) -> int:
    return max(MIN_CHUNK, (n + HEADER + ALIGN - 1) // ALIGN * ALIGN)


class GlibcHeap:
    """glibc's main arena: free chunks indexed by address (coalescing) and by (size, address) (best fit)."""

    def __init__(self) -> None:
        self.threshold = MMAP_THRESHOLD
        self.trim = 2 * MMAP_THRESHOLD
        self.top = 0  # the heap's end (brk) beyond the weights
        self.free_starts: list[int] = []  # free heap chunks, sorted by address
        self.free_sizes: dict[int, int] = {}
        self.by_size: list[tuple[int, int]] = []  # the same chunks as (size, address), sorted
        self.mmapped = 0
        self.live: dict[int, tuple[str, int, int]] = {}  # key -> (kind, address or 0, size)
        self.peak = 0

    @property
    def resident(self) -> int:
        return self.top + self.mmapped

    def malloc(self, key: int, n: int, aligned: bool = False) -> None:
        """A request of n bytes: the best-fitting free chunk, else at or above the mmap threshold its own mapping,
        else the top chunk (extended as needed); the spare tail freed. `aligned`: as `_int_memalign` serves it
        (module docstring)."""
        if n <= 0:
            return
        nb = _chunk(n)
        need = nb + TENSOR_ALIGNMENT + MIN_CHUNK if aligned else nb
        taken = self._best_fit(need)
        if taken is None and need >= self.threshold:
            size = (need + HEADER + PAGE - 1) // PAGE * PAGE
            self.mmapped += size
            self.live[key] = ("mmap", 0, size)
            self.peak = max(self.peak, self.resident)
            return
        start, have = taken or self._from_top(need)
        if aligned and (start + 2 * HEADER) % TENSOR_ALIGNMENT:  # the user pointer (chunk + 16) aligned
            at = (start + 2 * HEADER + TENSOR_ALIGNMENT - 1) // TENSOR_ALIGNMENT * TENSOR_ALIGNMENT - 2 * HEADER
            at += TENSOR_ALIGNMENT if at - start < MIN_CHUNK else 0
            self._insert(start, at - start)
            start, have = at, have - (at - start)
        if have > nb + MIN_CHUNK:
            self._insert(start + nb, have - nb)
            have = nb
        self.live[key] = ("heap", start, have)
        self.peak = max(self.peak, self.resident)

    def _best_fit(self, size: int) -> tuple[int, int] | None:
        """(address, size) of the smallest free chunk of at least `size` (the lowest address among equals), taken."""
        i = bisect.bisect_left(self.by_size, (size, -1))
        if i == len(self.by_size):
            return None
        have, start = self.by_size[i]
        self._take(start)
        return start, have

    def _from_top(self, size: int) -> tuple[int, int]:
        """(address, size) carved from the top chunk: the free chunk that ends at the heap's end, the heap extended
        (brk) by what it lacks."""
        start = self.top
        if self.free_starts and self.free_starts[-1] + self.free_sizes[self.free_starts[-1]] == self.top:
            start = self.free_starts[-1]
            self._take(start)
        self.top = max(self.top, start + size)
        return start, size

    def _take(self, start: int) -> int:
        size = self.free_sizes.pop(start)
        del self.free_starts[bisect.bisect_left(self.free_starts, start)]
        del self.by_size[bisect.bisect_left(self.by_size, (size, start))]
        return size

    def _insert(self, start: int, size: int) -> None:
        if size <= 0:
            return
        i = bisect.bisect_left(self.free_starts, start)
        if i > 0 and self.free_starts[i - 1] + self.free_sizes[self.free_starts[i - 1]] == start:  # merge before
            before = self.free_starts[i - 1]
            start, size = before, size + self._take(before)
        if start + size in self.free_sizes:  # and after
            size += self._take(start + size)
        if start + size == self.top and size > self.trim:  # the top chunk, trimmed to TOP_PAD
            self.top = start + min(size, TOP_PAD)
            size = self.top - start
        bisect.insort(self.free_starts, start)
        self.free_sizes[start] = size
        bisect.insort(self.by_size, (size, start))

    def free(self, key: int) -> None:
        kind, address, size = self.live.pop(key, ("none", 0, 0))
        if kind == "mmap":
            self.mmapped -= size
            if self.threshold < size <= MMAP_THRESHOLD_MAX:
                self.threshold = size
                self.trim = 2 * size
        elif kind == "heap":
            self._insert(address, size)


def glibc_peak(trace: list[tuple[int, int]]) -> int:
    """The resident peak (bytes) of the trace's allocations under glibc's policy (module docstring)."""
    heap = GlibcHeap()
    for size, key in trace:
        if size >= 0:
            heap.malloc(key, size)
        else:
            heap.free(key)
    return heap.peak
