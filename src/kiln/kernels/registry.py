"""The kernel registry: which hand-built kernel family takes a graph call on a CPU.

A family turns calls of its `sources` ops into calls of its own `op` (`pack`: the
weight packed at compile time and the register tile recorded in the call's `tile`
attribute), and lowers calls of `op` (`build`, at legalization, reading that tile).
The blocking passes ask `select(call, isa)` for the first family, in `rank` order,
that `applies`; legalization asks `family_of(op)`. A `TunableFamily` also lists the
other legal tiles of a call (`candidates`) and packs with a given one (`pack_tile`):
the search space of kiln.tuning. `KERNELS` has the shape of every
kiln registry (kiln._registry): name -> lazily imported family.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from kiln._registry import Registry, RegistryError
from kiln.errors import IRError
from kiln.ir import graph as g
from kiln.ir.tensor import PrimFunc
from kiln.ir.types import TensorType, TupleType
from kiln.kernels import specialisation
from kiln.kernels.gemm.knobs import k_blocking, k_unrolling
from kiln.kernels.tiles import PARALLEL_SPLITS, parallel_split, tile_registers
from kiln.target.isa import ISA

#: The attribute a tuned call records its parallel split in (kiln.kernels.tiles).
SPLIT = "split"
#: The attribute a tuned GEMM call sets (true) to block its sums along K for the ISA's
#: caches (kiln.kernels.gemm.knobs.k_blocking; absent: the rule's, unblocked).
KBLOCK = "kblock"
#: The attribute a tuned GEMM call records its K unroll factor in (an int: the K loop of
#: the register tile unrolled by it, kiln.kernels.gemm.micro_kernel.reduction_loop;
#: absent: the rule's, LLVM's to unroll).
UNROLL = "unroll"


class KernelFamily(Protocol):
    """One family of hand-built kernels (see the module docstring)."""

    name: str
    op: str                     # the op whose calls `build` lowers
    sources: tuple[str, ...]    # the graph ops `pack` rewrites
    rank: int                   # selection order among families of one source op

    def applies(self, call: g.Call, isa: ISA) -> bool:
        """Whether this family's kernel takes `call` on `isa`."""
        ...

    def pack(self, call: g.Call, isa: ISA) -> g.Call:
        """`call` rewritten to `op` (weights packed, the tile recorded)."""
        ...

    def build(self, params: Sequence[Any], args: Sequence[Any], attrs: Mapping[str, Any],
              anchor: Any, result: Any, isa: ISA) -> PrimFunc | None:
        """The kernel of a call of `op` with the fused elementwise tail (the arguments
        of `Lowering.lower_fused`, kiln.kernels.lowering), or None when it cannot be built."""
        ...


@runtime_checkable
class TunableFamily(KernelFamily, Protocol):
    """A family whose register tile tuning may choose (kiln.tuning)."""

    def candidates(self, call: g.Call, isa: ISA) -> list[tuple[int, ...]]:
        """The legal tiles of `call` on `isa` other than the rule's (the one `pack`
        records), by construction: whole vectors of the ISA's lanes, accumulators that
        fit its registers, no wider than the output."""
        ...

    def pack_tile(self, call: g.Call, isa: ISA, tile: tuple[int, ...]) -> g.Call:
        """`pack` with `tile` (one of `candidates`, or the rule's) instead of the rule's."""
        ...


def fits_registers(accumulators: int, vectors: int, isa: ISA) -> bool:
    """Whether a tile of `accumulators` vector accumulators, `vectors` operand vectors
    and one broadcast fits the register file of `isa` (so the tile never spills)."""
    return accumulators + vectors + 1 <= tile_registers(isa)


@dataclass(frozen=True)
class Family:
    """The identity every family object carries (see `KernelFamily`)."""

    name: str
    op: str
    sources: tuple[str, ...]
    rank: int


KERNELS: Registry[KernelFamily] = Registry("kernel family")
# family name -> "module:attr", by kind of kernel.
_FAMILIES: dict[str, str] = {
    # gemm
    "gemv": "kiln.kernels.gemm.gemv_family:GEMV",
    "gemm": "kiln.kernels.gemm.families:GEMM",
    "gemm_tiled": "kiln.kernels.gemm.families:GEMM_TILED",
    "gemm_bf16": "kiln.kernels.gemm.bf16:GEMM_BF16",
    "gemm_f16": "kiln.kernels.gemm.f16:GEMM_F16",
    "gemm_tiled_bf16": "kiln.kernels.gemm.bf16_tiled:GEMM_TILED_BF16",
    "nbits": "kiln.kernels.gemm.nbits:NBITS",

    # conv
    "conv_depthwise": "kiln.kernels.conv.depthwise:CONV_DEPTHWISE",
    "conv_gemm": "kiln.kernels.conv.gemm:CONV_GEMM",
    "conv_grouped": "kiln.kernels.conv.grouped:CONV_GROUPED",
    "conv_rows": "kiln.kernels.conv.rows:CONV_ROWS",
    "conv_direct": "kiln.kernels.conv.direct:CONV_DIRECT",
    "nchwc": "kiln.kernels.conv.nchwc:NCHWC",
    "nchwc_bf16": "kiln.kernels.conv.bf16:NCHWC_BF16",
    "conv_winograd": "kiln.kernels.conv.winograd:CONV_WINOGRAD",
    "winograd_nchwc": "kiln.kernels.conv.winograd_nchwc:WINOGRAD_NCHWC",

    # int8
    "int8_matmul": "kiln.kernels.int8.families:INT8_MATMUL",
    "int8_conv_dot": "kiln.kernels.int8.families:INT8_CONV_DOT",
    "int8_conv_grouped": "kiln.kernels.int8.families:INT8_CONV_GROUPED",
    "int8_conv": "kiln.kernels.int8.families:INT8_CONV",
    "int8_matmul_integer": "kiln.kernels.int8.families:INT8_MATMUL_INTEGER",
    "int8_dynamic_matmul": "kiln.kernels.int8.families:INT8_DYNAMIC_MATMUL",
}
for _name, _where in _FAMILIES.items():
    KERNELS.register(_name, lazy=_where)


def families() -> list[KernelFamily]:
    """Every registered family, in selection order."""
    return sorted((KERNELS.get(n) for n in KERNELS.names()), key=lambda f: (f.rank, f.name))


def select(call: g.Call, isa: ISA) -> KernelFamily | None:
    """The first family (by rank) that takes `call` on `isa`, or None. A call with an
    empty operand or result (a static dimension of 0) is left to the generic tensor
    expressions, whose loops run zero times: the families' tiles assume elements."""
    if any(_empty(t) for t in (*(a.type for a in call.args), call.type)):
        return None
    family = _first(call, isa)
    if family is None and specialisation.active():
        specialisation.note_unselected(call, isa, _first)
    return family


def _first(call: g.Call, isa: ISA) -> KernelFamily | None:
    for family in families():
        if call.op in family.sources and family.applies(call, isa):
            return family
    return None


def _empty(t: Any) -> bool:
    if isinstance(t, TupleType):
        return any(_empty(f) for f in t.fields)
    return isinstance(t, TensorType) and any(isinstance(d, int) and d == 0 for d in t.shape)


def family_of(op: str) -> KernelFamily:
    """The family whose kernels lower calls of `op`."""
    for family in families():
        if family.op == op:
            return family
    raise RegistryError(f"no kernel family lowers '{op}'")


def build_call(family: KernelFamily, params: Sequence[Any], args: Sequence[Any],
               attrs: Mapping[str, Any], anchor: Any, result: Any, isa: ISA
               ) -> PrimFunc | None:
    """`family.build(...)` with the parallel split, K blocking and K unroll the call
    records (its `split`, `kblock` and `unroll` attributes, set by tuning; absent: the
    rule's)."""

    split = attrs.get(SPLIT)
    if split is not None and split not in PARALLEL_SPLITS:
        raise IRError(f"{family.op}: attribute 'split' must be one of "
                      f"{', '.join(PARALLEL_SPLITS)}, got {split!r}")
    kblock = attrs.get(KBLOCK, False)
    if not isinstance(kblock, bool):
        raise IRError(f"{family.op}: attribute 'kblock' must be a bool, got {kblock!r}")
    unroll = attrs.get(UNROLL)
    if unroll is not None and (isinstance(unroll, bool) or not isinstance(unroll, int)
                               or unroll < 1):
        raise IRError(f"{family.op}: attribute 'unroll' must be a positive int, "
                      f"got {unroll!r}")
    with parallel_split(split), k_blocking((isa.l1d_bytes, isa.l2_bytes) if kblock
                                           else None), k_unrolling(unroll):
        return family.build(params, args, attrs, anchor, result, isa)
