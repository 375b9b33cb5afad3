"""The choices of one GEMM loop nest (`GemmSchedule`) and the sizes they make (`GemmNest`).

A loop nest of kiln.kernels.gemm.loop_nest computes the products of a `GemmShape` on
the register tile of the schedule's `GemmTiling`. Its other choices: multiply-adds
fused (FMA) or not; the sums blocked along K (`KBlocking`); the tiles run panel by
panel or row tile by row tile (`rows_first`); a partial last panel shifted onto the
last `nr` columns; each panel of B copied to the stack before its row tiles read it,
alone or a few panels together. `GemmNest` holds what every variant reads: the
operands, the tile counts, and how the last row tile and the last panel end.
"""

from __future__ import annotations

from dataclasses import dataclass

from kiln.errors import IRError
from kiln.ir.tensor import Buffer, CallExtern, Intrin, PrimExpr, Var
from kiln.ir.visitor import iter_exprs
from kiln.kernels.gemm.knobs import GemmTiling, KBlocking
from kiln.kernels.gemm.micro_kernel import BReader, GemmShape
from kiln.kernels.math import BUILDERS, CPU_KINDS
from kiln.kernels.prefetch import WeightPrefetch
from kiln.kernels.tiles import Epilogue, const
from kiln.target.isa import ISA


@dataclass(frozen=True)
class GemmSchedule:
    """How a GEMM loop nest (kiln.kernels.gemm.loop_nest.gemm_body) runs its products.

    - `tiling`: the register tile; `fused`: multiply-adds as FMA (the ISA's);
    - `blocking`: the sums run `kc` steps of K at a time (`KBlocking`; a static K
      longer than its `kc`; None: the `k_blocking` knob's, else unblocked);
    - `by_rows`: the tiles run row tile by row tile (`rows_first`; not with
      `blocking`), else panel by panel (each panel's row tiles in turn);
    - `shifted_tail` (a static N of at least `nr`, no multiple of it): the last, partial
      panel is computed over the last `nr` columns `n - nr .. n` instead of `nr` columns
      from its start (`b_at` then reads columns `min(panel * nr, n - nr) + v`: B read in
      place needs no zero padding), and stores only its columns past the previous
      panel, from its upper lanes (the columns both panels compute are stored once, so
      an epilogue reading the output's own memory, an in-place residual, reads it once);
    - `copy_panels` (a static K; ignored with `blocking` or `by_rows`): a parallel tile
      is one panel of one product with all its row tiles; it first copies the panel's
      `k` x `nr` values (through `b_at`) into a contiguous block on the stack, which
      every row tile then reads. `panel_group` (with `copy_panels`): a parallel tile is
      that many consecutive panels (fewer in the last), copied together; each row tile
      then runs over all of them in turn, so it stores (and its epilogue reads)
      `panel_group * nr` consecutive columns of each output row.
    """

    tiling: GemmTiling
    fused: bool = True
    blocking: KBlocking | None = None
    by_rows: bool = False
    shifted_tail: bool = False
    copy_panels: bool = False
    panel_group: int = 1


#: The share of L2 B's panels (of one product) may fill for the tiles to run row tile
#: by row tile (`rows_first`): the rest holds the row tile's A rows and the output.
ROWS_FIRST_L2_SHARE = 0.75
#: The size counted for a symbolic dimension when deciding the order (attention's seq:
#: its K^T and V panels are head_dim x seq, small at any usual length).
TYPICAL_DIM = 64


def rows_first(shape: GemmShape, tiling: GemmTiling, l2_bytes: int, itemsize: int = 4
               ) -> bool:
    """Whether the tiles of `shape` run row tile by row tile (each sweeping all of B's
    panels) instead of panel by panel (each sweeping all of A's rows): when B's panels
    of one product fit `ROWS_FIRST_L2_SHARE` of L2 (`l2_bytes`; 0: no L2 known).

    Panel by panel, A is read once per panel: from L2 when it fits there, from L3 or
    memory otherwise (attention's `P @ V`: the scores are read once per panel of V),
    and each output row is written one panel at a time, so a cache line straddling two
    panels is fetched and written back twice (attention's `Q @ K^T`). Row tile by row
    tile, A is read once, B's panels come from L2 and the output is written row by
    row."""
    if l2_bytes <= 0:
        return False

    def size(d: object) -> int:
        return d if isinstance(d, int) else TYPICAL_DIM

    panels = -(-size(shape.n) // tiling.nr)
    return size(shape.k) * panels * tiling.nr * itemsize <= ROWS_FIRST_L2_SHARE * l2_bytes


#: Packed B panels of at least this share of L2 are prefetched a panel ahead
#: (`prefetches_panels`): a B that large is read from memory in a model, where the
#: layers between two calls evict it.
PREFETCH_B_L2_SHARE = 1.0


def prefetches_panels(k: int, panels: int, nr: int, isa: ISA, itemsize: int = 4) -> bool:
    """Whether a GEMM over B packed at compile time (`panels` panels of `k` x `nr`)
    prefetches the next panel while it computes one (`GemmNest.pf`). Panel by panel,
    a panel's first row tile reads it from memory in a burst (a prompt's 128 rows
    over a 2048 x 2048 layer: 256 KB in the time of one 8-row tile, more bandwidth than
    one core gets) while the other row tiles find it in L2 and leave the memory idle;
    the prefetches stream the next panel in during all of them."""
    return isa.l2_bytes > 0 and panels > 1 \
        and k * panels * nr * itemsize >= PREFETCH_B_L2_SHARE * isa.l2_bytes


@dataclass(frozen=True)
class GemmNest:
    """One GEMM loop nest's operands and sizes: `a` is A (`[*a_batch, *rows, k]`, read in
    place), `b_at` reads B's panels, `out` is `[*batch, *rows, n]`; `mtiles` row tiles
    of `mr` rows (the last one `last_rows`), `panels` panels of `nr` columns."""

    shape: GemmShape
    schedule: GemmSchedule
    a: Buffer
    b_at: BReader
    out: Buffer
    epilogue: Epilogue
    isa: ISA
    m: int  # or an expression of the kernel's dim scalars (`static_m` false)
    n: int  # or symbolic (attention's seq): a symbolic panel count, the last one partial
    static_m: bool
    mr: int
    nr: int
    mtiles: int
    panels: int
    whole_panels: bool
    #: the last, partial panel shifted onto the last `nr` columns (`shifted_tail`)
    shift: bool
    last_rows: int
    many_tiles: bool
    #: the first row of a tile that may be past the end (reads the last row)
    surplus_from: int
    #: the accumulators' dtype: A's (the epilogue may cast)
    acc_t: str
    #: the sums stored as they are, then the epilogue run over the tile on its own
    two_pass: bool
    #: symbolic rows of several dims: `a` is a view of A with its rows flattened
    #: (`[*a_batch, m, k]`) and the tiles store through this view of `out` (`[*batch,
    #: m, n]`); None: A and `out` as they are
    out_rows: Buffer | None = None
    #: each step of a full-height row tile also prefetches the next panel's B row at
    #: that step (`prefetches_panels`); None: no prefetches
    pf: WeightPrefetch | None = None


def plan_nest(shape: GemmShape, schedule: GemmSchedule, a: Buffer, b_at: BReader,
              out: Buffer, epilogue: Epilogue, isa: ISA, prefetch: Buffer | None = None
              ) -> GemmNest:
    """The nest of `shape` on `schedule`'s tile (IRError for an empty product or a shifted
    last panel it cannot have); `prefetch`: B's packed panels `[panels, k, nr]`, whose
    next panel each full-height row tile prefetches (`GemmNest.pf`)."""
    m, n = shape.m, shape.n
    static_m = isinstance(m, int)  # else an expression of the kernel's dim scalars
    if (static_m and m < 1) or (isinstance(n, int) and n < 1):
        raise IRError(f"gemm kernel: empty product {shape}")
    tiling = schedule.tiling
    mr, nr = min(tiling.mr, m) if static_m else tiling.mr, tiling.nr
    mtiles, panels = (m + mr - 1) // mr, (n + nr - 1) // nr
    whole_panels = isinstance(n, int) and n % nr == 0
    if schedule.shifted_tail and not (isinstance(n, int) and n >= nr):
        raise IRError(f"gemm kernel: a shifted last panel needs a static N >= {nr}: {shape}")
    last_rows = m - (mtiles - 1) * mr  # rows of the last row tile
    # symbolic M: any row but the first may be past the end (M >= 1 when a tile runs)
    surplus_from = last_rows if static_m else 1
    two_pass = out.dtype == a.dtype and calls_a_library(epilogue, out.ndim, isa=isa)
    # a product of one row tile has no other tiles to hide the next panel behind
    pf = (WeightPrefetch(prefetch, int(prefetch.shape[1]) * nr)
          if prefetch is not None and (not static_m or mtiles > 1) else None)
    return GemmNest(shape, schedule, a, b_at, out, epilogue, isa, m, n, static_m, mr, nr,
                    mtiles, panels, whole_panels, schedule.shifted_tail and not whole_panels,
                    last_rows, not static_m or mtiles > 1, surplus_from, a.dtype, two_pass,
                    pf=pf)


# Intrinsics that become instructions (the others are math library calls).
_INSTRUCTIONS = frozenset({"fma", "sqrt", "abs", "floor", "ceil", "round", "trunc", "isnan",
                           "isinf"})


def calls_a_library(epilogue: Epilogue, ndim: int, *, isa: ISA) -> bool:
    """Whether the epilogue calls functions (a math library's erf, exp, ...): calls would
    spill the accumulators, so such an epilogue runs over the stored tile on its own
    (`GemmNest.two_pass`). On a CPU target (`isa.kind`) the float32 exp/tanh/sigmoid/erf
    become arithmetic (kiln.transform.expand_math) that vectorizes in the one-pass store
    loop."""

    expanded = isa.kind in CPU_KINDS
    zero: tuple[PrimExpr, ...] = (const(0),) * ndim
    probe = epilogue(Var("probe", "float32"), zero)
    return any(isinstance(e, CallExtern) or (
        isinstance(e, Intrin) and e.name not in _INSTRUCTIONS
        and not (expanded and e.name in BUILDERS and e.dtype == "float32"))
        for e in iter_exprs(probe))


@dataclass(frozen=True)
class KSegment:
    """K's steps `k0 .. k0 + k` of a K-blocked row tile, its partial sums at rows `row0`
    of `sums`; the `first` segment starts from zero, the `last` applies the epilogue."""

    sums: Buffer
    row0: PrimExpr
    k0: PrimExpr
    k: int
    first: bool
    last: bool

