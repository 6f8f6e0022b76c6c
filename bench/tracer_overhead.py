"""Tracer overhead: a forward under the dtype tracer against the plain forward, measured in one run.

    .venv/bin/python bench/tracer_overhead.py [--repeats 100]

Plain and traced forwards are interleaved (so machine noise hits both alike). Reported per demo model:
min / median milliseconds of the plain forward, of the forward with the tracer's hooks installed, the ratio of
medians (goal <= 1.5x), and the one-time cost of installing and removing the hooks.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from workbench.demo.build import build_demo
from workbench.model.inputs import sample_inputs
from workbench.model.loading import load_pretrained
from workbench.model.tracer import DtypeTracer
from workbench.runtime import quiet_and_offline


def ms(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000


def main() -> None:
    quiet_and_offline()
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=100)
    args = parser.parse_args()
    torch.set_num_threads(1)
    demo = build_demo()
    print(f"{'model':14} {'modules':>7} {'plain ms min/med':>17} {'traced ms min/med':>18} {'ratio':>6} "
          f"{'install+remove ms':>18}")
    for name, folder in [("qwen2vl (VLM)", demo.qwen_base), ("llama (text)", demo.llama)]:
        model = load_pretrained(folder).eval()
        inputs, _ = sample_inputs(model, folder)

        def forward():
            with torch.no_grad():
                model(**inputs)

        tracer = DtypeTracer(model)
        plain, traced, install = [], [], []
        forward()
        for _ in range(args.repeats):
            plain.append(ms(forward))
            install.append(ms(lambda: (tracer.__enter__(), tracer.__exit__(None, None, None))))
            with tracer:
                forward()  # warm the hooks' per-module caches
                traced.append(ms(forward))
                tracer.calls.clear()
        ratio = statistics.median(traced) / statistics.median(plain)
        print(f"{name:14} {sum(1 for _ in model.modules()):>7} "
              f"{min(plain):>7.2f}/{statistics.median(plain):<8.2f} {min(traced):>8.2f}/{statistics.median(traced):<8.2f}"
              f" {ratio:>5.2f}x {statistics.median(install):>17.2f}")


if __name__ == "__main__":
    main()
