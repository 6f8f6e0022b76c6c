"""A checkpoint's weight files read into the page cache while a fresh kernel imports the stack (`diagnose`).

A diagnosis' first load reads every weight file the model is built from, and a fresh kernel spends its first
seconds importing torch and transformers on one core. `start_prefetch` reads those files in a thread of the CLI's
process meanwhile, so that the load finds them in the page cache: on a checkpoint no process read since it was
written or evicted, the read overlaps the imports instead of following them. posix_fadvise and madvise(WILLNEED)
are requests the OS may drop, and on this project's VM a read 5 s after either was still cold, so the thread reads:
`os.sendfile` into /dev/null, which fills the page cache without copying a byte into this process (0.06 s of CPU
for 2.6 GB). It reads only where it helps and cannot hurt: a notebook that prepares the model will run, the files
are local, and together they take at most half the machine's available memory (beyond that, the page cache would
evict what the thread read before the load reaches it). Nothing is written, and a file that cannot be read is
left to the load, which says why.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

# the step every notebook that loads the shared model runs first (catalog `_PREPARE`)
PREPARE_PROBE = "workbench.model.shared:prepare_shared"
MEMORY_SHARE = 0.5  # at most this share of MemAvailable is read ahead
CHUNK = 1 << 26


def loads_the_model(notebooks: list[str]) -> bool:
    """Whether one of these notebooks (their names) prepares the shared model, i.e. loads its weights."""
    from workbench.catalog import NOTEBOOKS

    return any(step.probe == PREPARE_PROBE for spec in NOTEBOOKS if spec.name in notebooks for step in spec.steps)


def weight_files(target) -> list[Path]:
    """The weight files `from_pretrained` reads for the target (`inspect_checkpoint`): the base's, then the
    adapter's."""
    from workbench.model.checkpoint import inspect_checkpoint

    folders = [target.model_dir] + ([target.adapter_dir] if target.adapter_dir is not None else [])
    return [header.path for folder in folders for header in inspect_checkpoint(folder).headers]


def available_memory() -> int:
    """MemAvailable of this machine (`environment.host_available_bytes`)."""
    from workbench.environment import host_available_bytes

    return host_available_bytes()[0]


def files_to_prefetch(target, notebooks: list[str], available: int | None) -> tuple[list[Path], str | None]:
    """(the files to read ahead, None) or ([], why not)."""
    if getattr(target, "model_unavailable", None):
        return [], "the model cannot be resolved"
    if not loads_the_model(notebooks):
        return [], "no notebook of this diagnosis loads the model"
    files = weight_files(target)
    if not files or not all(path.is_file() for path in files):
        return [], "the weights are not all local files"
    total = sum(path.stat().st_size for path in files)
    if available is None or total > MEMORY_SHARE * available:
        return [], f"{total} bytes of weights against {available} bytes of available memory"
    return files, None


def _read_into_page_cache(files: list[Path]) -> None:
    try:
        null = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return
    try:
        for path in files:
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError:
                continue
            try:
                offset, size = 0, os.fstat(fd).st_size
                while offset < size:
                    sent = os.sendfile(null, fd, offset, min(CHUNK, size - offset))
                    if sent <= 0:
                        break
                    offset += sent
            except OSError:
                pass
            finally:
                os.close(fd)
    finally:
        os.close(null)


def drop_from_page_cache(files: list[Path]) -> None:
    """The opposite, for measuring and testing it: `files` written out, then dropped from the page cache
    (posix_fadvise DONTNEED drops clean pages only), as a checkpoint no process has read since it was evicted."""
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def start_prefetch(files: list[Path]) -> threading.Thread | None:
    """Read `files` into the page cache in a daemon thread (it ends with the process); None when there is none."""
    if not files:
        return None
    thread = threading.Thread(target=_read_into_page_cache, args=(files,), name="workbench-prefetch", daemon=True)
    thread.start()
    return thread
