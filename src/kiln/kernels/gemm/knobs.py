"""The GEMM kernels' tuning knobs: the register tile, K blocking and K unrolling.

The GEMM micro-kernel (kiln.kernels.gemm) and every family built on it read these
while they build a loop nest: the register tile of `mr` rows x `nr` columns
(`GemmTiling`, a call's `tile` attribute), the blocking of the sums along K for the
ISA's caches (`KBlocking`, `choose_k_blocking`; on inside `k_blocking`, a call's
`kblock` attribute) and the unroll factor of the K loop (inside `k_unrolling`, a
call's `unroll` attribute). The family registry (kiln.kernels.registry.build_call)
sets the last two from a call's attributes, as the parallel split
(kiln.kernels.tiles.parallel_split); the tuning search space
(kiln.kernels.search) asks `choose_k_blocking` whether blocking changes a kernel
and offers `TUNED_UNROLLS`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass

from kiln.ir.tensor import PrimExpr


@dataclass(frozen=True)
class GemmTiling:
    """A register tile of `mr` rows x `nr` columns (`nr` a multiple of the vector lanes)."""

    mr: int
    nr: int


#: The K unroll factors tuning offers (kiln.kernels.search), those no larger than K.
TUNED_UNROLLS = (2, 4, 8)
#: The K unroll factor GEMM kernels built inside `k_unrolling` take (a tuning knob:
#: kiln.kernels.search's `{"unroll": U}`); None: the rule's, LLVM's to unroll.
_K_UNROLL: ContextVar[int | None] = ContextVar("kiln_k_unroll", default=None)


@contextlib.contextmanager
def k_unrolling(unroll: int | None) -> Iterator[None]:
    """Build the GEMM micro-kernels inside with their K loop unrolled by `unroll`
    (kiln.kernels.gemm.micro_kernel.reduction_loop; None: the rule's, a plain loop)."""
    token = _K_UNROLL.set(unroll)
    try:
        yield
    finally:
        _K_UNROLL.reset(token)


def k_unroll() -> int | None:
    """The K unroll factor of the kernel being built (`k_unrolling`; None: the rule's)."""
    return _K_UNROLL.get()


#: The rule's K unroll for a float32 product by a weight packed at compile time
#: (`packed_k_unroll`): two steps per iteration halve the loop's own instructions (the
#: counter, the branch, the next panel's prefetch address), which on AVX-512 share
#: the front end with the 16 FMAs of a step.
PACKED_K_UNROLL = 2
#: ... for a static K of at least this many steps (a shorter loop is LLVM's to unroll).
PACKED_K_UNROLL_MIN_K = 64


def packed_k_unroll(k: int | PrimExpr) -> int | None:
    """The K unroll of a float32 `matmul_packed` kernel: the `k_unrolling` knob's where
    one is set, else `PACKED_K_UNROLL` over a static K of at least
    `PACKED_K_UNROLL_MIN_K`, else None (a plain loop). The steps keep their order, so
    the sums are the same bits either way."""
    chosen = k_unroll()
    if chosen is not None:
        return chosen
    return PACKED_K_UNROLL if isinstance(k, int) and k >= PACKED_K_UNROLL_MIN_K else None


@dataclass(frozen=True)
class KBlocking:
    """Blocking along K (GotoBLAS's `kc`/`mc`): each parallel tile is `mc` rows of one
    panel, summed `kc` steps of K at a time over all its row tiles, so the panel's `kc`
    x `nr` block is read from L1 by every row tile (and the `mc` x `kc` block of A
    from L2 by every panel); the partial sums wait in a `local` `[mc][nr]` array."""

    kc: int
    mc: int


#: The partial sums of a K-blocked tile live on the stack: at most this many bytes.
PARTIAL_SUM_BYTES = 32 * 1024


def choose_k_blocking(m: int | PrimExpr, k: int | PrimExpr, tiling: GemmTiling,
                      l1d_bytes: int, l2_bytes: int, itemsize: int = 4) -> KBlocking | None:
    """The K blocking of an `m` x `k` A on a cache of `l1d_bytes` / `l2_bytes` (half of
    each for the blocks, the rest for A's rows, the output and the partial sums), or
    None when K is symbolic or one block already fits L1: `kc` steps of a panel fill
    half of L1 (balanced: K split into equal blocks), `mc` rows of a `kc`-deep A block
    half of L2, no more than `PARTIAL_SUM_BYTES` of partial sums, a multiple of `mr`."""
    if not isinstance(k, int) or not isinstance(m, int):
        return None
    most = max(8, l1d_bytes // 2 // (tiling.nr * itemsize))
    if k <= most:
        return None
    blocks = -(-k // most)
    kc = -(-k // blocks)
    rows = min(PARTIAL_SUM_BYTES // (tiling.nr * itemsize),
               max(tiling.mr, (l2_bytes // 2) // (kc * itemsize)))
    mc = max(tiling.mr, rows // tiling.mr * tiling.mr)
    return KBlocking(kc, min(mc, -(-m // tiling.mr) * tiling.mr))


#: The (L1d, L2) bytes a kernel built inside `k_blocking` blocks its sums for (a tuning
#: knob, off by rule: kiln.kernels.search's `{"kblock": true}`); None: no blocking.
_K_BLOCK: ContextVar[tuple[int, int] | None] = ContextVar("kiln_k_block", default=None)


@contextlib.contextmanager
def k_blocking(caches: tuple[int, int] | None) -> Iterator[None]:
    """Build GEMM kernels inside blocked along K for caches of `caches` = (L1d, L2)
    bytes (`choose_k_blocking`; None: unblocked, the rule)."""
    token = _K_BLOCK.set(caches)
    try:
        yield
    finally:
        _K_BLOCK.reset(token)


def k_block_caches() -> tuple[int, int] | None:
    """The (L1d, L2) bytes the kernel being built blocks its sums for (`k_blocking`;
    None: unblocked)."""
    return _K_BLOCK.get()
