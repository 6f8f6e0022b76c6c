import json
import struct

import pytest
import torch
from safetensors.torch import save_file

from workbench.model.safetensors_header import HeaderError, read_header


@pytest.fixture
def small_file(tmp_path):
    path = tmp_path / "model.safetensors"
    save_file({"a.weight": torch.zeros(4, 3, dtype=torch.bfloat16), "b.bias": torch.ones(5)}, str(path),
              metadata={"format": "pt"})
    return path


def test_reads_dtypes_shapes_and_only_the_header(small_file):
    header = read_header(small_file)
    entries = {t.name: t for t in header.tensors}
    assert entries["a.weight"].dtype == "bfloat16" and entries["a.weight"].shape == (4, 3)
    assert entries["b.bias"].dtype == "float32" and entries["b.bias"].nbytes == 20
    assert header.problems == ()
    assert header.bytes_read == 8 + header.header_size < header.file_size
    assert header.metadata == {"format": "pt"}


def test_truncated_data_is_reported(small_file):
    data = small_file.read_bytes()
    small_file.write_bytes(data[:-10])
    problems = read_header(small_file).problems
    assert any("truncated" in p for p in problems)


def test_header_longer_than_file_raises(small_file):
    data = small_file.read_bytes()
    small_file.write_bytes(data[:20])
    with pytest.raises(HeaderError, match="truncated"):
        read_header(small_file)


def test_header_lying_about_offsets(tmp_path):
    header = {"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
              "y": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}
    raw = json.dumps(header).encode()
    path = tmp_path / "bad.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * 12)
    problems = read_header(path).problems
    assert any("overlap" in p for p in problems)


def test_not_json_and_unknown_dtype(tmp_path):
    path = tmp_path / "x.safetensors"
    path.write_bytes(struct.pack("<Q", 3) + b"{{{")
    with pytest.raises(HeaderError, match="not valid JSON"):
        read_header(path)
    raw = json.dumps({"x": {"dtype": "Q7", "shape": [1], "data_offsets": [0, 1]}}).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0")
    with pytest.raises(HeaderError, match="unknown dtype"):
        read_header(path)
