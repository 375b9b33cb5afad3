"""The bf16 GEMM's register tile on AMX tiles (kiln.ir.amx), for targets with
`amx-bf16` (Sapphire Rapids and later; `-mcpu=sapphirerapids` or
`-mattr=+amx-tile,+amx-bf16`) and `precision=bf16`.

The packing is the AVX512-BF16 kernel's (kiln.ops.gemm_bf16.pack_b_bf16): with panels
16 or 32 columns wide, K padded to whole blocks of 32, a panel is a column of B tiles of
16 words (pairs of K) by 16 or 32 columns, each tile row 64 contiguous bytes: the layout
`tileloadd` reads, pairing K the way A's converted rows pair it (kiln.kernels.gemm.bf16:
`convert_rows`). A tile of the kernel is `mr` = 16 or 32 rows (one or two A tiles) by
`nr` = 16 or 32 columns (one or two B tiles), so its accumulators, A and B tiles fill
at most the eight tile registers (2 x 2: four accumulators, two A, two B tiles).
Rows past M read the last row, columns past N multiply zero weights, K past its end
is zero (as on the AVX512-BF16 path); the float32 stage then goes through the fused
epilogue.
"""

from __future__ import annotations

from typing import Any

from kiln.ir.amx import (
    AMX_TILE_CONFIG,
    AMX_TILE_RELEASE,
    TILE_ROWS,
    TILE_WORDS,
    amx_bf16_block,
)
from kiln.ir.tensor import Buffer, CallExtern, Const, Evaluate, PrimExpr, Stmt
from kiln.target.isa import ISA

#: The tile sides (rows of A, columns of B) a kernel tile may have: one or two tiles.
AMX_SIDES = (TILE_ROWS, 2 * TILE_ROWS)


def uses_amx(isa: ISA) -> bool:
    """Whether the bf16 GEMM runs on AMX tiles on `isa` (precision bf16, AMX-BF16)."""
    return isa.precision == "bf16" and isa.has("amx-bf16") and isa.has("amx-tile")


def amx_tile(m: Any, n: int) -> tuple[int, int]:
    """The (mr, nr) of an `m` x `n` product: two tiles a side unless one covers it
    (a symbolic M takes two)."""
    mr = TILE_ROWS if isinstance(m, int) and m <= TILE_ROWS else 2 * TILE_ROWS
    nr = TILE_WORDS if n <= TILE_WORDS else 2 * TILE_WORDS
    return mr, nr


def is_amx_tile(tile: tuple[int, ...]) -> bool:
    """Whether a recorded (mr, nr) is one the AMX tiles compute."""
    return len(tile) == 2 and tile[0] in AMX_SIDES and tile[1] in AMX_SIDES


def _call(name: str, *args: PrimExpr | Buffer) -> Stmt:
    return Evaluate(CallExtern(name, args, "int32"))


def amx_begin() -> Stmt:
    """The tile configuration, once per parallel tile (before its blocks)."""
    return _call(AMX_TILE_CONFIG)


def amx_end() -> Stmt:
    """The tiles released, once per parallel tile (after its blocks)."""
    return _call(AMX_TILE_RELEASE)


def amx_stage(stage: Buffer, abuf: Buffer, a_offset: PrimExpr, bp: Buffer,
              b_offset: PrimExpr, words: int, mr: int, nr: int) -> Stmt:
    """`stage[mr][nr]` = the `mr` converted rows of A at element `a_offset` of `abuf`
    (rows of `words` int32 words) by the packed panel of `bp` that starts at element
    `b_offset` (`[words][nr]` int32 words)."""
    name = amx_bf16_block(mr // TILE_ROWS, nr // TILE_WORDS)
    return _call(name, stage, abuf, bp, a_offset, b_offset,
                 Const(words // TILE_WORDS, "int64"), Const(words, "int64"),
                 Const(nr, "int64"), Const(nr, "int64"))


__all__ = ["AMX_SIDES", "amx_begin", "amx_end", "amx_stage", "amx_tile", "is_amx_tile",
           "uses_amx"]
