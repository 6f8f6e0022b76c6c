"""`make bench` rows of what glibc keeps resident in a CPU training step (bench/run.py --only-glibc-trace): the real
process' every allocation, recorded by heaptrack, replayed through glibc's policy four ways.

Why: `workbench plan --device cpu` replays glibc's policy (`workbench/plan/cpu_allocator.py`) on the tensors its
tracker sees, and stays 12-37 % under the resident memory of a default-glibc process (bench/RESULTS.md, the plan
section). This measures which part of glibc's behaviour the tracker's trace cannot carry. The step is the plan
bench's LoRA r16, batch 8 × 512 of a 90M Qwen2 (`workbench.plan.real_step`, a real `transformers.Trainer`), run under
`heaptrack --raw` (every malloc, free and posix_memalign with its pointer; the RSS sampled), and its trace replayed:

- the big allocations only (>= 64 KiB: what the plan's tracker sees, every tensor storage), plain malloc, and
  through `_int_memalign` (below);
- every allocation, the small ones too (TensorImpl, autograd nodes, Python's objects above 512 bytes), plain malloc;
- every allocation, each tensor-sized one (>= 4 KiB) served as glibc 2.36's `_int_memalign` serves torch's
  `posix_memalign(64, n)` (c10/core/impl/alloc_cpu.cpp): a chunk of n + 64 + MINSIZE found or carved, its misaligned
  head and spare tail freed again (malloc/malloc.c, `_int_memalign`). The replay merges those remainders; glibc
  2.36 frees them into its tcache and fastbins, where they never merge (bug 30723, fixed after 2.38).

Each row, from the moment `trainer.train()` begins (a marker allocation in the trace) to the end: how far the heap
grew and how far resident memory rose, against the process itself (the heap's extent from its pointers, its RSS from
heaptrack's samples). Needs Debian's `heaptrack` and `zstd` (skipped, saying so, without them).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GIB = 2**30
PAGE, MINSIZE, HEADER, TOP_PAD = 4096, 32, 8, 128 * 1024
TENSOR_ALIGNMENT = 64
THRESHOLD_MIN, THRESHOLD_MAX = 128 * 1024, 32 * 2**20
HEAP_END = 0x7000_0000_0000  # the brk heap of a PIE python lies below; mmaps and other arenas above


class Heap:
    """glibc's main arena, as `cpu_allocator.GlibcHeap` models it (best fit, coalescing, top trim, the dynamic mmap
    threshold), with sorted free lists so that two million events replay in minutes, and `_int_memalign` as an
    option."""

    def __init__(self) -> None:
        from sortedcontainers import SortedList

        self.top = self.mmapped = self.peak = 0
        self.threshold, self.trim = THRESHOLD_MIN, 2 * THRESHOLD_MIN
        self.by_size, self.starts, self.size_of = SortedList(), SortedList(), {}
        self.live: dict[int, tuple[bool, int, int]] = {}  # key -> (in the heap, address, size)

    def _remove(self, start: int) -> int:
        size = self.size_of.pop(start)
        self.starts.remove(start)
        self.by_size.remove((size, start))
        return size

    def _insert(self, start: int, size: int) -> None:
        if size <= 0:
            return
        i = self.starts.bisect_left(start)
        if i and self.starts[i - 1] + self.size_of[self.starts[i - 1]] == start:
            before = self.starts[i - 1]
            start, size = before, size + self._remove(before)
        if start + size in self.size_of:
            size += self._remove(start + size)
        if start + size == self.top and size > self.trim:
            self.top = start + min(size, TOP_PAD)
            size = self.top - start
        self.starts.add(start)
        self.size_of[start] = size
        self.by_size.add((size, start))

    def malloc(self, key: int, n: int, aligned: bool) -> None:
        nb = max(MINSIZE, (n + HEADER + 15) // 16 * 16)
        need = nb + TENSOR_ALIGNMENT + MINSIZE if aligned else nb
        k = self.by_size.bisect_left((need, -1))
        if k < len(self.by_size):
            have, start = self.by_size[k]
            self._remove(start)
        elif need >= self.threshold:
            size = (need + HEADER + PAGE - 1) // PAGE * PAGE
            self.mmapped += size
            self.live[key] = (False, 0, size)
            self.peak = max(self.peak, self.top + self.mmapped)
            return
        else:  # carved from the top chunk (the free chunk at the heap's end), the heap extended by what it lacks
            start = self.top
            if self.starts and self.starts[-1] + self.size_of[self.starts[-1]] == self.top:
                start = self.starts[-1]
                self._remove(start)
            have, self.top = need, max(self.top, start + need)
        if aligned and (start + 2 * HEADER) % TENSOR_ALIGNMENT:
            at = (start + 2 * HEADER + TENSOR_ALIGNMENT - 1) // TENSOR_ALIGNMENT * TENSOR_ALIGNMENT - 2 * HEADER
            at += TENSOR_ALIGNMENT if at - start < MINSIZE else 0
            self._insert(start, at - start)
            start, have = at, have - (at - start)
        if have > nb + MINSIZE:
            self._insert(start + nb, have - nb)
            have = nb
        self.live[key] = (True, start, have)
        self.peak = max(self.peak, self.top + self.mmapped)

    def free(self, key: int) -> None:
        found = self.live.pop(key, None)
        if found is None:
            return
        in_heap, start, size = found
        if in_heap:
            self._insert(start, size)
            return
        self.mmapped -= size
        if self.threshold < size <= THRESHOLD_MAX:
            self.threshold, self.trim = size, 2 * size


def events(raw: Path):
    """heaptrack's raw lines: ('+', size, pointer), ('-', 0, pointer), ('R', rss bytes, 0)."""
    with subprocess.Popen(["zstd", "-dc", str(raw)], stdout=subprocess.PIPE, text=True, bufsize=1 << 20) as proc:
        for line in proc.stdout:
            kind = line[0]
            if kind == "+":
                _, size, _, pointer = line.split()
                yield "+", int(size, 16), int(pointer, 16)
            elif kind == "-":
                yield "-", 0, int(line.split()[1], 16)
            elif kind == "R":
                yield "R", int(line.split()[1], 16) * PAGE, 0


MARK = 0x5EED5  # a malloc of this size marks the start of trainer.train() in the trace
TRAIN_WITH_MARK = (
    "import ctypes, sys, transformers\n"
    "libc = ctypes.CDLL(None)\nlibc.malloc.restype = ctypes.c_void_p\nlibc.free.argtypes = [ctypes.c_void_p]\n"
    "train = transformers.Trainer.train\n"
    "def marked(self, *a, **k):\n"
    f"    libc.free(libc.malloc({MARK}))\n"
    "    return train(self, *a, **k)\n"
    "transformers.Trainer.train = marked\n"
    "from workbench.plan.real_step import main\nsys.exit(main(sys.argv[1:]))\n")


def replay(raw: Path, smallest: int, memalign: bool) -> dict:
    """From the mark (trainer.train() begins) to the end: the replay's resident rise and heap growth, and the
    process' own RSS rise (its samples) and its heap's real extent (the pointers below HEAP_END)."""
    heap = Heap()
    marked = False
    rss = model_at_mark = rss_at_mark = heap_at_mark = 0
    model_peak = rss_peak = heap_peak = 0
    low, high = None, 0
    for kind, size, pointer in events(raw):
        if kind == "+":
            if size == MARK and not marked:
                marked, model_at_mark, rss_at_mark, heap_at_mark = True, heap.top + heap.mmapped, rss, heap.top
                model_peak, rss_peak = model_at_mark, rss
                real_at_mark = high - (low or 0)
                continue
            if size >= smallest:
                heap.malloc(pointer, size, memalign and size >= 4096)
            if pointer < HEAP_END:
                low = min(low or pointer, pointer)
                high = max(high, pointer + size)
        elif kind == "-":
            heap.free(pointer)
        else:
            rss = size
            rss_peak = max(rss_peak, rss) if marked else rss_peak
        if marked:
            model_peak = max(model_peak, heap.top + heap.mmapped)
            heap_peak = max(heap_peak, heap.top)
    if not marked:
        raise RuntimeError("the trace has no mark of trainer.train()")
    return {"model_rise": model_peak - model_at_mark, "real_rise": rss_peak - rss_at_mark,
            "model_heap_growth": heap_peak - heap_at_mark, "real_heap_growth": high - (low or 0) - real_at_mark}


def traced_step(folder: Path) -> Path:
    """The plan bench's LoRA step under `heaptrack --raw`, trainer.train() marked: the raw trace's path."""
    sys.path.insert(0, str(ROOT / "bench"))
    from plan_bench import LORA, write_model

    model = write_model(folder / "qwen2-90m")
    adapter = folder / "adapter_config.json"
    adapter.write_text(json.dumps(LORA))
    subprocess.run(["heaptrack", "--raw", "-o", str(folder / "step"), sys.executable, "-c", TRAIN_WITH_MARK,
                    str(model), json.dumps({"per_device_train_batch_size": 8}), str(adapter), "--seq", "512"],
                   cwd=ROOT, check=True, capture_output=True, stdin=subprocess.DEVNULL, timeout=1800)
    return next(folder.glob("step*.raw.zst"))


def glibc_trace_rows(folder: Path) -> str:
    if shutil.which("heaptrack") is None or shutil.which("zstd") is None:
        return "skipped: Debian's `heaptrack` and `zstd` are needed (apt-get install heaptrack zstd)"
    raw = traced_step(folder)
    lines = ["| replayed from the start of `trainer.train()` | the heap grew (GiB) | resident rise (GiB) |",
             "|---|---|---|"]
    for label, smallest, memalign in [("allocations >= 64 KiB (what the tracker sees), malloc", 64 * 1024, False),
                                      ("allocations >= 64 KiB, through `_int_memalign`", 64 * 1024, True),
                                      ("every allocation, malloc", 0, False),
                                      ("every allocation, tensors through `_int_memalign`", 0, True)]:
        r = replay(raw, smallest, memalign)
        lines.append(f"| {label} | {r['model_heap_growth'] / GIB:.2f} | {r['model_rise'] / GIB:.2f} |")
    lines.append(f"| the process itself (its pointers; heaptrack's RSS samples) | {r['real_heap_growth'] / GIB:.2f} | "
                 f"{r['real_rise'] / GIB:.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory(prefix="workbench-glibc-") as tmp:
        print(glibc_trace_rows(Path(tmp)))
