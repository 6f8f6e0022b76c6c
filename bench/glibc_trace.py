"""`make bench` rows of what glibc keeps resident in a CPU training step (bench/run.py --only-glibc-trace): the real
process' every allocation, recorded by heaptrack, replayed through glibc's policy four ways.

Why: `workbench plan --device cpu` replays glibc's policy (`workbench/plan/cpu_allocator.py`) on the tensors its
tracker sees, and stays 12-37 % under the resident memory of a default-glibc process (bench/RESULTS.md, the plan
section). This measures which part of glibc's behaviour the tracker's trace cannot carry. The step is the plan
bench's LoRA r16, batch 8 × 512 of a 90M Qwen2 (`workbench.plan.real_step`, a real `transformers.Trainer`), run under
`heaptrack --raw` (every malloc, free and posix_memalign with its pointer; the RSS sampled), and its trace replayed
through the plan's own model of glibc (`cpu_allocator.GlibcHeap`):

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
PAGE = 4096
HEAP_END = 0x7000_0000_0000  # the brk heap of a PIE python lies below; mmaps and other arenas above


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
    from workbench.plan.cpu_allocator import GlibcHeap

    heap = GlibcHeap()
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
                heap.malloc(pointer, size, aligned=memalign and size >= 4096)
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


MISSING_TOOLS = "Debian's `heaptrack` and `zstd` are needed (apt-get install heaptrack zstd)"


def glibc_trace_rows(folder: Path) -> str | None:
    """The section's table, or None without heaptrack and zstd (MISSING_TOOLS)."""
    if shutil.which("heaptrack") is None or shutil.which("zstd") is None:
        return None
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
        print(glibc_trace_rows(Path(tmp)) or f"skipped: {MISSING_TOOLS}")
