"""The GEMM families: `matmul_packed` (B a constant, packed at compile time) and
`matmul_tiled` (both operands activations, B packed at run time), on the register-tile
micro-kernel of kiln.kernels.gemm.micro_kernel.

The tile `(mr, nr)` follows the ISA: `nr` whole vectors of float32 lanes, `mr` as
many rows as the vector registers hold next to one B row and a broadcast
(`micro_kernel.choose_gemm_tiling`); a symbolic row count counts as
`TYPICAL_ROWS`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from kiln.ir import graph as g
from kiln.ir import weight_origin as wo
from kiln.ir.attrs import ATTR_GEMM_KERNEL
from kiln.ir.dtype import INDEX_DTYPE, itemsize
from kiln.ir.tensor import IfThenElse, PrimFunc, Stmt, as_expr, compare
from kiln.ir.types import TensorType
from kiln.kernels.epilogue import fused_store
from kiln.kernels.gemm.knobs import GemmTiling, k_unroll, k_unrolling, packed_k_unroll
from kiln.kernels.gemm.loop_nest import gemm_body
from kiln.kernels.gemm.micro_kernel import BReader, GemmShape, choose_gemm_tiling
from kiln.kernels.gemm.run_time_pack import pack_b_at_run_time
from kiln.kernels.gemm.schedule import GemmSchedule, prefetches_panels, rows_first
from kiln.kernels.registry import Family, fits_registers
from kiln.kernels.tiles import tile_lanes, tile_registers
from kiln.ops.broadcast import broadcast_shapes
from kiln.ops.gemm import pack_b, packed_kn
from kiln.ops.nn import b_shape
from kiln.ops.packed_attrs import TILE, recorded_tile
from kiln.target.isa import ISA

#: The row count M assumed when choosing a tile for symbolic M (a full-height tile).
TYPICAL_ROWS = 64


def choose_tile(m: Any, n: Any, isa: ISA) -> GemmTiling:
    """The register tile of an `m` x `n` product on `isa` (symbolic sizes count as
    `TYPICAL_ROWS`)."""
    m = m if isinstance(m, int) else TYPICAL_ROWS
    n = n if isinstance(n, int) else TYPICAL_ROWS
    return choose_gemm_tiling(m, n, tile_lanes(isa), tile_registers(isa))


#: Tile heights tuning tries (kiln.tuning): those the registers of the ISA hold.
TUNED_ROWS = (1, 2, 3, 4, 6, 8, 10, 12, 14)


def tile_candidates(m: Any, n: Any, isa: ISA) -> list[tuple[int, int]]:
    """The legal `(mr, nr)` tiles of an `m` x `n` product other than `choose_tile`'s:
    `nr` 1 to 4 whole vectors (8 for a product of a few rows) no wider than N rounded up
    to a vector, `mr` no taller than M, and `mr * nr / lanes` accumulators next to the
    B row and a broadcast within the registers; nearest the rule's first."""
    rule = choose_tile(m, n, isa)
    m = m if isinstance(m, int) else TYPICAL_ROWS
    n = n if isinstance(n, int) else TYPICAL_ROWS
    lanes = tile_lanes(isa)
    out = [(mr, vecs * lanes)
           for vecs in range(1, (8 if m < 4 else 4) + 1) if vecs == 1 or (vecs - 1) * lanes < n
           for mr in TUNED_ROWS if mr <= m and fits_registers(mr * vecs, vecs, isa)]
    return sorted((t for t in out if t != (rule.mr, rule.nr)),
                  key=lambda t: (abs(t[0] - rule.mr) + 4 * abs(t[1] - rule.nr) // lanes, t))


def constant_b(call: g.Call) -> bool:
    """Whether `call` is a float32 `matmul` of an activation by one constant matrix."""
    if call.op != "matmul" or len(call.args) != 2:
        return False
    a, b = call.args
    return (isinstance(b, g.Constant) and b.data.ndim == 2 and isinstance(a.type, TensorType)
            and a.type.dtype == "float32" == b.type.dtype and a.type.ndim >= 1
            and isinstance(a.type.shape[-1], int))


def _f32(t: Any, rank: int) -> bool:
    return isinstance(t, TensorType) and t.dtype == "float32" and t.ndim >= rank


@dataclass(frozen=True)
class PackedGemm(Family):
    """`matmul(a, B)` with B constant -> `matmul_packed(a, bp)`, tile `(mr, nr)`."""

    def applies(self, call: g.Call, isa: ISA) -> bool:
        return constant_b(call)

    def pack(self, call: g.Call, isa: ISA) -> g.Call:
        m, n = self._mn(call)
        tiling = choose_tile(m, n, isa)
        return self.pack_tile(call, isa, (tiling.mr, tiling.nr))

    def candidates(self, call: g.Call, isa: ISA) -> list[tuple[int, ...]]:
        return list(tile_candidates(*self._mn(call), isa))

    def pack_tile(self, call: g.Call, isa: ISA, tile: tuple[int, ...]) -> g.Call:
        a, b = call.args
        assert isinstance(b, g.Constant)
        data = b.data.T if call.attrs.get("transpose_b") else b.data
        mr, nr = tile
        source = wo.origin_of(b.data)  # the replay of the packing (Module.swap_weights)
        if call.attrs.get("transpose_b"):
            source = wo.step("transpose", source, perm=(1, 0))
        packed = g.Constant(self.pack_weights(data, source, nr), b.name)
        return g.Call(self.op, (a, packed), g.freeze_attrs({"n": data.shape[1],
                                                            TILE: (mr, nr)}), call.ret_type)

    def pack_weights(self, data: Any, source: wo.Origin | None, nr: int) -> Any:
        """B `[K, N]` in this family's panels, with the replay of its packing recorded."""
        return wo.record(pack_b(data, nr), wo.pack_panels(source, data.shape, nr))

    @staticmethod
    def _mn(call: g.Call) -> tuple[int, int]:
        a, b = call.args
        assert isinstance(b, g.Constant) and isinstance(a.type, TensorType)
        m = 1  # A's rows may be symbolic (M = batch*seq); the tile is static
        for d in a.type.shape[:-1]:
            m *= d if isinstance(d, int) else TYPICAL_ROWS
        return m, int(b.data.shape[0 if call.attrs.get("transpose_b") else 1])

    def build(self, params: Sequence[Any], args: Sequence[Any], attrs: Mapping[str, Any],
              anchor: Any, result: Any, isa: ISA) -> PrimFunc | None:
        a, b = args[0], args[1]
        k, n = packed_kn(args, attrs)
        shape = GemmShape((), (), tuple(a.shape[:-1]), n, k)
        tile = recorded_tile(attrs, 2, self.op)
        mr = tile[0] if tile else choose_tile(shape.m, n, isa).mr
        return _gemm(self.op, params, args, anchor, result, shape, (*a.shape[:-1], n),
                     GemmTiling(mr, b.shape[2]), None, isa)


@dataclass(frozen=True)
class TiledGemm(Family):
    """`matmul(a, b)` of two activations of rank >= 2 -> `matmul_tiled(a, b)`, tile
    `(mr, nr)` (B packed into `nr`-wide panels at run time)."""

    def applies(self, call: g.Call, isa: ISA) -> bool:
        return (call.op == "matmul" and len(call.args) == 2
                and all(_f32(x.type, 2) for x in call.args))

    def pack(self, call: g.Call, isa: ISA) -> g.Call:
        t = choose_tile(*self._mn(call), isa)
        return self.pack_tile(call, isa, (t.mr, t.nr))

    def candidates(self, call: g.Call, isa: ISA) -> list[tuple[int, ...]]:
        return list(tile_candidates(*self._mn(call), isa))

    def pack_tile(self, call: g.Call, isa: ISA, tile: tuple[int, ...]) -> g.Call:
        return g.Call(self.op, call.args, g.freeze_attrs({**call.attrs, TILE: tuple(tile)}),
                      call.ret_type)

    @staticmethod
    def _mn(call: g.Call) -> tuple[Any, Any]:
        a, b = (x.type for x in call.args)
        assert isinstance(a, TensorType) and isinstance(b, TensorType)
        return a.shape[-2], b_shape(cast(Sequence[int], b.shape), call.attrs)[-1]

    def build(self, params: Sequence[Any], args: Sequence[Any], attrs: Mapping[str, Any],
              anchor: Any, result: Any, isa: ISA) -> PrimFunc | None:
        a, b = args[0], args[1]
        logical = b_shape(b.shape, attrs)
        if a.ndim < 2 or len(logical) < 2:
            return None
        batch = broadcast_shapes(a.shape[:-2], logical[:-2])
        shape = GemmShape(batch, tuple(a.shape[:-2]), (a.shape[-2],), logical[-1],
                             a.shape[-1])
        tile = recorded_tile(attrs, 2, self.op)
        tiling = GemmTiling(*tile) if tile else choose_tile(shape.m, shape.n, isa)
        return _gemm(self.op, params, args, anchor, result, shape,
                     (*batch, a.shape[-2], logical[-1]), tiling, logical, isa,
                     bool(attrs.get("transpose_b")))


def _gemm(op: str, params: Sequence[Any], args: Sequence[Any], anchor: Any, result: Any,
          shape: GemmShape, out_shape: tuple[Any, ...], tiling: GemmTiling,
          run_time_b: tuple[Any, ...] | None, isa: ISA, transpose_b: bool = False
          ) -> PrimFunc | None:
    """The GEMM kernel; `run_time_b` is B's logical shape when B is packed at run time."""
    store = fused_store(params, anchor, result, out_shape)
    if store is None:
        return None
    a, b = args[0], args[1]
    ab, bb = store.buffers[a], store.buffers[b]

    def nest(tile: GemmTiling) -> Stmt:
        prologue: list[Any] = []
        b_at: BReader
        if run_time_b is None:
            # Packed at compile time; float16 panels (precision=f16) widen as they load.
            b_at = lambda bidx, p, kk, v: bb[p, kk, v].astype("float32")  # noqa: E731
        else:
            prologue, b_at = pack_b_at_run_time(bb, tuple(run_time_b[:-2]), shape.k, shape.n,
                                                tile.nr, transpose_b, isa=isa)
        by_rows = rows_first(shape, tile, isa.l2_bytes, itemsize(a.dtype))
        schedule = GemmSchedule(tile, isa.fma, by_rows=by_rows)
        panels = None
        if run_time_b is None and not by_rows and prefetches_panels(
                int(bb.shape[1]), int(bb.shape[0]), tile.nr, isa, itemsize(bb.dtype)):
            panels = bb
        return gemm_body(shape, schedule, ab, b_at, store.out, store.epilogue, prologue,
                         isa=isa, prefetch=panels)

    # a weight packed at compile time takes the rule's K unroll; a run-time B the knob's
    with k_unrolling(packed_k_unroll(shape.k) if run_time_b is None else k_unroll()):
        body = nest(tiling)
    narrow = narrow_columns_tile(shape, tiling, isa) if run_time_b is not None else None
    if narrow is not None:
        body = IfThenElse(compare("le", as_expr(shape.n, INDEX_DTYPE), narrow.nr),
                          nest(narrow), body)
    return PrimFunc((*(store.buffers[t] for t in params), store.out), body,
                    {ATTR_GEMM_KERNEL: op})


def narrow_columns_tile(shape: GemmShape, tiling: GemmTiling, isa: ISA) -> GemmTiling | None:
    """The tile a symbolic column count of at most one vector runs on, chosen at run time,
    when `tiling` (chosen for `TYPICAL_ROWS` columns) is wider: attention's `Q @ K^T`
    over a short symbolic sequence, whose columns a wide tile would compute past N for
    nothing (a pinned build of 16 columns takes the one-vector tile); None when N is
    static or the tile is no wider."""
    if isinstance(shape.n, int):
        return None
    narrow = choose_tile(shape.m, tile_lanes(isa), isa)
    return narrow if narrow.nr < tiling.nr else None


GEMM = PackedGemm("gemm", "matmul_packed", ("matmul",), 1)
GEMM_TILED = TiledGemm("gemm_tiled", "matmul_tiled", ("matmul",), 2)
