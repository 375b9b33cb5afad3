"""ONNX LSTM, GRU and RNN: unrolled over a static sequence length, a loop over a symbolic one.

The x products of every step and gate are one MatMul before the steps, each step's h
products one MatMul for every gate (both on the GEMM kernels), then elementwise gate
math; a symbolic length makes the step the body of a graph Loop (`_looped`).
`sequence_lens` is applied with masks: a batch entry past its length keeps its state
and writes zeros to Y, which also makes the reverse direction start at each entry's
own last step (as onnxruntime does).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.errors import FrontendError
from kiln.frontend.onnx.converters.manip import reshape_to
from kiln.frontend.onnx.converters.registry import GraphContext, first_input, onnx_op
from kiln.ir import graph as g
from kiln.ir.shape_expr import dim_text, is_static, shape_text

Act = Callable[[g.Expr], g.Expr]

# ONNX activation name -> (kiln op, number of alpha/beta values it takes).
_SIMPLE = {"Relu": "relu", "Tanh": "tanh", "Sigmoid": "sigmoid", "Softsign": "softsign",
           "Softplus": "softplus"}
_WITH_ALPHA = {"LeakyRelu": "leaky_relu", "ThresholdedRelu": "thresholded_relu",
               "Elu": "elu"}
_DEFAULTS = {"LeakyRelu": (0.01,), "ThresholdedRelu": (1.0,), "Elu": (1.0,),
             "HardSigmoid": (0.2, 0.5), "Affine": (1.0, 0.0), "ScaledTanh": (1.0, 1.0)}


def _activations(ctx: GraphContext, attrs: dict[str, Any], defaults: Sequence[str],
                 num_dir: int, op: str) -> list[list[Act]]:
    """The activation functions of each direction (`defaults` per direction)."""
    names = [str(n.decode() if isinstance(n, bytes) else n)
             for n in attrs.get("activations", list(defaults) * num_dir)]
    if len(names) != len(defaults) * num_dir:
        raise FrontendError(f"{op}: activations lists {len(names)} functions, expected "
                            f"{len(defaults) * num_dir}")
    alphas = list(attrs.get("activation_alpha", []))
    betas = list(attrs.get("activation_beta", []))
    acts: list[Act] = []
    for name in names:
        acts.append(_activation(ctx, name, alphas, betas, op))
    k = len(defaults)
    return [acts[d * k:(d + 1) * k] for d in range(num_dir)]


def _activation(ctx: GraphContext, name: str, alphas: list[float], betas: list[float],
                op: str) -> Act:
    """One activation; its alpha/beta are consumed in order from the attribute lists."""
    def take(values: list[float], default: float) -> float:
        return float(values.pop(0)) if values else default

    if name in _SIMPLE:
        kop = _SIMPLE[name]
        return lambda x: ctx.call(kop, x)
    if name in _WITH_ALPHA:
        kop, alpha = _WITH_ALPHA[name], take(alphas, _DEFAULTS[name][0])
        return lambda x: ctx.call(kop, x, alpha=alpha)
    if name in ("HardSigmoid", "Affine", "ScaledTanh"):
        a, b = take(alphas, _DEFAULTS[name][0]), take(betas, _DEFAULTS[name][1])
        if name == "HardSigmoid":
            return lambda x: ctx.call("hard_sigmoid", x, alpha=a, beta=b)
        if name == "Affine":
            return lambda x: ctx.call("add", ctx.call("multiply", x, _c(ctx, x, a)),
                                      _c(ctx, x, b))
        return lambda x: ctx.call("multiply", _c(ctx, x, a), ctx.call(
            "tanh", ctx.call("multiply", x, _c(ctx, x, b))))
    choices = sorted([*_SIMPLE, *_WITH_ALPHA, "HardSigmoid", "Affine", "ScaledTanh"])
    raise FrontendError(f"{op}: unknown activation {name!r}; choices: {', '.join(choices)}")


def _c(ctx: GraphContext, like: g.Expr, v: float) -> g.Expr:
    return ctx.const(np.asarray(v, dtype=ctx.tensor_type(like).dtype))


def take_range(ctx: GraphContext, x: g.Expr, axis: int, start: int, stop: int) -> g.Expr:
    """`x[start:stop]` along `axis`."""
    return ctx.call("strided_slice", x, starts=(start,), ends=(stop,), axes=(axis,),
                    steps=(1,))


class Cell:
    """The weights of one direction `d` of a recurrent node, every gate side by side
    (`[in, gates*H]` for x @ W, `[H, gates*H]` for h @ R), and the input `x`
    (`[seq, batch, in]`) its steps read. The x products of every step and gate are one
    matrix product before the steps (`step_inputs`), each step's h products one more
    (`hr`, shared by the gates): a step asks `step_input`, `xw`, `hr` and `pre` (a
    quantized cell answers with integer products: converters.quant_recurrent)."""

    def __init__(self, ctx: GraphContext, inputs: Sequence[g.Expr | None], d: int,
                 gates: int, hidden: int, x: g.Expr) -> None:
        self.ctx, self.h, self.x, self.gates = ctx, hidden, x, gates
        w, r, b = inputs[1], inputs[2], inputs[3] if len(inputs) > 3 else None
        assert w is not None and r is not None
        self.w, self.r = self._mat(w, d), self._mat(r, d)
        self.wb: g.Expr | None = None
        self.rb: g.Expr | None = None
        if b is not None:
            bd = reshape_to(ctx, take_range(ctx, b, 0, d, d + 1), (2 * gates * hidden,))
            self.wb = take_range(ctx, bd, 0, 0, gates * hidden)
            self.rb = take_range(ctx, bd, 0, gates * hidden, 2 * gates * hidden)
        self._inputs: g.Expr | None = None
        self._hr: tuple[g.Expr, g.Expr] | None = None

    def _mat(self, m: g.Expr, d: int) -> g.Expr:
        """Direction d of W or R (`[dirs, gates*H, n]`) as `[n, gates*H]`."""
        part = take_range(self.ctx, m, 0, d, d + 1)
        n = self.ctx.tensor_type(m).shape[2]
        return self.ctx.call("transpose", reshape_to(self.ctx, part, (self.gates * self.h, n)),
                             perm=(1, 0))

    def gate(self, v: g.Expr, k: int) -> g.Expr:
        """Gate `k`'s part of the last axis of an every-gate value."""
        return take_range(self.ctx, v, -1, k * self.h, (k + 1) * self.h)

    def _product(self, v: g.Expr, m: g.Expr, bias: g.Expr | None) -> g.Expr:
        y = self.ctx.call("matmul", v, m)
        return y if bias is None else self.ctx.call("add", y, bias)

    def step_inputs(self) -> g.Expr:
        """x @ W + Wb of every step and gate, `[seq, batch, gates*H]` (one product)."""
        if self._inputs is None:
            self._inputs = self._product(self.sequence, self.w, self.wb)
        return self._inputs

    def xw(self, xt: g.Expr, k: int) -> g.Expr:
        """x @ W_k + Wb_k of the step whose `step_input` is `xt`."""
        return self.gate(xt, k)

    def hr(self, h: g.Expr, k: int) -> g.Expr:
        """h @ R_k + Rb_k: gate k's part of one product for every gate (per `h`)."""
        if self._hr is None or self._hr[0] is not h:
            self._hr = (h, self._every_hr(h))
        return self.gate(self._hr[1], k)

    #: The gates `hr` is asked for, the first ones (None: every gate): GRU without
    #: `linear_before_reset` reads only z's and r's columns of the shared product (its
    #: third gate's product is `hr_alone`'s), so the product leaves the third out.
    hr_gates: int | None = None

    def _every_hr(self, h: g.Expr) -> g.Expr:
        if self.hr_gates is None or self.hr_gates == self.gates:
            return self._product(h, self.r, self.rb)
        width = self.hr_gates * self.h
        return self._product(h, take_range(self.ctx, self.r, 1, 0, width),
                             None if self.rb is None else take_range(self.ctx, self.rb, 0, 0,
                                                                     width))

    def hr_of_nothing(self, k: int) -> g.Expr | None:
        """Gate `k`'s h term where no state is multiplied (`_Node.skips_first_hr`):
        Rb_k alone, None without B."""
        return None if self.rb is None else self.gate(self.rb, k)

    def hr_alone(self, h: g.Expr, k: int) -> g.Expr:
        """h @ R_k + Rb_k for gate k only (GRU's product of the reset-gated state)."""
        rk = take_range(self.ctx, self.r, 1, k * self.h, (k + 1) * self.h)
        return self._product(h, rk, None if self.rb is None else self.gate(self.rb, k))

    #: Whether a product's result for one row depends on the other rows it is computed
    #: with (a quantized cell's dynamic ranges): the unrolled steps then follow
    #: onnxruntime's order of rows with `sequence_lens` (`unroll`).
    rows_together = False

    @property
    def sequence(self) -> g.Expr:
        """What the x products read, `[seq, batch, in]`: x."""
        return self.x

    def step_input(self, t: int) -> g.Expr:
        """Step `t`'s part of `step_inputs`, `[1, batch, gates*H]`."""
        return take_range(self.ctx, self.step_inputs(), 0, t, t + 1)

    def reverse_rows(self, lens: g.Expr) -> None:
        """Read each row's first `lens` steps in reverse from now on (ONNX
        ReverseSequence)."""
        self.x = self.ctx.call("reverse_sequence", self.x, lens, batch_axis=1, time_axis=0)
        self._inputs = None

    def pre(self, xt: g.Expr, h: g.Expr, k: int) -> g.Expr:
        """Gate `k`'s value before its activation: (x @ W_k + Wb_k) + (h @ R_k + Rb_k)."""
        return self.ctx.call("add", self.xw(xt, k), self.hr(h, k))


CellMaker = Callable[[GraphContext, Sequence[g.Expr | None], int, int, int, g.Expr], Cell]


def unroll(kind: str, ctx: GraphContext, inputs: Sequence[g.Expr | None],
           attrs: dict[str, Any], make_cell: CellMaker = Cell,
           transposed: bool = False) -> list[g.Expr]:
    """The outputs of the recurrent node `kind` ("LSTM", "GRU", "RNN") with ONNX's
    `inputs` and `attrs`: unrolled over a static sequence length, a graph Loop over a
    symbolic one; each direction's weights and products made by `make_cell`. W and R
    are [directions, gates * hidden, columns], or [directions, columns, gates * hidden]
    if `transposed`."""
    x = first_input(inputs)
    layout = int(attrs.get("layout", 0))
    if layout:
        x = ctx.call("transpose", x, perm=(1, 0, 2))
    seq, batch, _ = ctx.tensor_type(x).shape
    r = inputs[2] if len(inputs) > 2 else None
    if r is None or len(inputs) < 2 or inputs[1] is None:
        raise FrontendError(f"{kind}: inputs W and R are required")
    # hidden_size is optional in ONNX: R is [num_directions, gates*H, H].
    hidden_dim = attrs.get("hidden_size", ctx.tensor_type(r).shape[-1])
    if not is_static(hidden_dim):
        raise FrontendError(f"{kind}: the hidden size must be static")
    hidden = int(hidden_dim)
    direction = attrs.get("direction", "forward")
    direction = direction.decode() if isinstance(direction, bytes) else str(direction)
    dirs = {"forward": [False], "reverse": [True], "bidirectional": [False, True]}
    if direction not in dirs:
        raise FrontendError(f"{kind}: unknown direction {direction!r}; choices: "
                            "forward, reverse, bidirectional")
    gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[kind]
    # Before anything is sized by hidden_size (a state of zeros: 2**32 was a MemoryError)
    nd, size = len(dirs[direction]), ctx.tensor_type(x).shape[2]
    for name, arg, rows, cols in (("W", inputs[1], gates * hidden, size),
                                  ("R", r, gates * hidden, hidden)):
        want = (nd, cols, rows) if transposed else (nd, rows, cols)
        have = ctx.tensor_type(arg).shape
        if len(have) != 3 or any(is_static(d) and is_static(w) and d != w
                                 for d, w in zip(have, want)):
            raise FrontendError(f"{kind}: {name} of shape {shape_text(have)} does not fit "
                                f"hidden_size {hidden} and {nd} direction(s): "
                                f"{shape_text(want)} expected")
    opt = list(inputs) + [None] * (8 - len(inputs))
    seq_lens, init_h, init_c, peep = opt[4], opt[5], opt[6], opt[7]
    if layout:
        init_h = None if init_h is None else ctx.call("transpose", init_h, perm=(1, 0, 2))
        init_c = None if init_c is None else ctx.call("transpose", init_c, perm=(1, 0, 2))
    dtype = ctx.tensor_type(x).dtype
    zero_state = _zeros(ctx, (1, batch, hidden), dtype)
    masks: list[g.Expr | None] = []
    if is_static(seq):  # the unrolled steps' masks, shared by the directions
        masks = [None] * int(seq)  # type: ignore[arg-type]
        if seq_lens is not None:
            lens = reshape_to(ctx, seq_lens, (1, batch, 1))
            ltype = ctx.tensor_type(seq_lens).dtype
            masks = [ctx.call("less", ctx.const(np.asarray(t, dtype=ltype)), lens)
                     for t in range(len(masks))]
    node = _Node(kind, attrs, inputs, make_cell, gates, hidden, len(dirs[direction]), x,
                 seq_lens, zero_state, masks, init_h is not None)
    ys, hs, cs = [], [], []
    for d, reverse in enumerate(dirs[direction]):
        h = zero_state if init_h is None else take_range(ctx, init_h, 0, d, d + 1)
        c = zero_state if init_c is None else take_range(ctx, init_c, 0, d, d + 1)
        p = None if peep is None else take_range(ctx, peep, 0, d, d + 1)
        run = _unrolled if is_static(seq) else _looped
        y, h, c = run(ctx, node, d, reverse, h, c, p)
        ys.append(y)
        hs.append(h)
        cs.append(c)
    y_all = ys[0] if len(ys) == 1 else ctx.call("concat", *ys, axis=1)
    h_all = hs[0] if len(hs) == 1 else ctx.call("concat", *hs, axis=0)
    c_all = cs[0] if len(cs) == 1 else ctx.call("concat", *cs, axis=0)
    if layout:
        y_all = ctx.call("transpose", y_all, perm=(2, 0, 1, 3))
        h_all = ctx.call("transpose", h_all, perm=(1, 0, 2))
        c_all = ctx.call("transpose", c_all, perm=(1, 0, 2))
    return [y_all, h_all, c_all][:len(ctx.node_outputs)]


@dataclass(frozen=True)
class _Node:
    """What every direction of a recurrent node shares."""

    kind: str
    attrs: dict[str, Any]
    inputs: Sequence[g.Expr | None]
    make_cell: CellMaker
    gates: int
    hidden: int
    num_dirs: int
    x: g.Expr  # [seq, batch, in] (layout 1 transposed already)
    seq_lens: g.Expr | None
    zero_state: g.Expr  # [1, batch, H]
    masks: list[g.Expr | None]  # per unrolled step: the rows still running (None: all)
    initial_h: bool  # whether the node has an initial_h input

    @property
    def skips_first_hr(self) -> bool:
        """Whether the first step leaves out h @ R: onnxruntime's RNN without initial_h
        has no previous state there (a non-finite R stays out of it: 0 x inf would be
        NaN); its LSTM and GRU multiply a state of zeros."""
        return self.kind == "RNN" and not self.initial_h

    def cell(self, ctx: GraphContext, inputs: Sequence[g.Expr | None], d: int,
             x: g.Expr) -> Cell:
        """Direction `d`'s cell (`make_cell`), its shared h product covering the gates
        the step reads from it (`Cell.hr_gates`)."""
        cell = self.make_cell(ctx, inputs, d, self.gates, self.hidden, x)
        if self.kind == "GRU" and not int(self.attrs.get("linear_before_reset", 0)):
            cell.hr_gates = 2
        return cell

    def activations(self, ctx: GraphContext, d: int) -> list[Act]:
        defaults = {"LSTM": ("Sigmoid", "Tanh", "Tanh"), "GRU": ("Sigmoid", "Tanh"),
                    "RNN": ("Tanh",)}[self.kind]
        return _activations(ctx, self.attrs, defaults, self.num_dirs, self.kind)[d]


Direction = tuple[g.Expr, g.Expr, g.Expr]  # Y [seq, 1, batch, H], final h, final c


def _unrolled(ctx: GraphContext, node: _Node, d: int, reverse: bool, h: g.Expr, c: g.Expr,
              p: g.Expr | None) -> Direction:
    """Direction `d` over a static sequence length: each step its own ops."""
    batch = ctx.tensor_type(node.x).shape[1]
    steps, hidden, seq_lens = len(node.masks), node.hidden, node.seq_lens
    zero_state, masks = node.zero_state, node.masks
    # whether the node's Y is read (onnxruntime then reads a finished row's h from it)
    y_read = bool(ctx.node_outputs) and bool(ctx.node_outputs[0])
    cell = node.cell(ctx, node.inputs, d, node.x)
    acts = node.activations(ctx, d)
    step = _STEPS[node.kind]
    outs: list[g.Expr] = [zero_state] * steps
    # onnxruntime's order, where a cell's products depend on which rows share them
    # (`Cell.rows_together`): a reversed direction runs each row's own steps reversed,
    # all rows from their first step on, and a finished row's h is read as Y's 0
    by_row = cell.rows_together and seq_lens is not None
    if by_row and reverse:
        assert seq_lens is not None
        cell.reverse_rows(seq_lens)
    h_read: g.Expr | None = None if node.skips_first_hr else h
    for t in (range(steps - 1, -1, -1) if reverse and not by_row else range(steps)):
        xt = cell.step_input(t)
        h_new, c_new = step(ctx, cell, acts, node.attrs, xt, h_read, c, p)
        m = masks[t]
        if m is None:
            h, c, outs[t] = h_new, c_new, h_new
        else:
            outs[t] = ctx.call("where", m, h_new, zero_state)
            h = ctx.call("where", m, h_new, h)
            c = ctx.call("where", m, c_new, c)
        h_read = outs[t] if by_row and y_read else h
    if not steps:  # an empty sequence: no output rows, the state as it came in
        return _zeros(ctx, (0, 1, batch, hidden), ctx.tensor_type(h).dtype), h, c
    y = ctx.call("concat", *outs, axis=0) if steps > 1 else outs[0]
    if by_row and reverse:
        assert seq_lens is not None
        y = ctx.call("reverse_sequence", y, seq_lens, batch_axis=1, time_axis=0)
    return reshape_to(ctx, y, (steps, 1, batch, hidden)), h, c


def _looped(ctx: GraphContext, node: _Node, d: int, reverse: bool, h: g.Expr, c: g.Expr,
            p: g.Expr | None) -> Direction:
    """Direction `d` over a symbolic sequence length: a graph Loop whose body is one
    step (the same cell and step code as `_unrolled`), Y its scan output. A reversed
    direction's iteration i is step `seq - 1 - i`, and Y is flipped after the loop."""
    x, seq_lens = node.x, node.seq_lens
    seq = ctx.tensor_type(x).shape[0]
    trip = ctx.call("reshape", ctx.call("shape_of", x, start=0, end=1), shape=())
    lens = None if seq_lens is None else reshape_to(
        ctx, seq_lens, (1, ctx.tensor_type(x).shape[1], 1))

    outer_cell = node.cell(ctx, node.inputs, d, x)
    if outer_cell.rows_together and seq_lens is not None:
        name = dim_text(seq)
        raise FrontendError(
            f"{node.kind}: sequence_lens over a symbolic sequence length ({name}) with "
            "rows quantized together (onnxruntime's order of rows is unrolled): pin the "
            f"length, e.g. shape_dict={{{name!r}: N}} or `kiln compile --shape {name}=N`")
    # every step's x products before the loop, one product (`Cell.step_inputs`)
    inputs = outer_cell.step_inputs()
    last = ctx.call("subtract", trip, ctx.const(np.asarray(1, np.int64)))

    def body(sub: GraphContext, i: g.Expr, states: list[g.Expr]) -> tuple[list[g.Expr],
                                                                           list[g.Expr]]:
        h, c = states
        # a cell reads W, R, B and a quantized one its scales and zero points; x stays an
        # outer value, as the body reads only `inputs`, made before the loop
        weights = [None if v is None or k in (0, 4, 5, 6, 7) else sub.outer(v)
                   for k, v in enumerate(node.inputs)]
        cell = node.cell(sub, weights, d, x)
        t = sub.call("subtract", sub.outer(last), i) if reverse else i
        xt = sub.call("gather", sub.outer(inputs), sub.call("reshape", t, shape=(1,)), axis=0)
        step, acts = _STEPS[node.kind], node.activations(sub, d)
        peep = None if p is None else sub.outer(p)
        h_new, c_new = step(sub, cell, acts, node.attrs, xt, h, c, peep)
        if node.skips_first_hr:
            first, _ = step(sub, cell, acts, node.attrs, xt, None, c, peep)
            zero_i = sub.const(np.zeros((), sub.tensor_type(i).dtype))
            h_new = sub.call("where", sub.call("equal", i, zero_i), first, h_new)
        if lens is None:
            return [h_new, c_new], [h_new]
        inner = sub.outer(lens)
        m = sub.call("less", sub.call("cast", t, dtype=sub.tensor_type(inner).dtype), inner)
        zero = sub.const(np.zeros((), sub.tensor_type(h_new).dtype))
        return ([sub.call("where", m, h_new, h), sub.call("where", m, c_new, c)],
                [sub.call("where", m, h_new, zero)])

    h, c, y = ctx.loop(node.kind.lower(), trip, [h, c], seq, body)
    if reverse:
        y = ctx.call("strided_slice", y, starts=(-1,), ends=(-(2 ** 62),), axes=(0,),
                     steps=(-1,))
    return y, h, c


def _zeros(ctx: GraphContext, shape: tuple[Any, ...], dtype: str) -> g.Expr:
    zero = ctx.const(np.zeros((), dtype=dtype))
    if is_static(shape):
        return ctx.const(np.zeros(tuple(int(s) for s in shape), dtype=dtype))
    return ctx.call("where", ctx.true_of_shape(shape), zero, zero)


def _clip(ctx: GraphContext, x: g.Expr, attrs: dict[str, Any]) -> g.Expr:
    """RNN's clip of a gate's input (onnxruntime's `max(min(x, clip), -clip)`, a NaN
    stays), none without the attribute."""
    if "clip" not in attrs:
        return x
    lim = float(attrs["clip"])
    return ctx.call("clip", x, min=-lim, max=lim)


#: LSTM's and GRU's clip when the node sets none (onnxruntime's: float32's largest).
DEFAULT_GATE_CLIP = float(np.finfo(np.float32).max)


def _gate_clip(ctx: GraphContext, cell: Cell, x: g.Expr, attrs: dict[str, Any]) -> g.Expr:
    """LSTM's and GRU's input to a gate's activation as onnxruntime's kernels clip it, to
    `clip` (`DEFAULT_GATE_CLIP` without the attribute): with a bias B, `max(-clip,
    min(clip, x))` in C++'s `std::min` and `std::max`, which make a NaN +clip (an LSTM
    whose gates are NaN reads them as saturated: `tanh(1)` where every gate is 1);
    without one, a NaN stays."""
    lim = float(attrs.get("clip", DEFAULT_GATE_CLIP))
    if cell.wb is None:
        return ctx.call("clip", x, min=-lim, max=lim)
    hi, lo = _c(ctx, x, lim), _c(ctx, x, -lim)
    below = ctx.call("where", ctx.call("less", x, hi), x, hi)  # std::min(clip, x)
    return ctx.call("where", ctx.call("greater", below, lo), below, lo)  # std::max(-clip, .)


StepOut = tuple[g.Expr, g.Expr]


def _lstm_step(ctx: GraphContext, cell: Cell, acts: list[Act], attrs: dict[str, Any],
               xt: g.Expr, h: g.Expr, c: g.Expr, p: g.Expr | None) -> StepOut:
    f, gact, hact = acts
    hid = cell.h

    def pre(k: int) -> g.Expr:  # gate order i, o, f, c
        return cell.pre(xt, h, k)

    def peep(k: int, state: g.Expr) -> g.Expr | None:  # P order i, o, f
        return None if p is None else ctx.call(
            "multiply", take_range(ctx, p, 1, k * hid, (k + 1) * hid), state)

    def gate(k: int, pk: int, state: g.Expr) -> g.Expr:
        z, pp = pre(k), peep(pk, state)
        return f(_gate_clip(ctx, cell, z if pp is None else ctx.call("add", z, pp), attrs))

    i = gate(0, 0, c)
    if int(attrs.get("input_forget", 0)):
        fg = ctx.call("subtract", _c(ctx, i, 1.0), i)
    else:
        fg = gate(2, 2, c)
    cand = gact(_gate_clip(ctx, cell, pre(3), attrs))
    c_new = ctx.call("add", ctx.call("multiply", fg, c), ctx.call("multiply", i, cand))
    o = gate(1, 1, c_new)
    return ctx.call("multiply", o, hact(c_new)), c_new


def _gru_step(ctx: GraphContext, cell: Cell, acts: list[Act], attrs: dict[str, Any],
              xt: g.Expr, h: g.Expr, c: g.Expr, p: g.Expr | None) -> StepOut:
    f, gact = acts
    z = f(_gate_clip(ctx, cell, ctx.call("add", cell.xw(xt, 0), cell.hr(h, 0)), attrs))
    r = f(_gate_clip(ctx, cell, ctx.call("add", cell.xw(xt, 1), cell.hr(h, 1)), attrs))
    if int(attrs.get("linear_before_reset", 0)):
        hh = ctx.call("multiply", r, cell.hr(h, 2))
    else:
        hh = cell.hr_alone(ctx.call("multiply", r, h), 2)
    cand = gact(_gate_clip(ctx, cell, ctx.call("add", cell.xw(xt, 2), hh), attrs))
    # H = (1 - z) * cand + z * H_prev = cand + z * (H_prev - cand)
    h_new = ctx.call("add", cand, ctx.call("multiply", z, ctx.call("subtract", h, cand)))
    return h_new, c


def _rnn_step(ctx: GraphContext, cell: Cell, acts: list[Act], attrs: dict[str, Any],
              xt: g.Expr, h: g.Expr | None, c: g.Expr, p: g.Expr | None) -> StepOut:
    """One RNN step; `h` None: no previous state, x's product alone (`skips_first_hr`)."""
    (f,) = acts
    hr = cell.hr_of_nothing(0) if h is None else cell.hr(h, 0)
    pre = cell.xw(xt, 0) if hr is None else ctx.call("add", cell.xw(xt, 0), hr)
    return f(_clip(ctx, pre, attrs)), c


# (ctx, cell, activations, attrs, x_t, h or None (RNN only), c, peepholes) -> (h, c)
_STEPS: dict[str, Callable[..., StepOut]] = {"LSTM": _lstm_step, "GRU": _gru_step,
                                             "RNN": _rnn_step}


@onnx_op("LSTM")
def _lstm_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
               attrs: dict[str, Any]) -> list[g.Expr]:
    """ONNX LSTM (opset 7+, layout 0/1), unrolled."""
    return unroll("LSTM", ctx, inputs, attrs)


@onnx_op("GRU")
def _gru_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
              attrs: dict[str, Any]) -> list[g.Expr]:
    """ONNX GRU (opset 7+, layout 0/1, linear_before_reset 0/1), unrolled."""
    return unroll("GRU", ctx, inputs, attrs)


@onnx_op("RNN")
def _rnn_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
              attrs: dict[str, Any]) -> list[g.Expr]:
    """ONNX RNN (opset 7+, layout 0/1), unrolled."""
    return unroll("RNN", ctx, inputs, attrs)
