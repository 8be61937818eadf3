"""KvCacheDtype: how the K/V pool stores each value, K's form and V's (`--kv-cache-dtype`).

A float form keeps head_dim values per (slot, head): float32, bfloat16 or float16, the same for
K and V. A block form keeps GGUF blocks of 32 values, as llama.cpp's `-ctk/-ctv` caches do:

    q8_0  34 bytes a block: an fp16 scale d, then 32 int8 q; value = q * d
    q4_0  18 bytes a block: d, then 16 bytes of nibbles (value j low, value j + 16 high);
          value = (q - 8) * d

K and V may take different block forms (`k=q8_0,v=q4_0`). A pool of blocks keeps each
(slot, head) row as its K blocks then its V blocks, in bytes (kernels/csrc/kv_blocks.h reads
and writes them; `dequantize_row` here is the same arithmetic in torch, for checks).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nanoserve.core.errors import NanoserveError

FLOAT_FORMS: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
BLOCK_BYTES: dict[str, int] = {"q8_0": 34, "q4_0": 18}  # per 32 values
BLOCK = 32
# The kernels' numbers for each form (kernel_table.h's KvType).
KERNEL_CODES: dict[str, int] = {"float32": 0, "bfloat16": 1, "float16": 2, "q8_0": 3, "q4_0": 4}
CHOICES = "auto, float32, bfloat16, float16, q8_0, q4_0, or k=<form>,v=<form>"


class KvCacheDtypeError(NanoserveError):
    """A --kv-cache-dtype that names no form, or a pair the pool cannot hold."""


@dataclass(frozen=True, slots=True)
class KvCacheDtype:
    k: str
    v: str

    def __post_init__(self) -> None:
        for name, form in (("k", self.k), ("v", self.v)):
            if form not in KERNEL_CODES:
                named = f"{form!r}" if self.k == self.v else f"{name}={form!r}"
                raise KvCacheDtypeError(
                    f"--kv-cache-dtype: {named} is not a K/V form; choose {CHOICES}"
                )
        if (self.k in BLOCK_BYTES) != (self.v in BLOCK_BYTES) or (
            self.k in FLOAT_FORMS and self.k != self.v
        ):
            raise KvCacheDtypeError(
                f"--kv-cache-dtype: k={self.k} with v={self.v} is not a pool nanoserve keeps: K and"
                " V share one float form, or each takes a block form (q8_0, q4_0)"
            )

    @classmethod
    def of(cls, dtype: torch.dtype) -> KvCacheDtype:
        """The float form of a torch dtype, for K and V."""
        name = str(dtype).removeprefix("torch.")
        return cls(name, name)

    @property
    def blocks(self) -> bool:
        """The pool keeps GGUF blocks (bytes), not float values."""
        return self.k in BLOCK_BYTES

    @property
    def torch_dtype(self) -> torch.dtype:
        """The pool tensor's element type: the float form's, or bytes."""
        return torch.uint8 if self.blocks else FLOAT_FORMS[self.k]

    @property
    def kernel_types(self) -> tuple[int, ...]:
        """What the kernels take as `kv_types`: () for a float pool, else K's and V's codes."""
        return (KERNEL_CODES[self.k], KERNEL_CODES[self.v]) if self.blocks else ()

    def row_bytes(self, head_dim: int) -> int:
        """Bytes of one slot's K and V of one head."""
        return form_bytes(self.k, head_dim) + form_bytes(self.v, head_dim)

    def __str__(self) -> str:
        return self.k if self.k == self.v else f"k={self.k},v={self.v}"


def form_bytes(form: str, head_dim: int) -> int:
    """Bytes of head_dim values in one form."""
    if form in BLOCK_BYTES:
        if head_dim % BLOCK:
            raise KvCacheDtypeError(
                f"--kv-cache-dtype {form} keeps blocks of {BLOCK} values; this model's head_dim"
                f" {head_dim} is not a multiple of {BLOCK}"
            )
        return head_dim // BLOCK * BLOCK_BYTES[form]
    return head_dim * FLOAT_FORMS[form].itemsize


def parse_kv_cache_dtype(text: str, auto: torch.dtype) -> KvCacheDtype:
    """`auto` (the engine's own choice, `auto`), one form for both, or `k=<form>,v=<form>`."""
    spec = text.strip().lower()
    if spec in ("", "auto"):
        return KvCacheDtype.of(auto)
    if "=" not in spec:
        return KvCacheDtype(spec, spec)
    parts: dict[str, str] = {}
    for item in spec.split(","):
        key, _, form = item.partition("=")
        if key.strip() not in ("k", "v") or key.strip() in parts:
            raise KvCacheDtypeError(f"--kv-cache-dtype {text!r}: expected {CHOICES}")
        parts[key.strip()] = form.strip()
    if set(parts) != {"k", "v"}:
        raise KvCacheDtypeError(f"--kv-cache-dtype {text!r}: name both k= and v=")
    return KvCacheDtype(parts["k"], parts["v"])


def dequantize_row(row: torch.Tensor, form: str, head_dim: int) -> torch.Tensor:
    """float32 values of rows of blocks ([..., bytes] uint8 -> [..., head_dim]), each q * d
    rounded once in float32, as the kernels and the `gguf` package read them."""
    blocks = row.reshape(*row.shape[:-1], head_dim // BLOCK, BLOCK_BYTES[form])
    d = blocks[..., :2].contiguous().view(torch.float16).float()  # [..., n, 1]
    if form == "q8_0":
        q = blocks[..., 2:].contiguous().view(torch.int8).float()
    else:
        packed = blocks[..., 2:].to(torch.int16)
        q = (torch.cat((packed & 15, packed >> 4), dim=-1) - 8).float()
    return (q * d).reshape(*row.shape[:-1], head_dim)


def check_kv_form(
    kv: KvCacheDtype, *, kernels: bool, device: str, head_dim: int | None = None
) -> None:
    """Refuse, in one line naming the flag, a form this model's attention cannot read: blocks
    are read by nanoserve's CPU kernels only, and hold whole blocks of a head (head_dim None:
    not known yet)."""
    if kv.blocks and not kernels:
        where = (
            "on a CUDA device"
            if device.startswith("cuda")
            else "without them (its weights are dense: --quantize none, or a file with no blocks)"
        )
        raise KvCacheDtypeError(
            f"--kv-cache-dtype {kv}: K/V blocks are read by nanoserve's CPU kernels only, and"
            f" this model runs {where}; choose auto, float16, bfloat16 or float32"
        )
    if head_dim is not None:
        kv.row_bytes(head_dim)
