"""The dot-product form of the packed integer matrix products (docs/quantization.md).

When the target's ISA has an integer dot-product family (`kiln.target.isa.ISA.int8_dot`:
vpdpbusd, vpmaddwd on widened bytes, sdot/usdot), `quant_kernels.pack` stores B in *words*: k in
groups of 4, the 4 int8 weights of one column and group packed into one int32
(byte i = k 4g + i), panels `[ceil(N / nr)][ceil(K / 4)][nr]`. The kernel packs A's
rows the same way at run time (`pack_a`, O(M K), zero-padded past K), and its tile
step is one `dot4_u8s8(acc, a_word, b_word)` per accumulator and group
(kiln.ir.tensor), which the llvm backend emits as the target's instructions.

The dot product multiplies *unsigned* bytes of A: an int8 A is shifted by +128
(`a + 128` is `a ^ 0x80` on the byte) and the shift is corrected like a zero point,
`sum((a + 128) * w) - 128 * colsum(w)` (`a_shift`).

With the target attribute `int8-pairs=saturate` the products are onnxruntime's AVX2
ones instead of ONNX's exact sums (docs/quantization.md): the packed op carries
`pairs="saturate"`, every target takes the dot form (a portable one where the ISA has no
family), and the tile step is `dot4_u8s8_sat16`, which adds the products of k = 2p and
2p + 1 into an int16 clamped to [-32768, 32767] (`vpmaddubsw`), as MLAS does.

The tile has `nr` columns (whole vector registers of int32 lanes) and `tile_rows()` rows,
both from the ISA's vector registers, so accumulators, one B row and a broadcast A word
stay in registers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from kiln.ir.tensor import (
    DOT4_U8S8,
    DOT4_U8S8_SAT16,
    Buffer,
    Cast,
    PrimExpr,
    Select,
    Stmt,
    Store,
    as_expr,
    compare,
    max_,
    min_,
)
from kiln.ops import te
from kiln.target.isa import ISA, isa_for

#: k per packed word
GROUP = 4
#: The ISA families whose dot products the llvm backend emits (kiln.codegen.llvm.int_dot);
#: "dsp" (Arm Cortex-M): the c backend's helper runs two SMLADs per word (kiln_kernels.h).
FAMILIES = ("avx512vnni", "avxvnni", "avx512bw", "avx2", "i8mm", "sdot", "dsp")
_EXACT_FAMILIES = ("avx512vnni", "avxvnni", "i8mm")  # one instruction, no temporaries
_WIDENED_FAMILIES = ("avx512bw", "avx2")  # vpmaddwd on bytes widened to int16
#: The tile planning family of `dot4_u8s8_sat16` on x86 (`target_isa(saturate=True)`):
#: `vpmaddubsw`, then `vpmaddwd` by ones and an add, per accumulator and word; registers
#: for the broadcast A word, the int16 pair sums and the ones.
MADDUBS = "maddubs"
_X86_FAMILIES = ("avx512vnni", "avxvnni", "avx512bw", "avx2")


#: The `pairs` attribute of a packed product whose pair sums saturate to int16
#: (the target attribute `int8-pairs=saturate`); absent: ONNX's exact sums.
SATURATE = "saturate"


def target_isa(saturate: bool = False) -> ISA | None:
    """The current target's ISA when it has a dot-product family kiln emits, else None;
    with `saturate` the ISA whatever its family (the saturating dot form runs on every
    target: portable code where there is no family)."""
    isa = isa_for(None)
    if saturate and isa.int8_dot in _X86_FAMILIES:
        return replace(isa, int8_dots=(MADDUBS,))
    return isa if saturate or isa.int8_dot in FAMILIES else None


def target_saturates() -> bool:
    """Whether the current target asks for onnxruntime's AVX2 int16 pair saturation
    (target attribute `int8-pairs=saturate`; default `exact`)."""
    from kiln.target.target import Target

    target = Target.current()
    return target is not None and target.attrs.get("int8-pairs") == SATURATE


def saturates(attrs: Mapping[str, Any]) -> bool:
    """Whether a packed product's attributes ask for saturating pair sums."""
    return attrs.get("pairs") == SATURATE


def dot_intrinsic(attrs: Mapping[str, Any]) -> str:
    """The tile step's intrinsic for a packed product with `attrs`."""
    return DOT4_U8S8_SAT16 if saturates(attrs) else DOT4_U8S8


def clamp16(value: PrimExpr) -> PrimExpr:
    """An int32 pair sum clamped to int16's range (what `vpmaddubsw` stores)."""
    return min_(max_(value, as_expr(-32768, "int32")), as_expr(32767, "int32"))


def saturated_sum(product: Callable[[PrimExpr], PrimExpr], k_total: int) -> PrimExpr:
    """The te reduction of `int8-pairs=saturate`: the int32 `product(k)` of every
    k < `k_total` summed in pairs (k = 2p, 2p + 1), each pair clamped to int16 (an odd
    K's last pair one product)."""
    def at(k: PrimExpr) -> PrimExpr:
        value = product(min_(k, k_total - 1))
        return value if k_total % 2 == 0 else Select(compare("lt", k, k_total), value,
                                                     as_expr(0, "int32"))

    return te.reduce("sum", lambda p: clamp16(at(2 * p) + at(2 * p + 1)),
                     (-(-k_total // 2),), "int32")


def saturated_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """`a @ b` (int64 `[..., K]` x `[K][N]`) with the products of k = 2p and 2p + 1
    added first and clamped to int16 (`dot4_u8s8_sat16`'s pairs): the reference of the
    saturating products."""
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    k = a.shape[-1]
    if k % 2:
        a = np.concatenate([a, np.zeros((*a.shape[:-1], 1), np.int64)], axis=-1)
        b = np.concatenate([b, np.zeros((1, b.shape[1]), np.int64)], axis=0)
    total = np.zeros((*a.shape[:-1], b.shape[1]), np.int64)
    for p in range(0, a.shape[-1], 2):
        pair = a[..., p, None] * b[p] + a[..., p + 1, None] * b[p + 1]
        total += np.clip(pair, -32768, 32767)
    return total


def widens(isa: ISA) -> bool:
    """Whether the ISA's dot product widens bytes to int16 for `vpmaddwd` (its operands
    cost instructions of their own: `_widened_step`)."""
    return isa.int8_dot in _WIDENED_FAMILIES


def tile_cols(isa: ISA) -> int:
    """Columns of a register tile: 4 int32 vectors with 32 registers, else 2."""
    return isa.lanes("int32") * (4 if isa.vector_registers >= 32 else 2)


def tile_cols_for(isa: ISA, extent: int) -> int:
    """Columns of a register tile for `extent` columns in all (a convolution's output
    positions; its rows are output channels, a broadcast weight word each): the whole
    vectors (up to `tile_cols`) that leave the fewest padded columns in the last tile
    (14 x 14 = 196 output positions: 13 tiles of one vector, 208, instead of 4 of four,
    256), the widest of equals; `extent` itself when it is below one vector. Where
    `vpmaddwd` widens the bytes (`_WIDENED_FAMILIES`), the widening is paid per row and
    vector, so the width with the fewest instructions for all columns wins instead."""
    lanes = isa.lanes("int32")
    if extent <= lanes:
        return extent
    widths = range(tile_cols(isa), 0, -lanes)
    if isa.int8_dot in _WIDENED_FAMILIES:
        return min(widths, key=lambda nr: -(-extent // nr) * _widened_step(isa, nr))
    return min(widths, key=lambda nr: -(-extent // nr) * nr)


def _widened_step(isa: ISA, nr: int) -> float:
    """Vector instructions per row of a step of 4 k of a `vpmaddwd` tile `nr` columns
    wide whose rows broadcast the signed word (kiln.codegen.llvm.int_dot): per row a
    broadcast and three shifts, per vector a load, a mask and a shift, per accumulator
    two `vpmaddwd` and two adds."""
    vectors = -(-nr // isa.lanes("int32"))
    rows = tile_rows(isa, nr)
    return (4 * rows + 3 * vectors + 4 * rows * vectors) / rows


def tile_rows(isa: ISA, nr: int) -> int:
    """Rows of a register tile of `nr` columns: the accumulators fill the registers
    left after the B row and the family's temporaries (at most 8 rows)."""
    if not isa.vector_bits:
        return 2  # scalar registers (Cortex-M: 2 x 2 accumulators, 2 + 2 words)
    vectors = max(1, -(-nr // isa.lanes("int32")))
    # one instruction: the broadcast A word. vpmaddwd on int16 halves
    # (kiln.codegen.llvm.int_dot): B's row widened to two registers a vector, A's
    # even and odd halves, a product and the mask. sdot: A shifted, its correction
    b_row, spare = ((vectors, 1) if isa.int8_dot in _EXACT_FAMILIES
                    else (2 * vectors, 4) if isa.int8_dot in _WIDENED_FAMILIES
                    else (vectors, 3) if isa.int8_dot == MADDUBS
                    else (vectors, 6))
    return max(1, min(8, (isa.vector_registers - b_row - spare) // vectors))


def words(b: np.ndarray) -> np.ndarray:
    """int8 `[K][N]` as int32 words `[ceil(K / 4)][N]`, byte i of word g = row 4g + i
    (by value: `sum(byte_i << 8i)`, the top byte signed), rows past K zero."""
    k, n = b.shape
    groups = -(-k // GROUP)
    # bytes in place (two's complement, as `& 0xFF` would give), each column's 4 rows
    # of a group made adjacent and read as one little-endian word: a byte copy and a
    # transpose instead of int64 shifts and sums (ResNet-50's weights: 0.25 -> 0.03 s)
    padded = np.zeros((groups * GROUP, n), np.uint8)
    padded[:k] = np.asarray(b).astype(np.uint8, casting="unsafe")
    quads = np.ascontiguousarray(padded.reshape(groups, GROUP, n).transpose(0, 2, 1))
    return quads.view(np.dtype("<i4")).reshape(groups, n).astype(np.int32)


def unwords(w: np.ndarray, k: int) -> np.ndarray:
    """`words` undone along axis -2 (any leading axes): int8 rows `[..., K, N]`."""
    u = np.asarray(w).astype(np.uint32).astype(np.int64)
    parts = [((u >> (8 * i)) & 0xFF) for i in range(GROUP)]
    stacked = np.stack(parts, axis=-2)  # [..., groups, 4, N]
    rows = stacked.reshape(*w.shape[:-2], w.shape[-2] * GROUP, w.shape[-1])[..., :k, :]
    return rows.astype(np.uint8).view(np.int8)


def a_shift(dtype: str) -> int:
    """What the dot form adds to each byte of an A of `dtype` (unsigned bytes only)."""
    return 128 if dtype == "int8" else 0


def a_byte(value: PrimExpr) -> PrimExpr:
    """An element of A as the dot product's unsigned byte (int32 in [0, 255])."""
    return Cast("int32", value) + a_shift(value.dtype)


def b_byte(word: PrimExpr, k: PrimExpr) -> PrimExpr:
    """Row `k` (of the whole K) of a B word, as a signed int32."""
    byte = (word >> Cast("int32", (k % GROUP) * 8)) & 255
    return (byte ^ 128) - 128


def a_word(a: Buffer, lead: tuple[int, ...], row: PrimExpr, g: PrimExpr) -> PrimExpr:
    """Group `g` of A's row `row` as one word of unsigned bytes (zero past K), an int32
    computed without overflow: the top byte enters signed."""
    k_extent = int(a.shape[-1])
    total: PrimExpr = as_expr(0, "int32")
    for i in range(GROUP):
        k = g * GROUP + i
        index = (*te.unflatten_index(row, lead), k if k_extent % GROUP == 0 else
                 min_(k, k_extent - 1))
        byte = a_byte(a[index])
        if i == GROUP - 1:
            byte = Select(compare("ge", byte, 128), byte - 256, byte)
        if k_extent % GROUP:
            byte = Select(compare("lt", k, k_extent), byte, as_expr(0, "int32"))
        total = total + byte * (1 << (8 * i))
    return total


def pack_a(a: Buffer, words_out: Buffer, kind: str) -> Stmt:
    """`words_out[row, g] = a_word(...)` for every row of A (its leading dims flattened)."""
    from kiln.ops.kernels.tiles import loop as tile_loop

    lead = tuple(int(d) for d in a.shape[:-1])
    rows, groups = int(words_out.shape[0]), int(words_out.shape[1])
    return tile_loop("i", rows, lambda i: tile_loop(
        "g", groups, lambda g: Store(words_out, a_word(a, lead, i, g), (i, g))), kind)
