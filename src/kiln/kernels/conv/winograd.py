"""The Winograd convolution family: a 3x3, stride 1, dilation 1, ungrouped float32
`conv2d` (any padding) -> `conv2d_winograd` (kiln.ops.winograd: the weight transformed
at compile time), tile `(m, mr, nr)`: F(m x m, 3 x 3) with the GEMM micro-kernel's
`mr x nr` register tile (kiln.kernels.gemm.micro_kernel).

The rule's choice for layers of 32+ channels (whole vector blocks) over 8x8 outputs
or more (`applies`),
unless the target's attribute `winograd` is false: its sums are rounded differently
from a direct convolution's (the transforms scale and cancel terms; the error grows
with m, about 1e-5 of the output's largest magnitude for F(4x4)); tuning checks a
candidate against the rule's result (kiln.distributed.tune). Inside a blocked region
the layout pass turns it into kiln.kernels.conv.winograd_nchwc's kernel. Per image,
with `a = m + 2`, `T` output tiles (`ceil(OH/m)` x `ceil(OW/m)`):

1. the input copied into a zero-padded workspace covering every tile's `a x a` window
   (out-of-image reads are zero), split by column phase (`[c][row][col % m][col // m]`)
   so that column `j` of every tile of a tile row is one contiguous vector;
2. the input transform `V[p][c][t] = (B^T d B)[p]` of each channel's tiles, vector code
   across the tiles of a tile row;
3. `a * a` products `M[p] = U[p] @ V[p]` (`[O x C] @ [C x T]`) on the GEMM kernel;
4. the output transform `Y = A^T M A`, vector code across a tile row's tiles of one
   output channel, interleaved into output rows on the stack, then stored through the
   fused epilogue (bias, activation, residual add) along whole output rows (vector
   stores; partial tiles at the right and bottom edges are cut there).

F(4x4) does a quarter of the direct kernel's multiplies on the 3x3 layers it takes,
F(6x6) a fifth on the wide layers the rule takes it for (`rule_tile_size`;
docs/tuning.md).

Threads: a batch of MIN_PARALLEL_IMAGES or more runs its images in parallel, each
thread the four steps of whole images. Fewer images each run in bands of tile rows
when the image is big enough (`band_rows`): the bands in parallel, each thread the
four steps of its band on workspaces of its own, so no step hands the next a workspace
half written by another core. Otherwise each step's tiles are split over the threads.

The transforms' code is generated from the matrices (`combine`): zero terms skipped,
terms of equal magnitude summed before one multiply, so every tile size shares it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.errors import UsageError
from kiln.ir import graph as g
from kiln.ir import weight_origin as wo
from kiln.ir.attrs import ATTR_CONV_KERNEL
from kiln.ir.dtype import INDEX_DTYPE
from kiln.ir.tensor import (
    Allocate,
    Buffer,
    For,
    IfThenElse,
    LetStmt,
    PrimExpr,
    PrimFunc,
    Stmt,
    Store,
    Var,
    as_expr,
    max_,
    min_,
    seq,
)
from kiln.kernels.conv.family import packed_call
from kiln.kernels.epilogue import fused_store
from kiln.kernels.gemm.families import tile_candidates
from kiln.kernels.gemm.knobs import GemmTiling
from kiln.kernels.gemm.loop_nest import gemm_body
from kiln.kernels.gemm.micro_kernel import GemmShape, choose_gemm_tiling
from kiln.kernels.gemm.schedule import GemmSchedule
from kiln.kernels.parallel_work import min_parallel_work
from kiln.kernels.registry import Family
from kiln.kernels.tiles import (
    Epilogue,
    const,
    lanes_loop,
    loop,
    parallel_split,
    parallel_tiles,
    parallel_when,
    tile_lanes,
    tile_registers,
    tuned_split,
)
from kiln.ops import pack_memory
from kiln.ops.conv_geometry import ConvShape, conv_call_shape, conv_shape
from kiln.ops.packed_attrs import recorded_tile
from kiln.ops.winograd import TILE_SIZES, WINOGRAD, eligible, matrices, tile_of
from kiln.target.isa import ISA

#: The output tile size the family packs with unless tuning says otherwise.
DEFAULT_M = 4
#: The larger tile size the rule takes where it saves products (`rule_tile_size`).
WIDE_M = 6
#: The fewest output tiles the rule takes F(WIDE_M) with.
MIN_WIDE_TILES = 16
#: The fewest input and output channels the rule takes F(WIDE_M) with: its transforms
#: cost more per output than F(4x4)'s, which only a product over this many channels
#: repays (docs/performance.md, "Winograd F(6x6)").
MIN_WIDE_CHANNELS = 512

#: Multiply-adds (M x N x K) of each product `weight_transform` makes: at most what
#: OpenBLAS computes on the calling thread (4 x 65536, its `GEMM_MULTITHREAD_THRESHOLD`).
#: The 9-deep sums are memory-bound: BLAS's threads, woken for larger products, spun for
#: more CPU time than the product took (docs/performance.md, "Compile time, round
#: thirteen").
TRANSFORM_MADDS = 4 * 65536


def weight_transform(w: np.ndarray, m: int) -> np.ndarray:
    """OIHW 3x3 weight -> `u[a * a][O][I]`, `u[:, o, i] = G w[o, i] G^T` (float64 math,
    stored in `w`'s dtype)."""
    _, g, _ = matrices(m)
    # G w G^T of every (o, i) as one matrix product: (G kron G) [a*a][9] by the weight
    # laid out [9][O*I] gives u's layout directly (an einsum over the six indices is
    # several times slower)
    o, i = w.shape[:2]
    n = o * i
    taps = w.reshape(n, 9)
    kron = np.kron(g, g)
    u = pack_memory.empty((kron.shape[0], n), w.dtype)
    # In column blocks, each float64 product rounded into `u` at once, instead of a float64
    # array 8x the weight's size (VGG-19: 640 MB of fresh memory). Each column is the same
    # dot product, so the bits are the same.
    step = max(1, TRANSFORM_MADDS // kron.size)
    for start in range(0, n, step):
        block = taps[start:start + step].T.astype(np.float64, order="C")
        u[:, start:start + block.shape[1]] = np.dot(kron, block)
    u.flags.writeable = False  # fresh: a graph constant takes it without a copy
    return u.reshape((m + 2) ** 2, o, i)


def weight_transform_origin(source: wo.Origin | None, w: np.ndarray, m: int
                            ) -> wo.Origin | None:
    """The replay of `weight_transform(w, m)`: the same float64 product (numpy's dot)."""
    _, g_matrix, _ = matrices(m)
    o, i = (int(d) for d in w.shape[:2])
    taps = wo.step("transpose", wo.step("reshape", wo.step("astype", source, dtype="float64"),
                                        shape=(o * i, 9)), perm=(1, 0))
    u = wo.apply("dot", [wo.value(np.kron(g_matrix, g_matrix)), taps], "float64")
    return wo.step("reshape", wo.step("astype", u, dtype=w.dtype.name),
                   shape=((m + 2) ** 2, o, i))


def takes(c_in: int, c_out: int, block: int) -> bool:
    """Whether a Winograd convolution of `c_in` > `c_out` channels runs on NCHW{block}c
    activations (kiln.kernels.conv.winograd_nchwc): both channel counts whole blocks (no
    padding lanes to keep zero)."""
    return c_in % block == 0 and c_out % block == 0


def tiles(shape: ConvShape, m: int) -> tuple[int, int]:
    """Output tiles of `m x m` down and across the output."""
    return -(-shape.out_h // m), -(-shape.out_w // m)


def products(shape: ConvShape, m: int) -> int:
    """Multiplies per (output, input) channel pair of F(`m` x `m`) on `shape`: `a * a` per
    output tile, the tiles past the image's bottom and right edges counted whole."""
    th, tw = tiles(shape, m)
    return th * tw * (m + 2) ** 2


def rule_tile_size(shape: ConvShape, isa: ISA) -> int:
    """The rule's output tile size m: F(6x6) on layers of MIN_WIDE_CHANNELS or more
    each way where its tiles cover the image with fewer products than F(4x4)'s (not on
    a 14x14 image: 3 x 3 tiles of 64 positions cover 18 x 18, as many products as F(4x4)'s
    4 x 4 tiles of 36) and there are at least MIN_WIDE_TILES of them (each value of
    the weight, 1.8x F(4x4)'s size, is used once per tile); else F(4x4) where its tiles
    fill half a vector of the GEMM's panels; else F(2x2)."""
    th, tw = tiles(shape, WIDE_M)
    if min(shape.c_in, shape.c_out) >= MIN_WIDE_CHANNELS and th * tw >= MIN_WIDE_TILES \
            and products(shape, WIDE_M) < products(shape, DEFAULT_M):
        return WIDE_M
    th, tw = tiles(shape, DEFAULT_M)
    return DEFAULT_M if th * tw >= tile_lanes(isa) // 2 else 2


def gemm_tile(shape: ConvShape, m: int, isa: ISA) -> tuple[int, int]:
    """The GEMM rule's register tile of one position's `O x T` product."""
    th, tw = tiles(shape, m)
    t = choose_gemm_tiling(shape.c_out, th * tw, tile_lanes(isa), tile_registers(isa))
    return (t.mr, t.nr)


def combine(mat: np.ndarray, xs: Sequence[PrimExpr], dtype: str) -> list[PrimExpr]:
    """`mat @ xs` as expressions: zero coefficients skipped, the terms of one magnitude
    added (or subtracted) first and multiplied once (none for magnitude 1)."""
    out: list[PrimExpr] = []
    for row in mat:
        groups: dict[float, tuple[list[PrimExpr], list[PrimExpr]]] = {}
        for coef, x in zip(row, xs):
            if coef != 0:
                plus, minus = groups.setdefault(abs(float(coef)), ([], []))
                (plus if coef > 0 else minus).append(x)
        value: PrimExpr | None = None
        # groups with a positive term first: no leading negation where avoidable
        for mag, (plus, minus) in sorted(groups.items(), key=lambda kv: not kv[1][0]):
            negate = not plus
            terms = plus or minus
            part = terms[0]
            for x in terms[1:]:
                part = part + x
            for x in (minus if plus else []):
                part = part - x
            if mag != 1:
                part = part * as_expr(mag, dtype)
            if value is None:
                value = -part if negate else part
            else:
                value = value - part if negate else value + part
        assert value is not None
        out.append(value)
    return out


def bound(values: Sequence[PrimExpr], dtype: str, name: str
          ) -> tuple[list[Stmt], list[PrimExpr]]:
    """`values`, each bound once to a variable (read many times by a transform), and the
    statements binding them."""
    lets: list[Stmt] = []
    out: list[PrimExpr] = []
    for k, value in enumerate(values):
        var = Var(f"{name}{k}", dtype)
        lets.append(LetStmt(var, value))
        out.append(var)
    return lets, out


def transform_2d(mat: np.ndarray, load: Callable[[int, Var, PrimExpr], PrimExpr],
                 store: Callable[[Var, int, PrimExpr, PrimExpr], Stmt], half: Buffer,
                 lanes: Callable[[Callable[[PrimExpr], Stmt]], Stmt], name: str) -> Stmt:
    """`mat @ d @ mat^T` of an `a x a` tile `d` (entry `(k, j)` of a lane: `load(k, j,
    lane)`) as two loops of 1-D transforms, each statement one vector of `lanes` (a
    lanes loop around its body): down each column `j` into the local `half`
    (`[len(mat)][a][lanes]`), then along each row `i` of it, entry `(i, j)` stored by
    `store(i, j, value, lane)`. Loops over the rows and columns keep the kernel a sixth
    of the unrolled transform's size, and its compile time with it (ResNet-50: three
    kernels of ~3200 IR nodes each); the loops are `unrolled`: LLVM unrolls them and
    keeps `half` in registers (serial loops would keep it in memory)."""
    a, dtype = int(mat.shape[1]), half.dtype

    def column(j: Var) -> Stmt:
        def at(lane: PrimExpr) -> Stmt:
            lets, d = bound([load(k, j, lane) for k in range(a)], dtype, f"{name}d")
            return seq(*lets, *(Store(half, e, (const(i), j, lane))
                                for i, e in enumerate(combine(mat, d, dtype))))

        return lanes(at)

    def row(i: Var) -> Stmt:
        def at(lane: PrimExpr) -> Stmt:
            lets, h = bound([half[i, const(k), lane] for k in range(a)], dtype, f"{name}h")
            return seq(*lets, *(store(i, j, e, lane)
                                for j, e in enumerate(combine(mat, h, dtype))))

        return lanes(at)

    return seq(loop("j", a, column, "unrolled"), loop("i", len(mat), row, "unrolled"))


#: Bytes of the address range a cache set index repeats over (4 KiB pages: L1 sets on
#: x86 and Arm cores are indexed by bits below the page offset).
SET_PERIOD = 4096
#: The least skew, in bytes, between consecutive positions' rows within that period.
MIN_SKEW = 256


def skewed_rows(rows: int, width: int, itemsize: int = 4) -> int:
    """`rows` plus the fewest spare rows that keep a position's `rows x width` block from
    being a multiple of `SET_PERIOD` bytes: the transforms read (or write) all `a*a`
    positions of a tile at once, and blocks of whole pages would put those 16-36 streams
    in one L1 set (more than its ways), evicting each other every tile. Rows of whole
    pages cannot be skewed by rows: `rows` as it is."""
    for extra in range(SET_PERIOD // MIN_SKEW):
        if MIN_SKEW <= (rows + extra) * width * itemsize % SET_PERIOD <= SET_PERIOD - MIN_SKEW:
            return rows + extra
    return rows


@dataclass(frozen=True)
class WinogradSchedule:
    """The choices of a Winograd kernel (`winograd_body`): F(`m` x `m`, 3 x 3), and the
    GEMM micro-kernel's `mr` x `nr` register tile of its products (the rule's:
    `gemm_tile`)."""

    m: int
    mr: int
    nr: int


def winograd_body(shape: ConvShape, x: Buffer, u: Buffer, out: Buffer,
                  schedule: WinogradSchedule, epilogue: Epilogue, fused: bool, *,
                  isa: ISA) -> Stmt:
    """The loop nest of a convolution by F(m x m, 3 x 3) (module docstring): `x` NCHW,
    `u` the transformed weight `[a*a][O][C]`, `out` NCHW, `epilogue` over its 4-D
    index. Both transforms are vector code over the tiles of a tile row: the padded
    input is stored split by column phase (`[c][row][col % m][col // m]`), so a tile
    row's column `j` of every tile is one contiguous vector."""
    rows = None if tuned_split() is not None else band_rows(shape, schedule.m, schedule.nr, isa)

    def one_image(n: PrimExpr) -> Stmt:
        """One image: its bands in parallel (`band_rows`), or whole with each step's
        tiles parallel."""
        if rows is None:
            nest = _Winograd.make(shape, x, u, out, schedule, epilogue, fused, isa)
            return seq(*nest.allocations(), nest.image(n))
        nest = _Winograd.make(shape, x, u, out, schedule, epilogue, fused, isa, rows)
        band = Var("band", INDEX_DTYPE)
        with parallel_split("serial"):  # each band's steps on one thread
            body = nest.band(n, band * rows)
        return banded((nest.xq, nest.v, nest.mm), -(-nest.tiles[0] // rows), band, body)

    def images(kind: str) -> Stmt:
        """Every image: one after the other ("serial"), or the images in parallel, each
        with workspaces of its own and serial steps."""
        nv = Var("n", INDEX_DTYPE)
        if kind == "serial":
            if rows is None:  # the workspaces allocated once for every image
                nest = _Winograd.make(shape, x, u, out, schedule, epilogue, fused, isa)
                return seq(*nest.allocations(), For(nv, const(0), as_expr(
                    shape.n, INDEX_DTYPE), "serial", nest.image(nv)))
            return For(nv, const(0), as_expr(shape.n, INDEX_DTYPE), "serial", one_image(nv))
        nest = _Winograd.make(shape, x, u, out, schedule, epilogue, fused, isa)
        with parallel_split("serial"):
            body = nest.image(nv)
        return For(nv, const(0), as_expr(shape.n, INDEX_DTYPE), "parallel",
                   seq(*nest.allocations(), body))

    if isinstance(shape.n, int) and shape.n == 1:
        return one_image(const(0))
    if tuned_split() is not None:  # a tuned split keeps its own parallel loops
        return images("serial")
    if isinstance(shape.n, int):
        return images("parallel" if shape.n >= MIN_PARALLEL_IMAGES else "serial")
    return IfThenElse(as_expr(shape.n, INDEX_DTYPE) >= MIN_PARALLEL_IMAGES,
                      images("parallel"), images("serial"))


def banded(workspaces: Sequence[Buffer], bands: int, band: Var, body: Stmt) -> Stmt:
    """`for band in range(bands)` in parallel around `body`, each band's `workspaces`
    allocated in the loop, its own while it runs. A thread's next band then gets the
    block its last one freed back from the heap, still in its core's L2; views of one
    allocation of every band's (5.5 MB at ResNet's 64 @ 56x56 in F(4x4), 14 bands) had
    each band write and read memory no band touched since the last call
    (docs/performance.md, "Round twenty-five")."""
    return For(band, const(0), const(bands), "parallel",
               seq(*(Allocate(w) for w in workspaces), body))


def band_rows(shape: ConvShape, m: int, width: int, isa: ISA) -> int | None:
    """The tile rows of each band an image is split into for F(`m` x `m`), None to keep
    it whole. Bands run in parallel, each thread all the steps of its band on
    workspaces of its own (docs/performance.md, "DenseNet-121's Winograd layers at
    batch 1"): taken when the image's products are parallel work (`min_parallel_work`)
    and some split into 2+ bands of MIN_BAND_TILES tiles or more (or of one tile row of
    ROW_BAND_TILES or more) keeps the products'
    tile count (every band's tiles, the last band's included, in whole register tiles
    of `width` tiles) and the tile rows transformed (the last band's as many as the
    others') within MAX_BAND_SURPLUS of the whole image's; the most such bands."""
    th, tw = tiles(shape, m)
    if shape.c_out * shape.c_in * (m + 2) ** 2 * th * tw < min_parallel_work("madd", isa):
        return None
    whole = -(-(th * tw) // width) * width
    for rows in range(1 if tw >= ROW_BAND_TILES else -(-MIN_BAND_TILES // tw), th):
        bands = -(-th // rows)
        # the products' tiles in whole register tiles, and the tile rows transformed
        if bands * -(-(rows * tw) // width) * width <= whole * (1 + MAX_BAND_SURPLUS) and \
                bands * rows <= th * (1 + MAX_BAND_SURPLUS):
            return rows
    return None


@dataclass(frozen=True)
class _Winograd:
    """One Winograd loop nest: the call's buffers, its schedule, and the workspaces its
    steps share: the padded input by column phase `xq`, the transformed input `v` and
    the products `mm`."""

    shape: ConvShape
    x: Buffer
    u: Buffer
    out: Buffer
    schedule: WinogradSchedule
    epilogue: Epilogue
    fused: bool
    isa: ISA
    xq: Buffer
    v: Buffer
    mm: Buffer
    rows: int

    @staticmethod
    def make(shape: ConvShape, x: Buffer, u: Buffer, out: Buffer, schedule: WinogradSchedule,
             epilogue: Epilogue, fused: bool, isa: ISA, rows: int | None = None) -> _Winograd:
        """The nest with workspaces of its own (`allocations`), for bands of `rows` tile
        rows (None: the whole image)."""
        m, nr = schedule.m, schedule.nr
        a = m + 2
        th, tw = tiles(shape, m)
        rows = th if rows is None else rows
        panels = -(-(rows * tw) // nr)
        dt = x.dtype
        xq = Buffer("wino_in", (shape.c_in, rows * m + 2, m, tw + 1), dt)
        # rows of whole panels (every GEMM tile stores whole vectors); the transforms
        # touch all a*a positions at once, so positions are skewed apart (`skewed_rows`)
        v = Buffer("wino_v", (a * a, skewed_rows(shape.c_in, panels * nr), panels * nr), dt)
        mm = Buffer("wino_m", (a * a, skewed_rows(shape.c_out, panels * nr), panels * nr), dt)
        return _Winograd(shape, x, u, out, schedule, epilogue, fused, isa, xq, v, mm, rows)

    def allocations(self) -> list[Stmt]:
        """The workspaces' allocations."""
        return [Allocate(self.xq), Allocate(self.v), Allocate(self.mm)]

    def image(self, n: PrimExpr) -> Stmt:
        """The four steps on image `n`."""
        return self.band(n, 0)

    def band(self, n: PrimExpr, ty0: int | PrimExpr) -> Stmt:
        """The four steps on the band of image `n` from tile row `ty0` (`rows` of them,
        fewer at the bottom; 0 and every tile row: the whole image)."""
        return seq(_padded_input(self, n, ty0), *_input_transform(self), _products(self),
                   _output_transform(self, n, ty0))

    @property
    def a(self) -> int:
        """The input tile's size."""
        return self.schedule.m + 2

    @property
    def tiles(self) -> tuple[int, int]:
        """Output tiles down and across."""
        return tiles(self.shape, self.schedule.m)

    @property
    def t_all(self) -> int:
        """Tiles of a band (of the image when whole)."""
        return self.rows * self.tiles[1]

    @property
    def panels(self) -> int:
        return -(-self.t_all // self.schedule.nr)

    @property
    def whole(self) -> bool:
        """Whether the nest takes the whole image (no bands)."""
        return self.rows == self.tiles[0]


def _padded_input(nest: _Winograd, n: PrimExpr, ty0: int | PrimExpr) -> Stmt:
    """Step 1, per input channel: the zero-padded input by column phase of the band
    from tile row `ty0`, `xq[c, r, ph, q] = x[r + ty0*m - top, q*m + ph - left]`."""
    shape, xq, m = nest.shape, nest.xq, nest.schedule.m
    c_in, hp, _, qn = (int(d) for d in xq.shape)  # padded rows; columns per phase
    top, left = shape.pads[0], shape.pads[1]
    zero = as_expr(0.0, nest.x.dtype)
    # the workspace's rows that lie in the image: [lo, hi)
    shift = top if isinstance(ty0, int) and ty0 == 0 else top - ty0 * m
    lo, hi = _clamp(shift, hp), _clamp(shift + shape.h, hp)

    def pad_rows(c: PrimExpr) -> Stmt:
        def zeros(r: PrimExpr, ph: int, start: int, stop: int) -> list[Stmt]:
            return [loop("q", stop - start, lambda q: Store(xq, zero, (c, r, const(ph), q)),
                         start=start)] if stop > start else []

        def copy(r: Var) -> Stmt:
            parts: list[Stmt] = []
            for ph in range(m):
                # the q whose column q*m + ph - left lies in the image
                q_lo = max(0, -(-(left - ph) // m))
                q_hi = min(qn, (shape.w - 1 + left - ph) // m + 1)

                def put(q: Var, ph: int = ph) -> Stmt:
                    return Store(xq, nest.x[n, c, r - shift, q * m + (ph - left)],
                                 (c, r, const(ph), q))

                parts += [*zeros(r, ph, 0, q_lo), loop("q", q_hi - q_lo, put, start=q_lo),
                          *zeros(r, ph, q_hi, qn)]
            return seq(*parts)

        def fill(r: Var) -> Stmt:
            return seq(*(z for ph in range(m) for z in zeros(r, ph, 0, qn)))

        parts = [loop("r", lo, fill)] if not isinstance(lo, int) or lo else []
        parts.append(loop("r", hi - lo, copy, start=lo))
        if not isinstance(hi, int) or hp > hi:
            parts.append(loop("r", hp - hi, fill, start=hi))
        return seq(*parts)

    return parallel_when(lambda: parallel_tiles((c_in,), pad_rows), c_in * hp * m * qn,
                         "element", isa=nest.isa)


def _clamp(v: int | PrimExpr, hi: int) -> int | PrimExpr:
    """`v` clamped to [0, hi] (an int stays one)."""
    return max(0, min(v, hi)) if isinstance(v, int) else max_(min_(v, hi), 0)


def _input_transform(nest: _Winograd) -> list[Stmt]:
    """Step 2, per channel and tile row of the band (vectors across its tiles):
    `V[p][c][t] = (B^T d B)[p]`; the last panel's surplus columns zero."""
    m, nr, a, v, xq = nest.schedule.m, nest.schedule.nr, nest.a, nest.v, nest.xq
    bt, _, _ = matrices(m)
    c_in, dt = nest.shape.c_in, nest.x.dtype
    rows, tw = nest.rows, nest.tiles[1]  # the band's tile rows (the image's when whole)
    t_all, panels = nest.t_all, nest.panels

    def transform_in(c: PrimExpr, ty: PrimExpr) -> Stmt:
        half = Buffer("wino_vh", (a, a, tw), dt, "local")
        return seq(Allocate(half), transform_2d(
            bt, lambda k, j, tx: xq[c, ty * m + k, j % m, tx + j // m],
            lambda i, j, value, tx: Store(v, value, (i * a + j, c, ty * tw + tx)),
            half, lambda body: lanes_loop("tx", tw, body), "v"))

    parts = [parallel_when(lambda: parallel_tiles((c_in, rows), transform_in),
                           c_in * t_all * a * a * 4, "element", isa=nest.isa)]
    if panels * nr > t_all:  # the last panel's surplus columns are zero
        zero = as_expr(0.0, dt)

        def clear(p: PrimExpr, c: PrimExpr) -> Stmt:
            return loop("t", panels * nr - t_all, lambda t: Store(v, zero, (p, c, t)),
                        start=t_all)

        parts.append(parallel_when(lambda: parallel_tiles((a * a, c_in), clear),
                                   a * a * c_in * (panels * nr - t_all), "element",
                                   isa=nest.isa))
    return parts


def _products(nest: _Winograd) -> Stmt:
    """Step 3: the a*a products `M[p] = U[p] @ V[p]` on the GEMM micro-kernel."""
    a, nr, v = nest.a, nest.schedule.nr, nest.v

    def b_at(bidx: tuple[PrimExpr, ...], panel: PrimExpr, kk: PrimExpr,
             lane: PrimExpr) -> PrimExpr:
        return v[bidx[0], kk, panel * nr + lane]

    product = GemmShape((a * a,), (a * a,), (nest.shape.c_out,), nest.panels * nr,
                        nest.shape.c_in)
    return gemm_body(product, GemmSchedule(GemmTiling(nest.schedule.mr, nr), nest.fused),
                     nest.u, b_at, nest.mm, lambda value, idx: value, isa=nest.isa)


def _output_transform(nest: _Winograd, n: PrimExpr, ty0: int | PrimExpr) -> Stmt:
    """Step 4, per output channel and tile row of the band from tile row `ty0`
    (vectors across its tiles): `Y = A^T M A`, interleaved into output rows on the
    stack, stored through the epilogue."""
    shape, m, a, mm = nest.shape, nest.schedule.m, nest.a, nest.mm
    _, _, at = matrices(m)
    c_out, dt = shape.c_out, nest.x.dtype
    th, tw = nest.tiles

    def transform_out(oc: PrimExpr, tyl: PrimExpr) -> Stmt:
        ys = Buffer("wino_y", (m, m, tw), dt, "local")
        row = Buffer("wino_row", (m, tw * m), dt, "local")

        half = Buffer("wino_yh", (m, a, tw), dt, "local")
        transform = transform_2d(
            at, lambda k, j, tx: mm[k * a + j, oc, tyl * tw + tx],
            lambda i, j, value, tx: Store(ys, value, (i, const(j), tx)),
            half, lambda body: lanes_loop("tx", tw, body), "y")
        interleave = loop("i", m, lambda i: loop("j", m, lambda j: loop(
            "tx", tw, lambda tx: Store(row, ys[i, j, tx], (i, tx * m + j)))))
        ty = tyl if isinstance(ty0, int) and ty0 == 0 else ty0 + tyl

        def put(i: Var) -> Stmt:
            oh = ty * m + i
            return lanes_loop("w", shape.out_w, lambda w: Store(
                nest.out, nest.epilogue(row[i, w], (n, oc, oh, w)), (n, oc, oh, w)))

        i = Var("i", INDEX_DTYPE)
        rows: PrimExpr = (const(m) if shape.out_h % m == 0
                          else min_(m, shape.out_h - ty * m))
        return seq(Allocate(ys), Allocate(row), Allocate(half), transform, interleave,
                   For(i, const(0), rows, "serial", put(i)))

    if nest.whole:
        return parallel_when(lambda: parallel_tiles((c_out, th), transform_out),
                             c_out * nest.t_all * a * a * 4, "element", isa=nest.isa)
    # a band's own tile rows: fewer in the last band when they do not divide the image's
    own: int | PrimExpr = nest.rows if th % nest.rows == 0 else min_(nest.rows, th - ty0)
    return loop("oc", c_out, lambda oc: loop("ty", own, lambda tyl: transform_out(oc, tyl)))


#: The fewest images from which a batch runs its images in parallel (each thread
#: the four steps of whole images, on workspaces of its own) rather than one image
#: after the other with each step's tiles split over the threads: a step's tiles are
#: few on a small image, and every step hands the next one its workspace written by
#: the other threads (docs/performance.md, "DenseNet-121's Winograd layers at batch
#: 8"). From 4 images two threads are balanced within one image of eight.
MIN_PARALLEL_IMAGES = 4
#: The most surplus a split of an image into bands (`band_rows`) may add to its products'
#: tiles (each band's padded to whole register tiles, the last band's to whole bands), as
#: a share of the whole image's: a 7-row image in two bands of 4 rows (1/7) passes.
MAX_BAND_SURPLUS = 0.15
#: The fewest output tiles of a band: each band reads the whole transformed weight, and
#: uses each value of it for that many tiles.
MIN_BAND_TILES = 16
#: The fewest tiles of a tile row that makes a band of its own (fewer than MIN_BAND_TILES):
#: ResNet's 56x56 layers in F(4x4), rows of 14 tiles, run in 14 bands that two threads
#: share evenly, where 7 bands of two rows split 4 to 3 (docs/performance.md).
ROW_BAND_TILES = 14
#: The fewest input and output channels the rule takes a convolution to Winograd with
#: (unless the target's attribute `winograd` is false): from 32 channels on it beats the
#: direct kernel (docs/performance.md, "Winograd 3x3 convolutions"); 16-channel layers
#: are rare and stay direct.
MIN_RULE_CHANNELS = 32
#: The fewest output positions the rule takes a convolution to Winograd with. On a
#: small image the layer streams its weights, which F(4x4) makes 4x larger (F(2x2)
#: 1.8x): no faster than direct, and a library's weights grow by as much.
MIN_RULE_POSITIONS = 64


def target_asks_winograd(isa: ISA) -> bool:
    """Whether the rule takes Winograd convolutions on the target of `isa` (`ISA.winograd`:
    its `winograd` attribute; absent, on for a target with an OS and off for a
    bare-metal one (firmware, e.g. `thumbv7em-none-eabi`), whose flash and RAM are the
    limit: F(4x4) keeps 4x a layer's weights, and its transformed input and products,
    `(m+2)^2 / m^2` times the layer's input and output each (a 32-channel layer at 16x16:
    ~74 KB each), would be workspace a direct convolution does not need)."""
    return isa.winograd


def bf16_takes_winograd(shape: ConvShape, isa: ISA) -> bool:
    """Whether the rule takes the 3x3 layer `shape` to float32 Winograd on a
    `precision=bf16` target rather than the bfloat16 direct kernel: as many output
    channels as the kernel profile asks (`bf16_winograd_min_outputs`), and as many
    output positions (`bf16_winograd_min_positions`) unless as many input and output
    channels as `bf16_winograd_wide_channels`."""
    profile = isa.profile
    return shape.c_out >= profile.bf16_winograd_min_outputs and (
        shape.out_h * shape.out_w >= profile.bf16_winograd_min_positions
        or min(shape.c_in, shape.c_out) >= profile.bf16_winograd_wide_channels)


@dataclass(frozen=True)
class WinogradConv(Family):
    """See the module docstring. Its results differ from a direct convolution's by the
    transforms' rounding (about 1e-5 of the output's largest magnitude): the rule
    chooses it unless the target's attribute `winograd` is false, for layers of
    MIN_RULE_CHANNELS or more (whole vector blocks: `takes`; on a `precision=bf16` target
    also as many output channels and positions as the profile asks:
    `bf16_takes_winograd`) and MIN_RULE_POSITIONS
    outputs or more, with the first of
    its `offered_tiles` (`rule_tile_size`: F(6x6) on wide layers where it saves
    products, else F(4x4) where its output tiles fill half a vector, else F(2x2));
    elsewhere only tuning, which checks each candidate's result against the
    rule's, may choose it."""

    def applies(self, call: g.Call, isa: ISA) -> bool:
        if not target_asks_winograd(isa):
            return False
        shape = conv_call_shape(call)
        # channels of whole vector blocks: else the layer would leave its NCHW{b}c region
        return shape is not None and eligible(shape) and \
            min(shape.c_in, shape.c_out) >= MIN_RULE_CHANNELS and \
            shape.out_h * shape.out_w >= MIN_RULE_POSITIONS and \
            takes(shape.c_in, shape.c_out, tile_lanes(isa)) and \
            (isa.precision != "bf16" or bf16_takes_winograd(shape, isa))

    def pack(self, call: g.Call, isa: ISA) -> g.Call:
        return self.pack_tile(call, isa, self.offered_tiles(call, isa)[0])

    def pack_tile(self, call: g.Call, isa: ISA, tile: tuple[int, ...]) -> g.Call:
        """`call` with the weight transformed for F(tile[0] x tile[0], 3 x 3)."""

        if len(tile) != 3 or tile[0] not in TILE_SIZES:
            raise UsageError(f"{self.name}: tile must be (m, mr, nr) with m in "
                             f"{TILE_SIZES}, got {tile}")
        w = call.args[1]
        assert isinstance(w, g.Constant)
        return packed_call(self.op, call, weight_transform(np.asarray(w.data), tile[0]),
                           tuple(tile), None,
                           lambda o: weight_transform_origin(o, w.data, tile[0]))

    def offered_tiles(self, call: g.Call, isa: ISA) -> list[tuple[int, ...]]:
        """The tiles tuning tries when another family's call may take this one: the
        rule's (`rule_tile_size`), F(4x4) and F(2x2), each with its GEMM rule's tile,
        F(4x4) where its output tiles fill at least half a vector of the GEMM's panels
        (F(4x4) on 7x7 has 4 tiles for 16 lanes: slower than the direct kernel, not
        worth a build of tuning's budget)."""
        shape = conv_call_shape(call)
        assert shape is not None
        half = tile_lanes(isa) // 2
        rule = rule_tile_size(shape, isa)
        return [(m, *gemm_tile(shape, m, isa)) for m in dict.fromkeys((rule, DEFAULT_M, 2))
                if m in (rule, 2) or tiles(shape, m)[0] * tiles(shape, m)[1] >= half]

    def candidates(self, call: g.Call, isa: ISA) -> list[tuple[int, ...]]:
        """F(6x6) (unless the rule's) and F(2x2), and the GEMM family's other tiles of one
        position's product."""
        shape = conv_call_shape(call)
        assert shape is not None
        th, tw = tiles(shape, DEFAULT_M)
        rule = gemm_tile(shape, DEFAULT_M, isa)
        wide = [] if rule_tile_size(shape, isa) == WIDE_M else [WIDE_M]
        return [*((m, *gemm_tile(shape, m, isa)) for m in (*wide, 2)),
                *((DEFAULT_M, *t) for t in tile_candidates(shape.c_out, th * tw, isa)
                  if t != rule)]

    def build(self, params: Sequence[Any], args: Sequence[Any], attrs: Mapping[str, Any],
              anchor: Any, result: Any, isa: ISA) -> PrimFunc | None:

        x, u = args[0], args[1]
        if not all(isinstance(d, int) for d in (*x.shape[1:], *u.shape)):
            return None  # only the batch may be symbolic
        m = tile_of(u.shape)
        shape = conv_shape(x.shape, int(u.shape[1]), (3, 3), attrs)
        tile = recorded_tile(attrs, 3, self.op) or (m, *gemm_tile(shape, m, isa))
        bias = args[2] if len(args) > 2 else None
        out_shape = (shape.n, shape.c_out, shape.out_h, shape.out_w)
        store = fused_store(params, anchor, result, out_shape, bias=bias)
        if store is None:  # an epilogue needing statements (a reduction, a table)
            return None
        stmt = winograd_body(shape, store.buffers[x], store.buffers[u], store.out,
                             WinogradSchedule(tile[0], tile[1], tile[2]), store.epilogue,
                             isa.fma, isa=isa)
        return PrimFunc((*(store.buffers[t] for t in params), store.out), stmt,
                        {ATTR_CONV_KERNEL: self.op})


CONV_WINOGRAD = WinogradConv("conv_winograd", WINOGRAD, ("conv2d",), 0)
