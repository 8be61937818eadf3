"""GgufReader: the header as the `gguf` package reads it, tensors as views of the map, and every
malformed header one named error (never an OverflowError, a recursion, a hang or a crash)."""

from __future__ import annotations

import struct
from pathlib import Path

import gguf
import numpy as np
import pytest

from nanoserve.runtime.errors import WeightsError
from nanoserve.runtime.loading.gguf_reader import GgufReader


def test_the_header_and_tensors_are_the_gguf_packages(
    tiny_mixed_gguf: Path,
) -> None:
    theirs = gguf.GGUFReader(tiny_mixed_gguf)
    ours = GgufReader.open(tiny_mixed_gguf)
    for field in theirs.fields.values():
        if not field.name.startswith("GGUF."):
            assert ours.metadata[field.name] == field.contents(), field.name
    assert list(ours.tensors) == [t.name for t in theirs.tensors]
    for tensor in theirs.tensors:
        mine = ours.tensors[tensor.name]
        assert (mine.type_id, mine.offset, mine.num_bytes) == (
            int(tensor.tensor_type),
            tensor.data_offset,
            tensor.n_bytes,
        )
        assert mine.shape == tuple(int(d) for d in reversed(tensor.shape))
        stored = np.asarray(tensor.data).reshape(-1).view(np.uint8)
        assert np.array_equal(ours.tensor_bytes(mine).numpy(), stored), tensor.name


def header(
    *kv: bytes, tensors: bytes = b"", num_tensors: int = 0, num_kv: int | None = None
) -> bytes:
    count = len(kv) if num_kv is None else num_kv
    return b"GGUF" + struct.pack("<IQQ", 3, num_tensors, count) + b"".join(kv) + tensors


def gstr(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def kv_u32(key: str, value: int) -> bytes:
    return gstr(key) + struct.pack("<II", 4, value)


def tensor_info(name: str, dims: tuple[int, ...], type_id: int, offset: int) -> bytes:
    return gstr(name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, type_id, offset)


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (
            header(gstr("a") + struct.pack("<I", 8) + struct.pack("<Q", 1 << 63)),
            "runs past the file",
        ),
        (header(gstr("a") + struct.pack("<IIQ", 9, 4, 1 << 63)), "runs past the file"),
        (header(gstr("a") + struct.pack("<IIQ", 9, 8, 1 << 62)), "runs past the file"),
        (header(struct.pack("<Q", 1 << 63) + b"key"), "runs past the file"),
        (header(num_kv=1 << 62), "runs past the file"),
        (header(gstr("a") + struct.pack("<I", 99) + b"\0" * 8), "unknown metadata type 99"),
        (header(kv_u32("general.alignment", 0)), "general.alignment 0 is not a power of two"),
        (header(kv_u32("general.alignment", 48)), "general.alignment 48 is not a power of two"),
        (
            header(tensors=tensor_info("w", (32, 2), 0, 4) + b"\0" * 512, num_tensors=1),
            "tensor 'w' is not 32-byte aligned",
        ),
        (
            header(tensors=tensor_info("w", (1,) * 9, 0, 0) + b"\0" * 64, num_tensors=1),
            "tensor 'w' has 9 dimensions",
        ),
        (
            header(tensors=tensor_info("w", (32, 2), 0, 0) + b"\0" * 8, num_tensors=1),
            "truncated? (tensor 'w' ends at byte",
        ),
        (
            header(tensors=tensor_info("w", (33, 2), 2, 0) + b"\0" * 512, num_tensors=1),
            "rows of (33,) do not fill 32-value blocks",
        ),
        (
            header(tensors=tensor_info("w", (32,), 77, 0) + b"\0" * 512, num_tensors=1),
            "unknown GGML type 77",
        ),
    ],
)
def test_a_malformed_header_is_one_named_error(body: bytes, problem: str, tmp_path: Path) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(body + b"\0" * 64)
    with pytest.raises(WeightsError) as caught:
        GgufReader.open(path)
    assert problem in str(caught.value) and str(caught.value).startswith(str(path))


def test_arrays_nested_too_deep_are_refused(tmp_path: Path) -> None:
    # key "a", type array of arrays ... of uint8, 50 deep: one level per (type 9, count 1)
    value = (
        b"".join(struct.pack("<IQ", 9, 1) for _ in range(50)) + struct.pack("<IQ", 0, 1) + b"\x07"
    )
    path = tmp_path / "deep.gguf"
    path.write_bytes(header(gstr("a") + struct.pack("<I", 9) + value) + b"\0" * 64)
    with pytest.raises(WeightsError, match="arrays nested more than 8 deep"):
        GgufReader.open(path)


def test_a_released_tensor_reads_back_the_same(tiny_mixed_gguf: Path) -> None:
    reader = GgufReader.open(tiny_mixed_gguf)
    info = reader.tensors["token_embd.weight"]
    before = reader.tensor_bytes(info).clone()
    reader.release(info)  # pages dropped from the process: the file still holds them
    assert np.array_equal(reader.tensor_bytes(info).numpy(), before.numpy())
