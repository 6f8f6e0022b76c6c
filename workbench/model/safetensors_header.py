"""Read a safetensors file's header and nothing else.

The format: 8 bytes (little-endian u64) giving the header length N, N bytes of JSON mapping each tensor name
to its dtype, shape and `data_offsets` (relative to the end of the header), then the data. Reading the header
answers dtype/shape/byte questions for a 7B checkpoint in milliseconds without touching a weight, and lets us
check the file against itself (truncation, offsets that overlap or run past the end).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any

# safetensors dtype codes -> (torch dtype name, bits per element)
SAFETENSORS_DTYPES: dict[str, tuple[str, int]] = {
    "F64": ("float64", 64), "F32": ("float32", 32), "F16": ("float16", 16), "BF16": ("bfloat16", 16),
    "F8_E4M3": ("float8_e4m3fn", 8), "F8_E5M2": ("float8_e5m2", 8), "F8_E8M0": ("float8_e8m0fnu", 8),
    "F4": ("float4_e2m1fn_x2", 4), "F6_E2M3": ("float6_e2m3", 6), "F6_E3M2": ("float6_e3m2", 6),
    "I64": ("int64", 64), "I32": ("int32", 32), "I16": ("int16", 16), "I8": ("int8", 8),
    "U64": ("uint64", 64), "U32": ("uint32", 32), "U16": ("uint16", 16), "U8": ("uint8", 8),
    "BOOL": ("bool", 8), "C64": ("complex64", 64),
}
FLOATING_DTYPES = frozenset(
    name for name, _ in SAFETENSORS_DTYPES.values() if name.startswith(("float", "bfloat"))
)
# A header larger than this is not a checkpoint header; refuse before reading it (safetensors caps at 100 MB).
MAX_HEADER_BYTES = 100 * 1024 * 1024


class HeaderError(ValueError):
    """The file is not a readable safetensors file; the message names the file and what is wrong."""


@dataclasses.dataclass(frozen=True)
class TensorEntry:
    name: str
    dtype: str  # torch dtype name, e.g. "bfloat16"
    shape: tuple[int, ...]
    start: int  # data offsets, relative to the end of the header
    end: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.end - self.start


@dataclasses.dataclass(frozen=True)
class SafetensorsHeader:
    path: Path
    file_size: int
    header_size: int
    tensors: tuple[TensorEntry, ...]
    metadata: dict[str, str]
    problems: tuple[str, ...]  # self-inconsistencies found (truncation, overlaps, size mismatches)

    @property
    def bytes_read(self) -> int:
        return 8 + self.header_size

    @property
    def data_size(self) -> int:
        return self.file_size - 8 - self.header_size


def read_header(path: str | os.PathLike) -> SafetensorsHeader:
    """Parse one file's header and check the file against it. Raises `HeaderError` if unreadable."""
    path = Path(path)
    file_size = path.stat().st_size
    with open(path, "rb") as fh:
        prefix = fh.read(8)
        header_size = header_length(path, prefix, file_size)
        raw = fh.read(header_size)
    return parse_header(path, raw, file_size)


def header_length(path: Path | str, prefix: bytes, file_size: int) -> int:
    """The header length the file's first 8 bytes declare, checked against the file's size."""
    if file_size < 8 or len(prefix) < 8:
        raise HeaderError(f"{path}: {file_size} bytes, too short to be a safetensors file (truncated?)")
    header_size = int.from_bytes(prefix[:8], "little")
    if header_size > MAX_HEADER_BYTES:
        raise HeaderError(f"{path}: header length field says {header_size} bytes; not a safetensors file")
    if 8 + header_size > file_size:
        raise HeaderError(
            f"{path}: header needs {header_size} bytes but the file has {file_size - 8} after the length "
            "field (truncated)"
        )
    return header_size


def parse_header(path: Path, raw: bytes, file_size: int) -> SafetensorsHeader:
    """The header from its JSON bytes (after the 8-byte length) and the whole file's size, wherever they were read:
    a local file or HTTP range requests (`workbench.model.hub_headers`). Raises `HeaderError` if unreadable."""
    try:
        parsed = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HeaderError(f"{path}: header is not valid JSON ({exc})") from None
    if not isinstance(parsed, dict):
        raise HeaderError(f"{path}: header is not a JSON object")
    metadata = parsed.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict):
        raise HeaderError(f"{path}: __metadata__ is not an object")
    tensors = [_tensor_entry(path, name, spec) for name, spec in parsed.items()]
    tensors.sort(key=lambda t: (t.start, t.end))
    header_size = len(raw)
    problems = _check_layout(tensors, file_size - 8 - header_size)
    return SafetensorsHeader(
        path=path, file_size=file_size, header_size=header_size, tensors=tuple(tensors),
        metadata={str(k): str(v) for k, v in metadata.items()}, problems=tuple(problems),
    )


def _tensor_entry(path: Path, name: str, spec: Any) -> TensorEntry:
    try:
        code, shape, offsets = spec["dtype"], spec["shape"], spec["data_offsets"]
        if not isinstance(code, str) or not isinstance(shape, list) or not isinstance(offsets, list):
            raise TypeError("dtype must be a string, shape and data_offsets lists")
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in [*shape, *offsets]):
            raise TypeError("shape and data_offsets must hold integers")
        shape = tuple(shape)
        start, end = offsets
    except (KeyError, TypeError, ValueError, OverflowError):
        raise HeaderError(f"{path}: tensor {name!r} has a malformed entry {str(spec)[:120]}") from None
    if code not in SAFETENSORS_DTYPES:
        raise HeaderError(f"{path}: tensor {name!r} has unknown dtype {code!r}")
    if any(d < 0 for d in shape) or start < 0 or end < start:
        raise HeaderError(f"{path}: tensor {name!r} has negative shape or offsets {shape} {[start, end]}")
    return TensorEntry(name, SAFETENSORS_DTYPES[code][0], shape, start, end)


def _check_layout(tensors: list[TensorEntry], data_size: int) -> list[str]:
    problems: list[str] = []
    cursor = 0
    for t in tensors:
        bits = next(b for n, b in SAFETENSORS_DTYPES.values() if n == t.dtype)
        expected = math.ceil(t.numel * bits / 8)
        if t.nbytes != expected:
            problems.append(f"{t.name}: {t.nbytes} bytes in the file, {expected} expected for {t.dtype}{list(t.shape)}")
        if t.start < cursor:
            problems.append(f"{t.name}: data offsets [{t.start}, {t.end}] overlap the previous tensor")
        elif t.start > cursor:
            problems.append(f"{t.name}: {t.start - cursor} bytes of unaccounted data before it")
        cursor = max(cursor, t.end)
    if cursor > data_size:
        problems.append(f"data ends at byte {cursor} but the file holds {data_size} bytes of data (truncated)")
    elif cursor < data_size:
        problems.append(f"{data_size - cursor} trailing bytes after the last tensor")
    return problems
