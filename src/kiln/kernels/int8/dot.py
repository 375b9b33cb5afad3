"""The dot-product form of the packed int8 kernels: which instructions a target's tiles
step with, and the tiles' shapes (docs/quantization.md).

When the target's ISA has an integer dot-product family (`kiln.target.isa.ISA.int8_dot`:
vpdpbusd, vpmaddwd on widened bytes, sdot/usdot), the packers (kiln.kernels.int8.packing)
store B in *words* (kiln.ops.quant_words): k in groups of 4, the 4 int8 weights of one
column and group packed into one int32, panels `[ceil(N / nr)][ceil(K / 4)][nr]`. The
kernel packs A's rows the same way at run time (`pack_a`, O(M K), zero-padded past K),
and its tile step is one `dot4_u8s8(acc, a_word, b_word)` per accumulator and group
(kiln.ir.tensor), which the llvm backend emits as the target's instructions.

The dot product multiplies *unsigned* bytes of A: an int8 A is shifted by +128
(`a + 128` is `a ^ 0x80` on the byte) and the shift is corrected like a zero point,
`sum((a + 128) * w) - 128 * colsum(w)` (kiln.ops.quant_words.a_shift).

Without VNNI (AVX2, AVX-512BW; the default `int8-pairs=exact`) the words hold *int16
pairs* instead (`k_group` 2, the planning family PAIRS16): two consecutive k of one
column per word, each value in a signed 16-bit half (A's unsigned bytes zero-extended,
the weights sign-extended), and the tile step is one `dot2_i16` per accumulator and 2 k:
one `vpmaddwd` and one add, the exact products, with no widening in the loop (the
operands were widened when they were packed: the weights at compile time, A's words at
run time, twice the bytes of the 4-k words).

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

from kiln.ir.shape_expr import is_static
from kiln.ir.tensor import (
    DOT2_I16,
    DOT4_U8S8,
    DOT4_U8S8_SAT16,
    Buffer,
    PrimExpr,
    Select,
    Stmt,
    Store,
    as_expr,
    compare,
    min_,
)
from kiln.kernels.tiles import loop as tile_loop
from kiln.ops import te
from kiln.ops.quant_words import GROUP, PAIR_GROUP, SATURATE, a_byte, saturates
from kiln.target.isa import ISA

#: The ISA families whose dot products the llvm backend emits (kiln.codegen.llvm.int_dot);
#: "dsp" (Arm Cortex-M): the c backend's helper runs two SMLADs per word (kiln_kernels.h).
FAMILIES = ("avx512vnni", "avxvnni", "avx512bw", "avx2", "i8mm", "sdot", "dsp")
EXACT_FAMILIES = ("avx512vnni", "avxvnni", "i8mm")  # one instruction, no temporaries
_WIDENED_FAMILIES = ("avx512bw", "avx2")  # vpmaddwd on bytes widened to int16
#: The tile planning family of `dot4_u8s8_sat16` on x86 (`target_isa(saturate=True)`):
#: `vpmaddubsw`, then `vpmaddwd` by ones and an add, per accumulator and word; registers
#: for the broadcast A word, the int16 pair sums and the ones.
MADDUBS = "maddubs"
_X86_FAMILIES = ("avx512vnni", "avxvnni", "avx512bw", "avx2")
#: The tile planning family of the exact products without VNNI (`target_isa()` on
#: AVX2 / AVX-512BW): words of int16 pairs, one `vpmaddwd` and an add per accumulator
#: and word (`dot2_i16`); a register for the broadcast word.
PAIRS16 = "pairs16"


def target_isa(isa: ISA, saturate: bool = False) -> ISA | None:
    """`isa` when it has a dot-product family kiln emits, else None; with `saturate`
    `isa` whatever its family (the saturating dot form runs on every target: portable
    code where there is no family)."""
    if saturate and isa.int8_dot in _X86_FAMILIES:
        return replace(isa, int8_dots=(MADDUBS,))
    if not saturate and isa.int8_dot in _WIDENED_FAMILIES:
        return replace(isa, int8_dots=(PAIRS16,))
    return isa if saturate or isa.int8_dot in FAMILIES else None


def target_saturates(isa: ISA) -> bool:
    """Whether the target of `isa` asks for onnxruntime's AVX2 int16 pair saturation
    (target attribute `int8-pairs=saturate`; default `exact`)."""
    return isa.int8_pairs == SATURATE


def dot_intrinsic(attrs: Mapping[str, Any]) -> str:
    """The tile step's intrinsic for a packed product with `attrs`."""
    if saturates(attrs):
        return DOT4_U8S8_SAT16
    return DOT2_I16 if attrs.get("k_group") == PAIR_GROUP else DOT4_U8S8


def k_group(isa: ISA) -> int:
    """k per packed word on `isa` (a `target_isa` result): 2 for int16 pairs, else 4."""
    return PAIR_GROUP if isa.int8_dot == PAIRS16 else GROUP


def tile_cols(isa: ISA) -> int:
    """Columns of a register tile: 4 int32 vectors with 32 registers, else 2."""
    return isa.lanes("int32") * (4 if isa.vector_registers >= 32 else 2)


def position_tile_cols(isa: ISA) -> int:
    """Columns of the widest positions tile of a convolution (output positions as the
    lanes): `tile_cols`, narrowed where one instruction accumulates (VNNI,
    `EXACT_FAMILIES`) to the profile's `int8_position_vectors`."""
    vectors = isa.profile.int8_position_vectors
    if vectors and isa.int8_dot in EXACT_FAMILIES:
        return min(tile_cols(isa), vectors * isa.lanes("int32"))
    return tile_cols(isa)


def tile_cols_for(isa: ISA, extent: int) -> int:
    """Columns of a register tile for `extent` columns in all (a convolution's output
    positions; its rows are output channels, a broadcast weight word each): the whole
    vectors (up to `position_tile_cols`) that leave the fewest padded columns in the last tile
    (14 x 14 = 196 output positions on AVX2: 25 tiles of one vector, 200, instead of 13
    of two, 208), the widest of equals; `extent` itself when it is below one vector.
    Where one instruction accumulates (VNNI, `EXACT_FAMILIES`), only widths whose tile
    holds the profile's `int8_min_accumulators` compete (fewer wait on the dot
    product's latency), and the last tile counts as narrowed to the vectors it fills
    (`computed_cols`), so the widest of them that leaves no partial tile (56 x 56 = 3136
    positions: 98 tiles of two vectors), else the widest: 196 positions on AVX-512 take
    4 tiles of three vectors and one of one, 208 columns, not 7 tiles of two, 224 (the
    int16-pair and `vpmaddubsw` tiles keep the widths their rules were measured with)."""
    lanes = isa.lanes("int32")
    if extent <= lanes:
        return extent
    widths = list(range(position_tile_cols(isa), 0, -lanes))
    if isa.int8_dot in EXACT_FAMILIES:
        enough = [nr for nr in widths if tile_rows(isa, nr) * (nr // lanes)
                  >= isa.profile.int8_min_accumulators]
        widths = enough or widths
        # the last tile narrowed, every width computes the same columns: the widest
        # of those that leave no partial tile (one tile body to compile), else the widest
        return min(widths, key=lambda nr: (computed_cols(extent, nr, lanes), extent % nr > 0))
    return min(widths, key=lambda nr: -(-extent // nr) * nr)


def computed_cols(extent: int, nr: int, lanes: int) -> int:
    """Columns the positions tiles `nr` wide compute for `extent` positions on an im2col:
    whole tiles, and a last one of the vectors it fills (`tail_cols`)."""
    rest = extent % nr
    return extent - rest + (tail_cols(rest, nr, lanes) if rest else 0)


def tail_cols(rest: int, nr: int, lanes: int) -> int:
    """Columns of a positions tile's last column tile, which holds `rest` of the tile's
    `nr` positions (0: none): the whole vectors of `lanes` that cover them, as the tiles
    compute it (kiln.kernels.int8.conv_tiles.position_tiles on an im2col: the padded
    columns' products are a partial tile's only waste); `nr` without `lanes`."""
    if lanes <= 0 or nr % lanes:
        return nr
    return min(nr, -(-rest // lanes) * lanes)


def tile_rows(isa: ISA, nr: int) -> int:
    """Rows of a register tile of `nr` columns: the accumulators fill the registers
    left after the B row and the family's temporaries (at most 8 rows)."""
    if not isa.vector_bits:
        return 2  # scalar registers (Cortex-M: 2 x 2 accumulators, 2 + 2 words)
    vectors = max(1, -(-nr // isa.lanes("int32")))
    # one instruction (and int16 pairs: vpmaddwd + add): the broadcast A word.
    # vpmaddwd on bytes widened in the loop (kiln.codegen.llvm.int_dot, the families
    # themselves; the ops plan PAIRS16 for them): B's row widened to two registers a
    # vector, A's even and odd halves, a product and the mask. sdot: A shifted, its
    # correction
    b_row, spare = ((vectors, 1) if isa.int8_dot in (*EXACT_FAMILIES, PAIRS16)
                    else (2 * vectors, 4) if isa.int8_dot in _WIDENED_FAMILIES
                    else (vectors, 3) if isa.int8_dot == MADDUBS
                    else (vectors, 6))
    return max(1, min(8, (isa.vector_registers - b_row - spare) // vectors))


def pack_word(values: Callable[[int], PrimExpr], group: int = GROUP) -> PrimExpr:
    """One word of `group` A values `values(i)` (int32 in [0, 255]: unsigned bytes, or
    int16 halves holding them), computed without overflow: a top byte enters signed."""
    total: PrimExpr = as_expr(0, "int32")
    for i in range(group):
        value = values(i)
        if group == GROUP and i == GROUP - 1:
            value = Select(compare("ge", value, 128), value - 256, value)
        total = total + value * (1 << (32 // group * i))
    return total


def a_word(a: Buffer, lead: tuple[int, ...] | None, row: PrimExpr, g: PrimExpr,
           group: int = GROUP) -> PrimExpr:
    """Group `g` of A's row `row` as one word of `group` unsigned bytes (or int16
    halves; zero past K). `lead`: A's leading dims (its rows flattened); None: A is
    2-D, indexed by `row` itself (rows of a symbolic count)."""
    k_extent = int(a.shape[-1])

    def value(i: int) -> PrimExpr:
        k = g * group + i
        rows = te.unflatten_index(row, lead) if lead is not None else (row,)
        index = (*rows, k if k_extent % group == 0 else min_(k, k_extent - 1))
        byte = a_byte(a[index])
        if k_extent % group:
            byte = Select(compare("lt", k, k_extent), byte, as_expr(0, "int32"))
        return byte

    return pack_word(value, group)


def pack_a(a: Buffer, words_out: Buffer, kind: str, group: int = GROUP) -> Stmt:
    """`words_out[row, g] = a_word(...)` for every row of A (its leading dims flattened;
    with a symbolic row count, A is 2-D)."""
    if not is_static(tuple(a.shape)):
        groups = int(words_out.shape[1])
        return tile_loop("i", words_out.shape[0], lambda i: tile_loop(
            "g", groups, lambda g: Store(words_out, a_word(a, None, i, g, group), (i, g))),
            kind)
    lead = tuple(int(d) for d in a.shape[:-1])
    rows, groups = int(words_out.shape[0]), int(words_out.shape[1])
    return tile_loop("i", rows, lambda i: tile_loop(
        "g", groups, lambda g: Store(words_out, a_word(a, lead, i, g, group), (i, g))), kind)
