"""bench/RESULTS.md: what `make bench` measured, each section stamped with its date, machine and commit.

Each mode of bench/run.py (the full run, --only-scaling, --only-data, ...) owns one section of the file and
replaces it when it runs again, so a partial run never erases the others.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
from pathlib import Path

from workbench.environment import library_versions

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
HEADER = ("# Benchmarks\n\nWritten by `make bench` (`bench/run.py`); each section is replaced when its mode runs "
          "again. Ratios are against the naive way, measured in the same run.\n")


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor() or "?") if Path("/proc/cpuinfo").exists() \
        else platform.processor()
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    isa = "AVX-512 bf16" if "avx512_bf16" in flags else "AVX-512" if "avx512f" in flags else "AVX2" \
        if "avx2" in flags else "no AVX2"
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    installed = library_versions()  # what every report's findings.json records
    versions = ", ".join(f"{name} {installed.get(name) or '-'}" for name in ("torch", "transformers", "peft",
                                                                          "bitsandbytes"))
    return (f"{cpu} ({isa}), {os.cpu_count()} cores, {memory:.0f} GiB; Python {platform.python_version()}, "
            f"{versions}")


def commit() -> str:
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
                             cwd=RESULTS.parent, stdin=subprocess.DEVNULL).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, timeout=10, cwd=RESULTS.parent, stdin=subprocess.DEVNULL).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{sha}{' (with uncommitted changes)' if dirty else ''}" if sha else "unknown"


def write_section(mode: str, title: str, body: str) -> None:
    """Replace (or append) the section of `mode` with a stamp and `body` (markdown)."""
    start, end = f"<!-- bench:{mode} -->", f"<!-- /bench:{mode} -->"
    stamp = f"{dt.datetime.now().astimezone():%Y-%m-%d %H:%M %Z} · commit {commit()} · {machine()}"
    section = f"{start}\n## {title}\n\n{stamp}\n\n{body.strip()}\n{end}"
    text = RESULTS.read_text() if RESULTS.exists() else HEADER
    if start in text and end in text:
        text = text[:text.index(start)] + section + text[text.index(end) + len(end):]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    RESULTS.write_text(text)
    print(f"wrote {RESULTS.relative_to(RESULTS.parent.parent)} ({mode})")
