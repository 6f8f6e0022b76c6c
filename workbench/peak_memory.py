"""This process' peak resident memory, and its reset where one kernel serves several diagnoses in turn.

`getrusage`'s `ru_maxrss` is the peak over the whole life of the process and cannot be reset. Linux keeps the same
high-water mark as `VmHWM` in /proc/self/status and resets it to the current resident size when "5" is written to
/proc/self/clear_refs (proc(5), since Linux 4.0): a kept kernel then reports each diagnosis' own peak, not the
largest of every diagnosis before it. Elsewhere (macOS, a /proc that refuses the write) the reset says it failed,
and the caller starts a fresh process instead. The same restart times each probe step of a diagnosis' own kernel
(`step_peak_rss`, the recorder's batch mode): the cost block's `steps[].peak_rss_bytes`.
"""

from __future__ import annotations

import contextlib
import resource
import sys
from collections.abc import Iterator

STATUS = "/proc/self/status"
CLEAR_REFS = "/proc/self/clear_refs"
RESET_PEAK = "5"  # proc(5): "Reset the peak resident set size ('high water mark') to the process's current value"


# the highest peak read before a step restarted the count (`step_peak_rss`): the process' peak never reads lower
_carried = [0]


def peak_rss_bytes() -> int:
    """The peak resident memory of this process since it started or since the last `reset_peak_rss`."""
    return max(_high_water_mark(), _carried[0])


def _high_water_mark() -> int:
    try:
        with open(STATUS) as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    scale = 1 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB on Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def reset_peak_rss() -> bool:
    """Start the peak over from the current resident size; False where the system cannot."""
    if not _restart_high_water_mark():
        return False
    _carried[0] = 0
    return True


def _restart_high_water_mark() -> bool:
    try:
        with open(CLEAR_REFS, "w") as fh:
            fh.write(RESET_PEAK)
    except OSError:
        return False
    return True


@contextlib.contextmanager
def step_peak_rss() -> Iterator[list[int | None]]:
    """Yields a one-item list that holds, once the block ends, the peak resident memory reached inside it (None
    where the system cannot restart the count). `peak_rss_bytes()` still answers for the whole process: the peak
    before the block is carried over the restart."""
    reading: list[int | None] = [None]
    before = peak_rss_bytes()
    if not _restart_high_water_mark():
        yield reading
        return
    _carried[0] = before
    try:
        yield reading
    finally:
        reading[0] = _high_water_mark()
