"""Reading the weights into the page cache while a fresh kernel imports (`workbench.model.prefetch`): only for a
diagnosis whose notebooks load the model, from local files that fit half the available memory; the read leaves the
files in the page cache, as the OS's own count of resident pages (mincore(2)) says."""

import ctypes
import mmap
import os
from pathlib import Path

import pytest

from workbench.model.prefetch import drop_from_page_cache, files_to_prefetch, loads_the_model, start_prefetch
from workbench.model.target import resolve_target

MODEL_NOTEBOOKS = ["00_saved_files", "01_dtype_distribution"]
GIB = 2**30


def resident_pages(path: Path) -> int:
    """Pages of `path` in the page cache, asked of the OS: the file mapped (mmap(2)), then mincore(2)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
    libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p)
    libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
    size = path.stat().st_size
    fd = os.open(path, os.O_RDONLY)
    try:
        address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert address not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
        try:
            vector = ctypes.create_string_buffer((size + mmap.PAGESIZE - 1) // mmap.PAGESIZE)
            assert libc.mincore(address, size, vector) == 0, os.strerror(ctypes.get_errno())
            return sum(byte & 1 for byte in vector.raw)
        finally:
            libc.munmap(address, size)
    finally:
        os.close(fd)


def test_only_a_diagnosis_that_loads_the_model_reads_it_ahead_and_only_what_fits(demo):
    base, adapter = resolve_target(str(demo.llama)), resolve_target(str(demo.qwen_stage2))
    assert not loads_the_model(["00_saved_files", "07_data_path", "08_training_run", "11_memory_plan"])
    assert loads_the_model(["00_saved_files", "04_forward_checks"])
    files, why = files_to_prefetch(base, ["00_saved_files"], 64 * GIB)
    assert files == [] and why == "no notebook of this diagnosis loads the model"
    files, why = files_to_prefetch(base, MODEL_NOTEBOOKS, 64 * GIB)
    assert why is None and files == sorted(demo.llama.glob("*.safetensors"))
    # an adapter: its base's weights, then its own
    files, why = files_to_prefetch(adapter, MODEL_NOTEBOOKS, 64 * GIB)
    assert why is None and files == [adapter.model_dir / "model.safetensors", demo.qwen_stage2 / "adapter_model.safetensors"]
    weights = sum(p.stat().st_size for p in files)
    files, why = files_to_prefetch(adapter, MODEL_NOTEBOOKS, int(weights * 1.9))  # more than half: left to the load
    assert files == [] and "available memory" in why
    assert files_to_prefetch(adapter, MODEL_NOTEBOOKS, None)[0] == []  # where /proc does not say


def test_the_files_read_ahead_are_in_the_page_cache(tmp_path):
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(os.urandom(8 * 2**20))
    drop_from_page_cache([weights])
    if resident_pages(weights) > 0:
        pytest.skip("this filesystem keeps the file's pages after posix_fadvise(DONTNEED) (a tmpfs?)")
    thread = start_prefetch([weights, tmp_path / "missing.safetensors"])  # a file that cannot be read is skipped
    thread.join(timeout=60)
    assert not thread.is_alive() and thread.daemon
    assert resident_pages(weights) == (weights.stat().st_size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    assert start_prefetch([]) is None


def test_diagnose_reads_ahead_for_the_notebooks_it_runs(demo, monkeypatch):
    import workbench.model.prefetch as prefetch
    from workbench.diagnose_command import _prefetch_weights

    started = []
    monkeypatch.setattr(prefetch, "start_prefetch", started.append)
    target = resolve_target(str(demo.llama))
    _prefetch_weights(target, ["00"])  # `--notebooks 00`: files and headers only
    _prefetch_weights(target, None)  # every notebook
    assert started == [[], sorted(demo.llama.glob("*.safetensors"))]
