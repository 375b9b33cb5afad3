"""The per-channel window kernel (`window_body`) of depthwise convolutions and 2-D
pools (kiln.kernels.pool.window) over an NCHW input of static size: a tile is several
output rows x `tile_w` columns of one channel, each input row segment it reads loaded
once for all the tile's rows; the channels' loop is left to the `parallelize` pass.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from kiln.ir.dtype import itemsize
from kiln.ir.tensor import Allocate, Buffer, LetStmt, PrimExpr, Stmt, Store, Var, seq
from kiln.kernels.conv.flat_plane import channel_block
from kiln.kernels.conv.padding import (
    PhaseReader,
    needs_padding,
    padded_input,
    padded_plane_dims,
    plane_fill,
)
from kiln.kernels.conv.row_tiles import rows_tile_width, tiled_row
from kiln.kernels.tiles import Epilogue, lanes_loop
from kiln.kernels.tiles import const as _c
from kiln.kernels.tiles import loop as _loop
from kiln.kernels.tiles import nest as _nest
from kiln.ops.conv_geometry import ConvShape


def depthwise_tile_width(shape: ConvShape, lanes: int) -> int:
    """Columns per depthwise tile: as for the row-tiled kernel (`rows_tile_width`)."""
    return rows_tile_width(shape.out_w, lanes)


#: The most output rows one depthwise tile holds: past it an input row's loads are
#: shared by few more rows, and the tile's code (and LLVM's time on it) grows with the
#: rows.
DEPTHWISE_MAX_ROWS = 4


def depthwise_tile_rows(shape: ConvShape, tile_w: int, lanes: int, registers: int) -> int:
    """Output rows per depthwise tile: as many as the register file holds accumulators
    for (`tile_w` columns each, next to an input vector and a broadcast weight), at most
    `DEPTHWISE_MAX_ROWS`, evened out over the image (3 rows of a 9-row image, not 4,
    4 and 1) so that few tiles are partial."""
    vectors = -(-tile_w // lanes)
    most = max(1, min(DEPTHWISE_MAX_ROWS, (registers - 2) // vectors, shape.out_h))
    return -(-shape.out_h // -(-shape.out_h // most))


#: The largest padded channel (bytes) a window kernel copies onto the stack, next to
#: where it reads it (a 112x112 float32 channel, padded, is 52 KB); a larger input is
#: padded into a workspace first.
WINDOW_PLANE_BYTES = 1 << 16


#: One tap of a window kernel: (accumulator, input value, channel, kh, kw) -> the new
#: accumulator (a multiply-add with the depthwise weight, a max or a sum for pooling).
Tap = Callable[[PrimExpr, PrimExpr, PrimExpr, PrimExpr, PrimExpr], PrimExpr]


@dataclass(frozen=True)
class WindowSchedule:
    """The choices of a window kernel (`window_body`; the rule's: `window_schedule`):
    tiles of `rows` output rows x `tile_w` columns, vectors of `lanes`; `local`: each
    channel padded into a plane on the stack just before its tiles read it, rather than
    into a workspace of every channel filled first."""

    tile_w: int
    lanes: int
    rows: int
    local: bool
    #: channels padded onto the stack together before any of their tiles (`local`), so
    #: that a tile reads its plane several channels' stores after them
    channels: int = 1


def window_schedule(shape: ConvShape, dtype: str, tile_w: int, lanes: int, registers: int,
                    l2_bytes: int = 0, compacted: bool = False,
                    channel_blocks: bool = False) -> WindowSchedule:
    """The rule's schedule of a window kernel with tiles `tile_w` columns wide: as many
    rows as `depthwise_tile_rows` gives, and a padded stride-1 input larger than the L2
    (`l2_bytes`, 0: never) padded channel by channel on the stack, as is that of a
    strided kernel's rows of more than one vector computed at stride 1 (`compacted`:
    `shape` is then that stride-1 geometry, `compacted_columns`). With `channel_blocks`,
    rows of one vector (at stride 1 or computed so) are padded on the stack too, in blocks
    of channels (`channel_block`)."""
    sw = shape.stride[1]
    plane = padded_plane_dims(shape, sw)
    # Stride 1, a padded input larger than the L2 (`l2_bytes`, 0: never): each channel
    # is padded into a stack plane just before its tiles read it, in cache, instead of a
    # workspace of every channel filled first, a pass through memory of its own. A
    # workspace within the L2, and a strided layer's phase-split copy, stay workspaces:
    # the per-channel copy costs more there than it saves. Compacted rows of two vectors
    # (28 columns) read their plane less soon after its stores than rows of one do: on
    # the stack they took 0.75-0.85x the workspace's time, rows of one vector 1.3x
    # (docs/performance.md, "ShuffleNet's strided window kernels").
    plane_bytes = plane[0] * plane[1] * plane[2] * itemsize(dtype)
    local = sw == 1 and needs_padding(shape, sw) and plane_bytes <= WINDOW_PLANE_BYTES \
        and ((compacted and shape.out_w > lanes)
             or shape.c_in * plane_bytes > l2_bytes > 0)  # one image's (the batch may vary)
    rows = depthwise_tile_rows(shape, tile_w, lanes, registers)
    # A block of planes, all stored before the first tile reads its own, also takes the
    # rows of one vector off the workspace (a serial pass ahead of the channels' loop).
    narrow = channel_blocks and shape.out_w <= lanes and not local
    block = channel_block(shape) if narrow else 0
    if block and sw == 1 and needs_padding(shape, sw) \
            and block * plane_bytes <= WINDOW_PLANE_BYTES:
        return WindowSchedule(tile_w, lanes, rows, True, block)
    return WindowSchedule(tile_w, lanes, rows, local)


def compacted_columns(shape: ConvShape, lanes: int) -> bool:
    """Whether a window kernel of column stride 2 computes every column of its output
    rows at stride 1 and stores every other one (`window_body`): when those rows fit one
    tile of at most two vectors. A phase-split copy of the input moves each input value
    alone (a strided read per value); the stride-1 row takes the same vectors (a
    7-column row and a 14-column one are one vector each), or twice as many for a
    14-column output of a 28-column input, and its padded copy moves contiguous runs.
    Wider rows keep the phase split."""
    if shape.symbolic_image or shape.stride[1] != 2:
        return False
    return stride1_columns(shape).out_w <= 2 * lanes


def stride1_columns(shape: ConvShape) -> ConvShape:
    """`shape` at stride 1 along the columns (the rows keep theirs)."""
    return replace(shape, stride=(shape.stride[0], 1))


def whole_vector_rows(shape: ConvShape, lanes: int) -> ConvShape | None:
    """The geometry a window kernel computes one tile per output row in, its rows widened
    to whole vectors by zero columns on the right (a 14-column row to 16), or None: for
    padded rows of at most two vectors (the input is copied anyway). A row of 7 or 14
    lanes reads each input vector as pieces of 4, 2 and 1 lanes (no load may pass the
    row's end); widened, one load each, the extra columns computed and not stored."""
    width = shape.out_w
    if shape.symbolic_image or not any(shape.pads) or width > 2 * lanes:
        return None
    top, left, bottom, right = shape.pads
    return replace(shape, pads=(top, left, bottom, right + -width % lanes))


def window_body(shape: ConvShape, x: Buffer, out: Buffer, tile_w: int, lanes: int,
                registers: int, tap: Tap, init: PrimExpr, epilogue: Epilogue,
                l2_bytes: int = 0, channel_blocks: bool = False) -> Stmt:
    """The loop nest of a per-channel window kernel (a depthwise convolution, a 2-D
    pooling) over the NCHW input `x`: each output is `init` combined with `tap` over its
    `kh x kw` window of the input padded with zeros, then stored
    through `epilogue`.

    A tile is `rows` consecutive output rows (`depthwise_tile_rows`) x `tile_w`
    columns of one channel, vectors along the columns. It walks the input rows the tile
    reads once: each (input row, kw) vector is loaded once and combined into every
    output row that reads it (with that row's kh), so a k x k window costs about
    (rows * stride + k) * k / rows loads per output row instead of k * k, and the tile's
    fixed costs (its initialisation, the epilogue's staging) are shared by its rows. The
    input rows are unrolled, the kw taps of each a loop: the code grows with the rows,
    not with rows x kw. `l2_bytes` (the ISA's L2; 0: never) decides where a padded
    stride-1 input is padded: channel by channel on the stack past it
    (`window_schedule`). A strided kernel over narrow rows (`compacted_columns`)
    computes its rows at stride 1 and stores every `stride`-th column; others read the
    input split by column phase. Padded rows of at most two vectors are one tile each,
    widened to whole vectors (`whole_vector_rows`; `tile_w` unused). `channel_blocks`:
    see `window_schedule`."""
    keep = shape.stride[1] if compacted_columns(shape, lanes) else 1
    if keep > 1:
        shape = stride1_columns(shape)
    # one tile per row: widened to whole vectors, or (unpadded) a compacted row as it is
    rows = whole_vector_rows(shape, lanes) or (shape if keep > 1 else None)
    if rows is not None:
        shape, tile_w = rows, rows.out_w
    whole = rows is not None
    schedule = window_schedule(shape, x.dtype, tile_w, lanes, registers, l2_bytes, keep > 1,
                               channel_blocks)
    sw = shape.stride[1]
    if schedule.channels > 1:
        return _blocked_planes(shape, x, out, schedule, tap, init, epilogue, keep, whole)
    if schedule.local:
        xplane = Buffer("xplane", padded_plane_dims(shape, sw), x.dtype, "local")
        fill_plane = plane_fill(x, shape, sw, None, 0,
                                lambda n, c, p, i, q: (_c(p), i, q), xplane)
        window = _Window(shape, out, schedule, tap, init, epilogue,
                         lambda n, c, i, p, q: xplane[p, i, q], x.dtype, keep, whole)

        def planes(n: PrimExpr, c: PrimExpr) -> Stmt:
            return seq(Allocate(xplane), fill_plane(n, c), *_channel(window, n, c))

        return seq(_nest(("n", "c"), (shape.n, shape.c_in), planes))
    xp, prologue = padded_input(x, shape, phases=sw)
    window = _Window(shape, out, schedule, tap, init, epilogue, xp, x.dtype, keep, whole)
    return seq(*prologue, _nest(("n", "c"), (shape.n, shape.c_in),
                                lambda n, c: seq(*_channel(window, n, c))))


def _blocked_planes(shape: ConvShape, x: Buffer, out: Buffer, schedule: WindowSchedule,
                    tap: Tap, init: PrimExpr, epilogue: Epilogue, keep: int, whole: bool
                    ) -> Stmt:
    """`window_body` over blocks of `schedule.channels` channels, each block's padded
    planes stored onto the stack before its tiles."""
    block, sw = schedule.channels, shape.stride[1]
    xplane = Buffer("xplane", (block, *padded_plane_dims(shape, sw)), x.dtype, "local")

    def planes(n: PrimExpr, b: PrimExpr) -> Stmt:
        base = b * block
        fill = plane_fill(x, shape, sw, None, 0,
                          lambda n, c, p, i, q: (c - base, _c(p), i, q), xplane)
        window = _Window(shape, out, schedule, tap, init, epilogue,
                         lambda n, c, i, p, q: xplane[c - base, p, i, q], x.dtype, keep, whole)
        return seq(Allocate(xplane), _loop("k", block, lambda k: fill(n, base + k)),
                   _loop("k", block, lambda k: seq(*_channel(window, n, base + k))))

    return seq(_nest(("n", "b"), (shape.n, shape.c_in // block), planes))


@dataclass(frozen=True)
class _Window:
    """One window loop nest: what its tiles combine and store, and how they read the
    padded input (`read`)."""

    shape: ConvShape
    out: Buffer
    schedule: WindowSchedule
    tap: Tap
    init: PrimExpr
    epilogue: Epilogue
    read: PhaseReader
    acc_t: str  # accumulate in the input dtype (float32); the epilogue may cast
    keep: int = 1  # store every `keep`-th column (`compacted_columns`: one tile per row)
    whole: bool = False  # one tile per row (`whole_vector_rows`): out's columns stored

    @property
    def readers(self) -> dict[int, list[tuple[int, int]]]:
        """Input row offset i (from the tile's first row's first input row) -> the
        (output row j of the tile, window row kh) it feeds: i = j * sh + kh * dh."""
        out: dict[int, list[tuple[int, int]]] = {}
        for j in range(self.schedule.rows):
            for kh in range(self.shape.kh):
                out.setdefault(j * self.shape.stride[0] + kh * self.shape.dilation[0],
                               []).append((j, kh))
        return out


def _channel(window: _Window, n: PrimExpr, c: PrimExpr) -> list[Stmt]:
    """The tiles of channel `c` of image `n`: rows of `rows` output rows, then the rest.
    Every channel writes its own output plane: `parallelize` splits the loop nest at
    its first loop with enough iterations (the channels, at batch 1)."""
    rows, oh_n = window.schedule.rows, window.shape.out_h

    def block(oh0: PrimExpr, height: int) -> Stmt:
        return tiled_row(window.shape.out_w, window.schedule.tile_w, window.schedule.lanes,
                         lambda ow0, width: _tile(window, n, c, oh0, height, ow0, width))

    full, rest = divmod(oh_n, rows)
    parts: list[Stmt] = []
    if full:
        parts.append(_loop("ob", full, lambda ob: block(ob * rows, rows))
                     if full > 1 else block(_c(0), rows))
    if rest:
        parts.append(block(_c(full * rows), rest))
    return parts


def _tile(window: _Window, n: PrimExpr, c: PrimExpr, oh0: PrimExpr, height: int,
          ow0: PrimExpr, width: int) -> Stmt:
    """The tile of `height` output rows from `oh0` x `width` columns from `ow0` of channel
    `c` of image `n`: the input rows it reads walked once, then its stores."""
    shape, acc_t, tap = window.shape, window.acc_t, window.tap
    sh, sw = shape.stride
    dw = shape.dilation[1]
    acc = Buffer("acc", (height, width), acc_t, "local")
    start = lanes_loop("r", width, lambda r: seq(*(
        Store(acc, window.init, (_c(j), r)) for j in range(height))))
    steps: list[Stmt] = []
    for i, pairs in sorted(window.readers.items()):
        uses = [(j, kh) for j, kh in pairs if j < height]
        if not uses:
            continue

        def column(kw: PrimExpr, i: int = i, uses: list[tuple[int, int]] = uses) -> Stmt:
            # column (ow0 + r) * sw + kw * dw lies in phase (kw * dw) % sw at
            # ow0 + r + (kw * dw) // sw: consecutive in r whatever the stride
            phase, shift = ((kw * dw) % sw, (kw * dw) // sw) if sw > 1 else (_c(0), kw * dw)

            def step(r: PrimExpr) -> Stmt:
                xv = Var("xv", acc_t)
                return seq(LetStmt(xv, window.read(n, c, oh0 * sh + i, phase, ow0 + r + shift)),
                           *(Store(acc, tap(acc[_c(j), r], xv, c, _c(kh), kw), (_c(j), r))
                             for j, kh in uses))

            return lanes_loop("r", width, step)

        # the kw loop stays a loop: the tile's code grows with its rows, not rows x kw
        steps.append(_loop("kw", shape.kw, column) if shape.kw > 1 else column(_c(0)))

    # The accumulators are copied to a stack array at constant rows (so they stay in
    # registers), which one loop over the rows stores through the epilogue: one copy
    # of the epilogue's code per tile shape, however many rows the tile has.
    stage = Buffer("stage", (height, width), acc_t, "local")
    copy = lanes_loop("r", width, lambda r: seq(*(
        Store(stage, acc[_c(j), r], (_c(j), r)) for j in range(height))))
    parts: list[Stmt] = [Allocate(stage), copy]
    if window.whole:  # the tile is the whole row (ow0 = 0): out's columns stored
        width = window.out.shape[3]
    if window.keep > 1:
        # every `keep`-th column moved into a row of the output's width, scalar, before
        # the epilogue's vector stores
        packed = Buffer("packed", (height, width), acc_t, "local")
        parts += [Allocate(packed), _loop("j", height, lambda j: _loop(
            "r", width, lambda r: Store(packed, stage[j, r * window.keep], (j, r))))]
        stage = packed

    def store(j: PrimExpr) -> Stmt:
        return lanes_loop("r", width, lambda r: Store(
            window.out, window.epilogue(stage[j, r], (n, c, oh0 + j, ow0 + r)),
            (n, c, oh0 + j, ow0 + r)))

    stores = _loop("j", height, store) if height > 1 else store(_c(0))
    return seq(Allocate(acc), start, *steps, *parts, stores)
