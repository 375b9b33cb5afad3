"""Concatenations as output views (kiln.transform.concat_views): the kernels computing
a concat's inputs write into its output, against onnxruntime on llvm and c."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import kiln
from kiln.frontend import from_onnx
from kiln.ir import tensor as t
from kiln.ir.attrs import ATTR_CONCAT_AXIS
from kiln.ir.visitor import iter_stmts
from kiln.target import Target
from support.graphs import GraphBuilder
from support.reference import onnxruntime_outputs
from support.targets import native_target

X = np.random.default_rng(5).normal(size=(1, 3, 4, 4)).astype(np.float32)


def _model() -> onnx.ModelProto:
    gb = GraphBuilder()
    x = gb.input("x", X.shape)
    a, b = gb.op("Relu", x), gb.op("Sigmoid", x)
    # channels at batch 1, both inputs computed here: views; `a` is read again after.
    # (Each concat is read twice: no elementwise consumer fuses it into its kernel.)
    def twice(concat: str, name: str) -> None:
        gb.node("Add", [gb.op("Neg", concat), gb.op("Exp", concat)], [name])

    twice(gb.op("Concat", a, b, axis=1), "views")
    gb.node("Add", [a, x], ["after"])
    # along H (not contiguous runs), with a graph input, with `b` already in a view
    twice(gb.op("Concat", gb.op("Exp", x), gb.op("Abs", x), axis=2), "rows")
    # read once by an elementwise tail (DenseNet's BatchNorm and ReLU): still views, the
    # tail a kernel of its own (kiln.transform.fuse_ops does not fuse such a concat)
    scale = gb.const(np.linspace(0.5, 1.5, 6, dtype=np.float32).reshape(6, 1, 1), "scale")
    gb.node("Relu", [gb.op("Mul", gb.op("Concat", gb.op("Neg", x), gb.op("Exp", x), axis=1),
                           scale)], ["tail"])
    twice(gb.op("Concat", x, b, axis=1), "param")
    # the concat is the result: views of the output buffer
    gb.node("Concat", [gb.op("Tanh", x), gb.op("Softsign", x)], ["result"], axis=1)
    for name in ("views", "after", "rows", "param", "result", "tail"):
        gb.output(name, typed=False)
    return gb.model(check=False)


@pytest.mark.parametrize("kind", ["llvm", "c"])
def test_concat_inputs_are_views_of_its_output(kind: str) -> None:
    model = _model()
    ex = kiln.compile(from_onnx(model), Target(kind))
    main = ex.ir["main"]
    assert isinstance(main, t.PrimFunc)
    concats = [s for s in iter_stmts(main.body) if isinstance(s, t.CallFunc)
               and ATTR_CONCAT_AXIS in ex.ir[s.func].attrs]
    assert len(concats) == 2  # along H, and with the graph input
    views = {d.buffer.name: (d.source.name, d.byte_offset) for d in iter_stmts(main.body)
             if isinstance(d, t.DeclBuffer) and d.source.name != "workspace"}
    piece = X.nbytes
    assert sorted(off for src, off in views.values() if src == "result") == [0, piece]
    assert sorted(off for src, off in views.values()
                  if src not in ("result", "x")) == [0, 0, piece, piece]  # views, tail
    got = ex.jit()["main"](X)
    want = onnxruntime_outputs(model, {"x": X})
    for g_, w in zip(got, want):
        np.testing.assert_allclose(g_, w, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- chains

CHAIN_X = np.random.default_rng(6).normal(size=(1, 4, 5, 5)).astype(np.float32)
GROWTH = 2


def _chain_model(batch: int | str = 1) -> onnx.ModelProto:
    """A DenseNet-style block written as a chain, `c_{k+1} = concat(c_k, f(c_k))` with
    f = BatchNorm, ReLU, a 3x3 convolution: its last concat is the result `y`. `f_1` is
    a result too (so `c_2` copies), `f_0` is also given to a second concat, and `f_2`
    twice to one: those two concats copy; so does `concat(c_0, f_0, c_1)`, whose first
    inputs are `c_1`'s but which holds `c_1` too."""
    gb = GraphBuilder(1)
    x = gb.input("x", [batch, *CHAIN_X.shape[1:]])
    c = gb.op("Relu", x)
    cin, fs, cs = CHAIN_X.shape[1], [], [c]
    for k in range(4):
        fs.append(gb.conv(gb.op("Relu", gb.bn(c, cin)), cin, GROWTH, 3))
        if k == 1:
            gb.node("Identity", [fs[1]], ["f1"])  # a result: not a view
            fs[1] = "f1"
        if k < 3:
            c = gb.op("Concat", c, fs[k], axis=1)
            cs.append(c)
        cin += GROWTH
    gb.node("Concat", [c, fs[3]], ["y"], axis=1)
    gb.node("Concat", [fs[0], gb.op("Exp", fs[1])], ["other"], axis=1)
    gb.node("Concat", [fs[2], fs[2]], ["twice"], axis=1)
    gb.node("Concat", [cs[0], fs[0], cs[1]], ["prefix"], axis=1)
    gb.node("Add", [fs[0], fs[2]], ["after"])  # pieces read again after the chain
    for name in ("y", "f1", "other", "twice", "after", "prefix"):
        gb.output(name, typed=False)
    return gb.model(check=False)


def _concat_calls(ex: kiln.Executable) -> list[t.CallFunc]:
    main = ex.ir["main"]
    assert isinstance(main, t.PrimFunc)
    return [s for s in iter_stmts(main.body) if isinstance(s, t.CallFunc)
            and ATTR_CONCAT_AXIS in ex.ir[s.func].attrs]


def _check(ex: kiln.Executable, model: onnx.ModelProto, x: np.ndarray) -> None:
    out = ex.jit()["main"](x)
    got = out if isinstance(out, tuple) else (out,)
    want = onnxruntime_outputs(model, {"x": x})
    assert len(got) == len(want)
    for g_, w in zip(got, want):
        np.testing.assert_allclose(g_, w, rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def chain_model() -> onnx.ModelProto:
    return _chain_model()


@pytest.mark.parametrize("kind", ["llvm", "c"])
def test_concat_chain_is_one_buffer(kind: str, chain_model: onnx.ModelProto) -> None:
    """`c_3 = concat(concat(c_1', f_2), f_3)` nests: the block from `c_2` on is the result
    `y`, each kernel writing its channels in place; the concats that must copy do."""
    ex = kiln.compile(from_onnx(chain_model), native_target(kind))
    main = ex.ir["main"]
    assert isinstance(main, t.PrimFunc)
    # c_2 (f_1 is a result), `other` (f_0 is in c_1 already), `twice` (f_2 twice) and
    # `prefix` (c_1 twice, as itself and as the place of c_0, f_0)
    assert len(_concat_calls(ex)) == 4
    views = [(d.buffer.shape, d.byte_offset) for d in iter_stmts(main.body)
             if isinstance(d, t.DeclBuffer) and d.source.name == "y"]
    plane = 5 * 5 * 4
    c2, c3 = (8 * plane, (0, 0)), (10 * plane, (0, 0))
    # every view of the chain is one of y: c_3 and f_3 in y, c_2 and f_2 in c_3; the
    # first concat c_1 (its pieces in it) is the input of the copying c_2
    assert sorted((int(np.prod(s)) * 4, off) for s, off in views) == sorted(
        [(c2[0], 0), (GROWTH * plane, c2[0]), (c3[0], 0), (GROWTH * plane, c3[0])])
    _check(ex, chain_model, CHAIN_X)


def test_concat_chain_with_a_symbolic_batch() -> None:
    """With a symbolic batch the pieces are no contiguous runs: every concat copies, and
    the answer is onnxruntime's at batch 2."""
    model = _chain_model("n")
    ex = kiln.compile(from_onnx(model), Target("llvm"))
    assert len(_concat_calls(ex)) == 7
    _check(ex, model, np.concatenate([CHAIN_X, -CHAIN_X]))


def _blocked_chain() -> onnx.ModelProto:
    """A DenseNet block as exported, 1x1 convolutions of 16 channels each, blocked
    NCHW{b}c (whole blocks of 16 on AVX-512, two of 8 on AVX2): each layer reads
    `c_k = concat(f_0, ..., f_k)` of every earlier output, `f_{k+1} = conv(c_k)`."""
    gb = GraphBuilder(2)
    x = gb.input("x", [1, 16, 4, 4])
    c, cin = gb.op("Relu", gb.conv(x, 16, 16, 3)), 16
    features = [c]
    for _ in range(3):
        features.append(gb.conv(c, cin, 16, 1))
        c = gb.op("Concat", *features, axis=1)
        cin += 16
    gb.node("Conv", [c, gb.weight(8, cin, 1, 1)], ["y"], kernel_shape=[1, 1])
    gb.output("y", typed=False)
    return gb.model(check=False)


@pytest.mark.parametrize("kind", ["llvm", "llvm-avx2"])
def test_blocked_concat_chain_is_one_buffer(kind: str) -> None:
    """In NCHW{b}c every convolution of the block writes its blocks into the last
    concat's buffer, each concat's output the first piece of the next (their first
    inputs are its inputs): no concat is called, and all six views (f_0, f_1, c_1, f_2,
    c_2, f_3) are of one buffer."""
    model = _blocked_chain()
    ex = kiln.compile(from_onnx(model), native_target(kind), graph_pipeline="nchwc")
    main = ex.ir["main"]
    assert isinstance(main, t.PrimFunc)
    assert not _concat_calls(ex)
    views = [d for d in iter_stmts(main.body)
             if isinstance(d, t.DeclBuffer) and d.source.name != "workspace"]
    assert len(views) == 6 and len({d.source.name for d in views}) == 1
    assert views[0].source.shape[1] * views[0].source.shape[-1] == 64  # blocked 64 channels
    x = np.random.default_rng(7).normal(size=(1, 16, 4, 4)).astype(np.float32)
    _check(ex, model, x)
