"""fold-constants and fold-batchnorm: what they rewrite, what they leave, and that the
rewritten graph computes the same values (kiln.ir.evaluate)."""

from __future__ import annotations

import numpy as np
import pytest

from kiln import evaluate
from kiln.frontend import from_onnx
from kiln.ir import IRBuilder, IRModule
from kiln.ir import graph as g
from kiln.ir.types import TensorType
from kiln.ops import call, pack_memory
from kiln.transform.fold_batchnorm import FoldBatchNorm
from kiln.transform.fold_constants import FoldConstants
from support.graphs import GraphBuilder
from support.reference import ort_session

RNG = np.random.default_rng(0)


def _ops(mod: IRModule) -> list[str]:
    return [b.value.op for b in mod["main"].bindings if isinstance(b.value, g.Call)]


def _const(*shape: int) -> g.Constant:
    return g.Constant(RNG.normal(0, 1, shape).astype(np.float32))


# --------------------------------------------------------------------------- fold-constants

def _fold_example() -> IRModule:
    ib = IRBuilder()
    with ib.function("main"):
        x = ib.param("x", TensorType((2, 3), "float32"))
        a = ib.emit(call("exp", _const(3)), "a")                # constant
        b = ib.emit(call("add", a, _const(3)), "b")             # constant through a
        parts = ib.emit(call("split", _const(4), sections=(1, 3)), "parts")
        first = ib.emit(g.TupleGetItem(parts, 0), "first")      # constant tuple item
        y = ib.emit(call("multiply", x, b), "y")                # depends on x: kept
        z = ib.emit(call("add", y, first), "z")
        ib.ret(z)
    return ib.get()


def test_fold_constants_folds_chains_and_keeps_live_calls() -> None:
    mod = _fold_example()
    folded = FoldConstants()(mod)
    assert _ops(folded) == ["multiply", "add"]
    x = RNG.normal(0, 1, (2, 3)).astype(np.float32)
    np.testing.assert_allclose(evaluate(folded, "main", x), evaluate(mod, "main", x),
                               rtol=1e-6)
    # the folded multiply takes a Constant holding exp(c0) + c1
    mul = folded["main"].bindings[0].value
    assert isinstance(mul, g.Call) and isinstance(mul.args[1], g.Constant)


def test_fold_constants_is_identity_when_nothing_folds() -> None:
    ib = IRBuilder()
    with ib.function("main"):
        x = ib.param("x", TensorType((3,), "float32"))
        ib.ret(ib.emit(call("relu", x), "y"))
    mod = ib.get()
    assert FoldConstants()(mod) is mod


def test_fold_constants_keeps_outputs_and_big_broadcasts_as_calls() -> None:
    ib = IRBuilder()
    with ib.function("main"):
        x = ib.param("x", TensorType((3,), "float32"))
        big = ib.emit(call("broadcast_to", _const(1), shape=(512, 512)), "big")
        total = ib.emit(call("reduce_sum", big, axes=None, keepdims=False), "total")
        out = ib.emit(call("copy", _const(3)), "const_out")
        y = ib.emit(call("add", x, total), "y")
        ib.ret(g.Tuple((y, out)))
    folded = FoldConstants()(ib.get())
    # the broadcast would grow a 1-element constant to 262144 elements: kept
    assert _ops(folded) == ["broadcast_to", "reduce_sum", "copy", "add"]
    assert FoldConstants(max_growth=10**6)(ib.get()) is not None
    assert _ops(FoldConstants(max_growth=10**6)(ib.get())) == ["copy", "add"]


# --------------------------------------------------------------------------- fold-batchnorm

def _conv_bn_model(bias: bool, relu: bool, extra_use: bool = False):
    c = 6
    b = GraphBuilder()
    b.const(RNG.normal(0, 0.3, (c, 3, 3, 3)).astype(np.float32), name="w")
    conv_in = ["x", "w"]
    if bias:
        conv_in.append(b.const(RNG.normal(0, 0.1, c).astype(np.float32), name="b"))
    for name, lo, hi in (("gamma", 0.5, 1.5), ("beta", -0.2, 0.2), ("mean", -0.2, 0.2),
                         ("var", 0.5, 1.5)):
        b.const(RNG.uniform(lo, hi, c).astype(np.float32), name=name)
    b.node("Conv", conv_in, ["c"], pads=[1, 1, 1, 1])
    b.node("BatchNormalization", ["c", "gamma", "beta", "mean", "var"], ["bn"], epsilon=1e-3)
    out = "bn"
    if relu:
        b.node("Relu", ["bn"], ["r"])
        out = "r"
    b.input("x", [1, 3, 5, 5])
    b.output(out, [1, c, 5, 5])
    if extra_use:
        b.output("c", [1, c, 5, 5])
    return b.model(opset=15)


@pytest.mark.parametrize(("bias", "relu"), [(False, True), (True, False)])
def test_batchnorm_folds_into_the_convolution(bias: bool, relu: bool,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # the scaled weight of a large convolution lies on a mapping (kiln.ops.pack_memory):
    # take this small one from there too
    monkeypatch.setattr(pack_memory, "MIN_MAPPED_BYTES", 1)
    model = _conv_bn_model(bias, relu)
    mod = from_onnx(model)
    assert _ops(mod)[:3] == ["conv2d", "multiply", "add"]
    folded = FoldBatchNorm()(mod)
    assert _ops(folded) == ["conv2d"] + (["relu"] if relu else [])
    conv = folded["main"].bindings[0].value
    assert isinstance(conv, g.Call) and len(conv.args) == 3   # the folded bias
    weight = conv.args[1]
    root = weight.data.base  # an array over the mapping's buffer, not numpy's memory
    assert isinstance(weight, g.Constant) and isinstance(root, np.ndarray) and \
        isinstance(root.base, memoryview)
    x = RNG.normal(0, 1, (1, 3, 5, 5)).astype(np.float32)
    (want,) = ort_session(model).run(None, {"x": x})
    np.testing.assert_allclose(evaluate(folded, "main", x), want, rtol=1e-4, atol=1e-5)


def test_batchnorm_is_not_folded_when_the_conv_output_has_another_use() -> None:
    mod = from_onnx(_conv_bn_model(bias=False, relu=False, extra_use=True))
    assert FoldBatchNorm()(mod) is mod


def test_only_per_channel_constants_fold() -> None:
    ib = IRBuilder()
    with ib.function("main"):
        x = ib.param("x", TensorType((1, 2, 4, 4), "float32"))
        c = ib.emit(call("conv2d", x, _const(3, 2, 1, 1)), "c")
        # varies along the width: not a per-channel scale
        s = ib.emit(call("multiply", c, _const(1, 1, 1, 4)), "s")
        ib.ret(s)
    mod = ib.get()
    assert FoldBatchNorm()(mod) is mod


def test_scalar_scale_and_subtract_fold() -> None:
    ib = IRBuilder()
    with ib.function("main"):
        x = ib.param("x", TensorType((1, 2, 4, 4), "float32"))
        c = ib.emit(call("conv2d", x, _const(3, 2, 1, 1)), "c")
        s = ib.emit(call("multiply", g.Constant(np.array(0.5, np.float32)), c), "s")
        d = ib.emit(call("subtract", s, _const(3, 1, 1)), "d")
        ib.ret(d)
    mod = ib.get()
    folded = FoldBatchNorm()(mod)
    assert _ops(folded) == ["conv2d"]
    x = RNG.normal(0, 1, (1, 2, 4, 4)).astype(np.float32)
    np.testing.assert_allclose(evaluate(folded, "main", x), evaluate(mod, "main", x),
                               rtol=1e-5, atol=1e-6)


def test_conv1d_with_a_separate_bias_add_folds() -> None:
    ib = IRBuilder()
    with ib.function("main"):
        x = ib.param("x", TensorType((2, 3, 7), "float32"))
        c = ib.emit(call("conv1d", x, _const(4, 3, 3), pads=(1, 1)), "c")
        ib.ret(ib.emit(call("add", c, _const(4, 1)), "y"))
    mod = ib.get()
    folded = FoldBatchNorm()(mod)
    assert _ops(folded) == ["conv1d"]
    x = RNG.normal(0, 1, (2, 3, 7)).astype(np.float32)
    np.testing.assert_allclose(evaluate(folded, "main", x), evaluate(mod, "main", x),
                               rtol=1e-5, atol=1e-6)
