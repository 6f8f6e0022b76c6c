"""This process' peak resident memory, and its reset where one kernel serves several diagnoses in turn.

`getrusage`'s `ru_maxrss` is the peak over the whole life of the process and cannot be reset. Linux keeps the same
high-water mark as `VmHWM` in /proc/self/status and resets it to the current resident size when "5" is written to
/proc/self/clear_refs (proc(5), since Linux 4.0): a kept kernel then reports each diagnosis' own peak, not the
largest of every diagnosis before it. Elsewhere (macOS, a /proc that refuses the write) the reset says it failed,
and the caller starts a fresh process instead.
"""

from __future__ import annotations

import resource
import sys

STATUS = "/proc/self/status"
CLEAR_REFS = "/proc/self/clear_refs"
RESET_PEAK = "5"  # proc(5): "Reset the peak resident set size ('high water mark') to the process's current value"


def peak_rss_bytes() -> int:
    """The peak resident memory of this process since it started or since the last `reset_peak_rss`."""
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
    try:
        with open(CLEAR_REFS, "w") as fh:
            fh.write(RESET_PEAK)
    except OSError:
        return False
    return True
