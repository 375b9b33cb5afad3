"""The AMX tile calls a kernel makes (`CallExtern` of these names), their contract and
their numpy reference.

AMX (Intel's Advanced Matrix Extensions, Sapphire Rapids and later) multiplies whole
tiles held in eight tile registers `tmm0`-`tmm7`. Tile registers are state no IR value
can hold, so a kernel does not name them: it calls three helpers that the llvm backend
defines inside the module it emits (kiln.codegen.llvm.amx: inline `ldtilecfg`,
`tileloadd`, `tdpbf16ps`, `tilestored`, `tilerelease`; no symbol is left to link), and
that the reference interpreter runs as numpy (`bf16_block_reference`). The c backend
has no rule for them: a `precision=bf16` target of kind `c` is refused when it is
built (kiln.target.precision), so it never meets them.

- `AMX_TILE_CONFIG()`: loads the one tile configuration every kernel uses (palette 1,
  the eight tiles 16 rows of 64 bytes); a kernel calls it once per parallel tile, on
  the thread that runs that tile, before the blocks.
- `AMX_TILE_RELEASE()`: returns the tiles to their initial state (the OS then saves
  no tile data on a context switch); once per parallel tile, after the blocks.
- `amx_bf16_block(tm, tn)(c, a, b, a_offset, b_offset, steps, lda, ldb, ldc)`: the
  float32 product of `16 * tm` rows of bfloat16 pairs by `16 * tn` columns, over
  `16 * steps` int32 words of K, stored (not added) to `c`:
  `c[r * ldc + col] = sum over w < 16 * steps of dot2(a[a_offset + r * lda + w],
  b[b_offset + w * ldb + col])`, r < 16 * tm, col < 16 * tn, where `dot2` is the sum
  of the two products of the words' bfloat16 halves (the low halves and the high
  halves: the pairing both operands were packed with). `a` and `b` are int32 buffers,
  `c` float32; offsets and strides count elements. tm * tn accumulators, tm A tiles
  and tn B tiles must fit the eight registers (`AMX_BLOCKS`).

Every call returns int32 0 (use it through `Evaluate`). The instruction sums in
float32 with round-to-nearest-even and flushes bfloat16 subnormals to zero; the
reference sums in float64 and rounds once: the two agree to float32 summation error.
"""

from __future__ import annotations

import numpy as np

from kiln.errors import IRError

#: The tile configuration call (ldtilecfg).
AMX_TILE_CONFIG = "__kiln_amx_tile_config"
#: The tile release call (tilerelease).
AMX_TILE_RELEASE = "__kiln_amx_tile_release"
#: Rows of one tile, and int32 words (64 bytes) in one tile row.
TILE_ROWS = 16
TILE_WORDS = 16
#: The (tm, tn) blocks a kernel may call: tm * tn + tm + tn <= 8 tile registers.
AMX_BLOCKS = ((1, 1), (1, 2), (2, 1), (2, 2))
_BLOCK_PREFIX = "__kiln_amx_bf16_"


def amx_bf16_block(tm: int, tn: int) -> str:
    """The name of the `tm` x `tn` tile block call (see the module docstring)."""
    if (tm, tn) not in AMX_BLOCKS:
        raise IRError(f"no AMX block of {tm} x {tn} tiles; blocks: {AMX_BLOCKS}")
    return f"{_BLOCK_PREFIX}{tm}x{tn}"


def block_shape(name: str) -> tuple[int, int] | None:
    """(tm, tn) of a block call's name; None for any other name."""
    if not name.startswith(_BLOCK_PREFIX):
        return None
    tm, _, tn = name[len(_BLOCK_PREFIX):].partition("x")
    shape = (int(tm), int(tn)) if tm.isdigit() and tn.isdigit() else None
    return shape if shape in AMX_BLOCKS else None


def is_amx_call(name: str) -> bool:
    """Whether `name` is one of the AMX helper calls."""
    return name in (AMX_TILE_CONFIG, AMX_TILE_RELEASE) or block_shape(name) is not None


def _halves(words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    u = words.astype(np.int32).view(np.uint32)
    return ((u << 16).view(np.float32).astype(np.float64),
            (u & 0xFFFF0000).view(np.float32).astype(np.float64))


def bf16_block_reference(tm: int, tn: int, c: np.ndarray, a: np.ndarray, b: np.ndarray,
                         a_offset: int, b_offset: int, steps: int, lda: int, ldb: int,
                         ldc: int) -> int:
    """The block call on flat numpy buffers (the interpreter's rule for it)."""
    rows, cols, words = TILE_ROWS * tm, TILE_WORDS * tn, TILE_WORDS * steps
    r, w, col = np.arange(rows), np.arange(words), np.arange(cols)
    aw = a[a_offset + r[:, None] * lda + w[None, :]]
    bw = b[b_offset + w[:, None] * ldb + col[None, :]]
    (alo, ahi), (blo, bhi) = _halves(aw), _halves(bw)
    out = alo @ blo + ahi @ bhi
    c[r[:, None] * ldc + col[None, :]] = out.astype(np.float32)
    return 0


__all__ = ["AMX_BLOCKS", "AMX_TILE_CONFIG", "AMX_TILE_RELEASE", "TILE_ROWS", "TILE_WORDS",
           "amx_bf16_block", "bf16_block_reference", "block_shape", "is_amx_call"]
