"""GgufReader: a GGUF file's header parsed in one pass, its tensors views of one memory map.

The `gguf` package's reader builds a numpy view per metadata item, which takes seconds for a
150k-token vocabulary; this one walks the header with `struct` and slices strings out of one
buffer, a small fraction of that. Tensor data is never
read here: `tensor_bytes(info)` is a uint8 view of a read-only map of the whole
file, so a weight is paged in when a packer reads it and costs no copy until then.

Layout (GGUF v2/v3): magic, version u32, tensor count u64, metadata count u64; metadata as
(key, type u32, value); tensor infos as (name, n_dims u32, dims u64 x n, type u32, offset u64);
then data, aligned to `general.alignment` (32 by default), each tensor at its offset.
"""

from __future__ import annotations

import mmap
import struct
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nanoserve.runtime.errors import WeightsError

GGUF_MAGIC = b"GGUF"
_DEFAULT_ALIGNMENT = 32
# GGUF metadata value types: scalar struct formats by type id; 8 string, 9 array.
_SCALARS = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}
_NUMPY = {0: "u1", 1: "i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8"}
_NUMPY |= {11: "<i8", 12: "<f8"}
_STRING, _ARRAY = 8, 9
_MAX_DEPTH = 8  # arrays of arrays: real files nest none


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    type_id: int  # GGML's type number (gguf.GGMLQuantizationType)
    dims: tuple[int, ...]  # as stored: fastest-varying first (the reverse of torch)
    offset: int  # from the start of the file
    num_bytes: int

    @property
    def shape(self) -> tuple[int, ...]:
        """Torch order: rows first."""
        return tuple(reversed(self.dims))


@dataclass(frozen=True, slots=True)
class GgufReader:
    path: Path
    version: int
    metadata: dict[str, Any]
    tensors: dict[str, TensorInfo]  # in file order
    _buffer: torch.Tensor = field(repr=False, compare=False)  # [file bytes] uint8, mapped
    _map: mmap.mmap = field(repr=False, compare=False)

    @classmethod
    def open(cls, path: str | Path) -> GgufReader:
        path = Path(path)
        try:
            with path.open("rb") as file:
                magic = file.read(4)
                if magic != GGUF_MAGIC:
                    raise WeightsError(
                        path, f"is not a GGUF file (starts with {magic!r}, not {GGUF_MAGIC!r})"
                    )
                size = path.stat().st_size
                if size < 24:
                    raise WeightsError(path, "cannot be parsed as GGUF, truncated? (no header)")
                # Shared and read-only: faults map the page cache's pages in runs (a private
                # map faults them one by one: 7x slower to touch here).
                mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as error:
            raise WeightsError(path, f"cannot be read ({error.strerror})") from None
        try:
            version, metadata, infos, end = _parse(mapped)
        except (struct.error, UnicodeDecodeError, ValueError, IndexError, OverflowError) as error:
            raise WeightsError(path, f"cannot be parsed as GGUF, truncated? ({error})") from None
        alignment = metadata.get("general.alignment", _DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment < 1 or alignment & (alignment - 1):
            raise WeightsError(path, f"general.alignment {alignment!r} is not a power of two")
        data_start = -(-end // alignment) * alignment
        tensors: dict[str, TensorInfo] = {}
        for name, dims, type_id, offset in infos:
            nbytes = _tensor_bytes(type_id, dims, path, name)
            begin = data_start + offset
            if offset % alignment:
                raise WeightsError(path, f"tensor {name!r} is not {alignment}-byte aligned")
            if begin + nbytes > size:
                raise WeightsError(
                    path,
                    f"cannot be parsed as GGUF, truncated? (tensor {name!r} ends at byte"
                    f" {begin + nbytes} of a {size}-byte file)",
                )
            tensors[name] = TensorInfo(name, type_id, dims, begin, nbytes)
        with warnings.catch_warnings():  # read-only by design: nothing writes a weight
            warnings.filterwarnings("ignore", "The given buffer is not writable")
            buffer = torch.frombuffer(mapped, dtype=torch.uint8)
        return cls(path, version, metadata, tensors, buffer, mapped)

    def tensor_bytes(self, info: TensorInfo) -> torch.Tensor:
        """[num_bytes] uint8: the tensor as stored, a view of the map (no copy)."""
        return self._buffer[info.offset : info.offset + info.num_bytes]

    def release(self, info: TensorInfo) -> None:
        """Drop the tensor's pages from this process (a packer has read them): they stop
        counting in its RSS, and a later read faults them in again from the file."""
        page = mmap.PAGESIZE
        start = info.offset // page * page
        end = min(-(-(info.offset + info.num_bytes) // page) * page, len(self._map))
        if end > start:
            self._map.madvise(mmap.MADV_DONTNEED, start, end - start)

    def tensor_rows(self, info: TensorInfo) -> torch.Tensor:
        """[rows, bytes per row] uint8 view: one row per output feature (torch's dim 0)."""
        rows = info.shape[0] if len(info.dims) > 1 else 1
        return self.tensor_bytes(info).view(rows, info.num_bytes // rows)


def _parse(
    buf: mmap.mmap,
) -> tuple[int, dict[str, Any], list[tuple[str, tuple[int, ...], int, int]], int]:
    (version,) = struct.unpack_from("<I", buf, 4)
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version} is not supported (2 or 3)")
    num_tensors, num_kv = struct.unpack_from("<QQ", buf, 8)
    at = 24
    u64 = struct.Struct("<Q").unpack_from

    size = len(buf)

    def fits(at: int, length: int) -> None:
        # A length past the file is a corrupt header, said as one, not an OverflowError later.
        if length > size - at:
            raise ValueError(f"a field of {length} bytes at byte {at} runs past the file")

    def string(at: int) -> tuple[str, int]:
        (length,) = u64(buf, at)
        at += 8
        fits(at, length)
        return buf[at : at + length].decode(), at + length

    def strings(count: int, at: int) -> tuple[list[str], int]:
        # A vocabulary is ~150k of these: one tight loop, no call per item.
        fits(at, 8 * count)
        out: list[str] = []
        append = out.append
        for _ in range(count):
            (length,) = u64(buf, at)
            at += 8
            fits(at, length)
            append(buf[at : at + length].decode())
            at += length
        return out, at

    def value(kind: int, at: int, depth: int = 0) -> tuple[Any, int]:
        if kind == _STRING:
            return string(at)
        if kind in _SCALARS:
            fmt = "<" + _SCALARS[kind]
            return struct.unpack_from(fmt, buf, at)[0], at + struct.calcsize(fmt)
        if kind != _ARRAY:
            raise ValueError(f"unknown metadata type {kind}")
        if depth >= _MAX_DEPTH:
            raise ValueError(f"arrays nested more than {_MAX_DEPTH} deep")
        item, count = struct.unpack_from("<IQ", buf, at)
        at += 12
        if item in _NUMPY:
            dtype = np.dtype(_NUMPY[item])
            fits(at, count * dtype.itemsize)
            values = np.frombuffer(buf, dtype, count, at)
            return values.tolist(), at + count * dtype.itemsize
        if item == _STRING:
            return strings(count, at)
        fits(at, count)  # every item takes at least a byte
        items = []
        for _ in range(count):
            one, at = value(item, at, depth + 1)
            items.append(one)
        return items, at

    metadata: dict[str, Any] = {}
    fits(at, 13 * num_kv)  # a key-value pair is at least 13 bytes
    for _ in range(num_kv):
        key, at = string(at)
        (kind,) = struct.unpack_from("<I", buf, at)
        metadata[key], at = value(kind, at + 4)
    infos = []
    fits(at, 24 * num_tensors)  # a tensor's info is at least 24 bytes
    for _ in range(num_tensors):
        name, at = string(at)
        (ndims,) = struct.unpack_from("<I", buf, at)
        if ndims > 8:
            raise ValueError(f"tensor {name!r} has {ndims} dimensions")
        dims = struct.unpack_from(f"<{ndims}Q", buf, at + 4)
        at += 4 + 8 * ndims
        type_id, offset = struct.unpack_from("<IQ", buf, at)
        at += 12
        infos.append((name, tuple(int(d) for d in dims), type_id, offset))
    return version, metadata, infos, at


def _tensor_bytes(type_id: int, dims: tuple[int, ...], path: Path, name: str) -> int:
    from nanoserve.runtime.loading.gguf_types import block_geometry

    geometry = block_geometry(type_id)
    if geometry is None:
        raise WeightsError(path, f"tensor {name!r} has unknown GGML type {type_id}")
    block, nbytes = geometry
    if not dims or dims[0] % block:
        raise WeightsError(
            path, f"tensor {name!r} rows of {dims[:1]} do not fill {block}-value blocks"
        )
    count = 1
    for d in dims:
        count *= d
    return count // block * nbytes
