"""`make bench` rows of `workbench sweep` (bench/run.py --only-sweep): a history of eight members (a real LoRA
Trainer run's checkpoint-1 … checkpoint-8, tests/sweep/lora_history.py) diagnosed with notebook 00, on the local
engine in series (one kernel kept for the members), with `--jobs 2` (one kept by each worker), and on Ray (a local
cluster the sweep starts, its start-up included; a kernel per member): seconds per member, and each one's difference
per member from the local engine. The naive way beside them: the same eight checkpoints diagnosed by eight
`workbench diagnose` runs, one after another (a process and a kernel each). Each sweep is one CLI process, timed from
outside."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MEMBERS = 8
ENGINES = {"local, in series": [], "local, --jobs 2": ["--jobs", "2"], "Ray (a local cluster it starts)":
           ["--engine", "ray"]}
NAIVE = "naive: 8 × `workbench diagnose`, one after another"


def build_history(folder: Path) -> Path:
    sys.path.insert(0, str(ROOT / "tests" / "sweep"))
    from lora_history import build_lora_run

    return build_lora_run(folder, checkpoints=MEMBERS)


def timed_sweep(run: Path, options: list[str], reports: Path) -> tuple[float, int, str]:
    """(wall seconds, exit code, the last line of stderr) of one sweep."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "workbench", "sweep", str(run), "--history", "--notebooks", "00",
                           "--reports-dir", str(reports), *options], capture_output=True, text=True, cwd=ROOT,
                          stdin=subprocess.DEVNULL, timeout=3600,
                          env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "OMP_NUM_THREADS": "1"})
    return time.perf_counter() - start, proc.returncode, (proc.stderr.strip().splitlines() or [""])[-1]


def timed_diagnoses(run: Path, reports: Path) -> tuple[float, int, str]:
    """(wall seconds, worst exit code, the last line of stderr) of `diagnose --notebooks 00` on each checkpoint of
    the run, one after another."""
    start, worst, last = time.perf_counter(), 0, ""
    for checkpoint in sorted(run.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1])):
        proc = subprocess.run([sys.executable, "-m", "workbench", "diagnose", str(checkpoint), "--notebooks", "00",
                               "--reports-dir", str(reports)], capture_output=True, text=True, cwd=ROOT,
                              stdin=subprocess.DEVNULL, timeout=3600, env={**os.environ, "OMP_NUM_THREADS": "1"})
        worst = max(worst, proc.returncode)
        last = (proc.stderr.strip().splitlines() or [last])[-1]
    return time.perf_counter() - start, worst, last


def sweep_rows(tmp: Path, repeats: int) -> str:
    """The markdown table: per engine, seconds for the sweep and per member, and the overhead over the local one."""
    run = build_history(tmp / "runs")
    lines = ["| engine | sweep of 8 members (min / median over runs) | per member | over the local engine, per member |",
             "|---|---|---|---|"]
    local = None
    for label, options in [*ENGINES.items(), (NAIVE, None)]:
        walls, failed = [], ""
        for i in range(repeats):
            reports = tmp / f"reports-{len(lines)}-{i}"
            wall, code, last = (timed_sweep(run, options, reports) if options is not None else
                                timed_diagnoses(run, reports))
            if code not in (0, 1):
                failed = f"exit {code}: {last[:160]}"
                break
            walls.append(wall)
        if not walls:
            lines.append(f"| {label} | did not run ({failed}) | — | — |")
            continue
        best, median = min(walls), sorted(walls)[len(walls) // 2]
        local = median if local is None else local
        over = "—" if median == local else f"{(median - local) / MEMBERS:+.1f} s"
        lines.append(f"| {label} | {best:.0f} / {median:.0f} s | {median / MEMBERS:.1f} s | {over} |")
    return "\n".join(lines)
