"""GGML's tensor types: their numbers, names and block geometry, and which nanoserve reads how.

A GGUF tensor names its type by GGML's number. Every type has a block: `block` values stored
in `block_bytes` bytes (1 and 4 for F32). This table is the loader's; the kernels' own table
(kernels/csrc/weight_types.cpp) lists the types they pack and dot, and a test holds the two,
and the `gguf` package's sizes, to one another.

- KERNEL_TYPES: read by a dot kernel from their own blocks (packed, never rounded again);
- FLOAT_TYPES: plain floats, read as they are;
- every other type is dequantized (by the `gguf` package) where a float is needed, and a
  linear in it is served re-quantized, said at boot.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GgmlType:
    name: str  # "Q4_K", as GGUF and llama.cpp spell it
    number: int  # GGML's type number
    block: int  # values per block
    block_bytes: int  # bytes per block

    @property
    def label(self) -> str:
        """How the boot line and /health name it: "q4_k"."""
        return self.name.lower()

    def row_bytes(self, width: int) -> int:
        return width // self.block * self.block_bytes


_TYPES = (
    GgmlType("F32", 0, 1, 4),
    GgmlType("F16", 1, 1, 2),
    GgmlType("Q4_0", 2, 32, 18),
    GgmlType("Q4_1", 3, 32, 20),
    GgmlType("Q5_0", 6, 32, 22),
    GgmlType("Q5_1", 7, 32, 24),
    GgmlType("Q8_0", 8, 32, 34),
    GgmlType("Q8_1", 9, 32, 40),
    GgmlType("Q2_K", 10, 256, 84),
    GgmlType("Q3_K", 11, 256, 110),
    GgmlType("Q4_K", 12, 256, 144),
    GgmlType("Q5_K", 13, 256, 176),
    GgmlType("Q6_K", 14, 256, 210),
    GgmlType("Q8_K", 15, 256, 292),
    GgmlType("IQ2_XXS", 16, 256, 66),
    GgmlType("IQ2_XS", 17, 256, 74),
    GgmlType("IQ3_XXS", 18, 256, 98),
    GgmlType("IQ1_S", 19, 256, 50),
    GgmlType("IQ4_NL", 20, 32, 18),
    GgmlType("IQ3_S", 21, 256, 110),
    GgmlType("IQ2_S", 22, 256, 82),
    GgmlType("IQ4_XS", 23, 256, 136),
    GgmlType("I8", 24, 1, 1),
    GgmlType("I16", 25, 1, 2),
    GgmlType("I32", 26, 1, 4),
    GgmlType("I64", 27, 1, 8),
    GgmlType("F64", 28, 1, 8),
    GgmlType("IQ1_M", 29, 256, 56),
    GgmlType("BF16", 30, 1, 2),
    GgmlType("TQ1_0", 34, 256, 54),
    GgmlType("TQ2_0", 35, 256, 66),
    GgmlType("MXFP4", 39, 32, 17),
)
GGML_TYPES: dict[int, GgmlType] = {t.number: t for t in _TYPES}
BY_NAME: dict[str, GgmlType] = {t.name: t for t in _TYPES}

KERNEL_TYPES = frozenset(
    {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "MXFP4"}
)
FLOAT_TYPES = frozenset({"F32", "F16", "BF16"})
# What nanoserve's own code dequantizes (kernels/csrc/weight_types.cpp), bit for bit as the file
# defines the values; any other type goes through the `gguf` package.
DEQUANTIZED_HERE = KERNEL_TYPES | FLOAT_TYPES


def block_geometry(number: int) -> tuple[int, int] | None:
    """(values per block, bytes per block) of GGML type `number`, or None for an unknown one."""
    t = GGML_TYPES.get(number)
    return None if t is None else (t.block, t.block_bytes)
