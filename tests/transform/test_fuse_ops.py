"""FuseOps: elementwise chains fuse into their producer, results stay exact."""

from __future__ import annotations

import numpy as np

from kiln import evaluate, ops
from kiln.ir import IRBuilder, IRModule, verify
from kiln.ir import graph as g
from kiln.transform.fuse_ops import MAX_FUSED_OPS, FuseOps
from kiln.transform.pipeline import get_pipeline

RNG = np.random.default_rng(7)


def _conv_chain(extra_use: bool = False) -> IRModule:
    ib = IRBuilder()
    with ib.function("main"):
        x = ib.param("x", (1, 3, 8, 8), "float32")
        w = g.Constant(RNG.standard_normal((4, 3, 3, 3)).astype("float32"), "w")
        b = g.Constant(RNG.standard_normal((1, 4, 1, 1)).astype("float32"), "b")
        c = ib.emit(ops.call("conv2d", x, w, pads=(1, 1, 1, 1)), "c")
        a = ib.emit(ops.call("add", c, b), "a")
        r = ib.emit(ops.call("relu", a), "r")
        ib.ret(g.Tuple((r, c)) if extra_use else r)
    return ib.get()


def _kernels(mod: IRModule) -> list[str]:
    return [e.func for e in (b.value for b in mod["main"].bindings)  # type: ignore[union-attr]
            if isinstance(e, g.CallTensor)]


def test_conv_bias_relu_fuse_into_one_kernel() -> None:
    fused = FuseOps().run(_conv_chain())
    assert _kernels(fused) == ["fused_conv2d_add_relu"]
    assert len(fused["main"].bindings) == 1  # type: ignore[union-attr]


def test_a_value_used_twice_is_not_fused_away() -> None:
    fused = FuseOps().run(_conv_chain(extra_use=True))
    # c is returned as well as consumed by add: add+relu fuse, conv stays separate
    calls = [b.value for b in fused["main"].bindings]  # type: ignore[union-attr]
    assert any(isinstance(v, g.Call) and v.op == "conv2d" for v in calls)
    assert _kernels(fused) == ["fused_add_relu"]


def test_a_value_read_by_an_alias_binding_is_not_fused_away() -> None:
    ib = IRBuilder()
    with ib.function("main"):
        x = ib.param("x", (4,), "float32")
        e = ib.emit(ops.call("exp", x), "e")
        r = ib.emit(ops.call("relu", e), "r")
        alias = ib.emit(e, "alias")  # a second reader of e, after the chain
        ib.ret(g.Tuple((r, alias)))
    fused = FuseOps().run(ib.get())
    verify(fused)  # e is still bound: its alias reads it
    assert _kernels(fused) == []


def test_broadcast_reread_is_not_fused() -> None:
    ib = IRBuilder()
    with ib.function("main"):
        x = ib.param("x", (4, 8), "float32")
        s = ib.emit(ops.call("reduce_sum", x, axes=(1,), keepdims=True), "s")
        # s (4x1) would be re-read 8 times per row if inlined: keep it materialized
        ib.ret(ib.emit(ops.call("subtract", x, s), "d"))
    assert _kernels(FuseOps().run(ib.get())) == []


def _assert_lowered_agrees_with_the_interpreter(mod: IRModule) -> None:
    x = RNG.standard_normal((1, 3, 8, 8)).astype("float32")
    want = evaluate(mod, "main", x)
    wants = list(want) if isinstance(want, tuple) else [want]
    lowered = get_pipeline("default", "graph")(mod)  # fuse, legalize, lower
    outs = [np.empty_like(w) for w in wants]
    evaluate(lowered, "main", x, *outs)  # the lowered main writes its outputs
    for o, w in zip(outs, wants):
        np.testing.assert_allclose(o, w, rtol=1e-5, atol=1e-5)


def test_fused_and_unfused_pipelines_agree_with_the_interpreter() -> None:
    for mod in (_conv_chain(), _conv_chain(extra_use=True)):
        _assert_lowered_agrees_with_the_interpreter(mod)


def _elementwise_chain(n: int) -> IRModule:
    ib = IRBuilder()
    with ib.function("main"):
        x = ib.param("x", (4,), "float32")
        v = x
        for k in range(n):
            v = ib.emit(ops.call("tanh" if k % 2 else "neg", v), f"e{k}")
        ib.ret(v)
    return ib.get()


def test_fusion_is_capped_so_expressions_stay_shallow() -> None:
    """A long elementwise chain becomes several kernels of at most `max_group` ops."""
    n = 800
    mod = _elementwise_chain(n)
    fused = FuseOps().run(mod)
    assert FuseOps().max_group == MAX_FUSED_OPS
    assert len(fused["main"].bindings) == n // MAX_FUSED_OPS  # type: ignore[union-attr]
    small = FuseOps(max_group=3).run(mod)
    assert len(small["main"].bindings) == -(-n // 3)  # type: ignore[union-attr]
    x = RNG.standard_normal(4).astype("float32")
    want = evaluate(mod, "main", x)
    # (The unfused graph runs each op's numpy reference; 800 ops accumulate rounding.)
    np.testing.assert_allclose(evaluate(fused, "main", x), want, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(evaluate(small, "main", x), want, rtol=1e-4, atol=1e-6)


def _silu_after(op: str, *args: g.Expr, **attrs: object) -> IRModule:
    """`y = op(args)` followed by `y * sigmoid(y)`: the tail reads y twice."""
    ib = IRBuilder()
    with ib.function("main"):
        x = ib.param("x", (3, 5), "float32")
        y = ib.emit(ops.call(op, x, *args, **attrs), "y")
        s = ib.emit(ops.call("sigmoid", y), "s")
        ib.ret(ib.emit(ops.call("multiply", y, s), "m"))
    return ib.get()


def test_a_tail_reading_a_value_twice_fuses_when_the_value_is_cheap() -> None:
    w = g.Constant(RNG.standard_normal((5, 4)).astype("float32"), "w")
    b = g.Constant(RNG.standard_normal((4,)).astype("float32"), "b")
    ib = IRBuilder()
    with ib.function("main"):
        x = ib.param("x", (3, 5), "float32")
        y = ib.emit(ops.call("matmul", x, w), "y")
        a = ib.emit(ops.call("add", y, b), "a")
        s = ib.emit(ops.call("sigmoid", a), "s")
        ib.ret(ib.emit(ops.call("multiply", a, s), "m"))
    mod = ib.get()
    fused = FuseOps().run(mod)
    assert _kernels(fused) == ["fused_matmul_add_sigmoid_multiply"]
    x = RNG.standard_normal((3, 5)).astype("float32")
    # the fused kernel rounds its sums in its own order: an ulp or two of float32 (1e-6
    # was exceeded by 1.7e-6 on some draws of the module's generator, order-dependent)
    np.testing.assert_allclose(evaluate(fused, "main", x), evaluate(mod, "main", x),
                               rtol=1e-5, atol=1e-6)


def test_an_anchor_read_twice_fuses_only_into_a_hand_written_kernel() -> None:
    # a tensor-expression reduction (over a leading axis: no row kernel) would be
    # recomputed per read: the tail stays apart
    assert _kernels(FuseOps().run(_silu_after("reduce_sum", axes=(0,), keepdims=True))) \
        == ["fused_sigmoid_multiply"]
    # over the trailing axis the row kernel applies the tail to its total
    assert _kernels(FuseOps().run(_silu_after("reduce_sum", axes=(1,), keepdims=True))) \
        == ["fused_reduce_sum_sigmoid_multiply"]
    w = g.Constant(RNG.standard_normal((4, 5, 8)).astype("float32"), "w")  # packed panels
    mod = _silu_after("matmul_packed", w, n=30)
    fused = FuseOps().run(mod)
    assert _kernels(fused) == ["fused_matmul_packed_sigmoid_multiply"]
    x = RNG.standard_normal((3, 5)).astype("float32")
    np.testing.assert_allclose(evaluate(fused, "main", x), evaluate(mod, "main", x),
                               rtol=1e-5, atol=1e-6)


def test_a_value_read_outside_the_group_ends_it() -> None:
    ib = IRBuilder()
    with ib.function("main"):
        x = ib.param("x", (4,), "float32")
        e = ib.emit(ops.call("exp", x), "e")
        s = ib.emit(ops.call("sigmoid", e), "s")
        m = ib.emit(ops.call("multiply", e, s), "m")
        ib.ret(g.Tuple((m, s)))  # s is a result too: no group may swallow it or e
    fused = FuseOps().run(ib.get())
    verify(fused)
    assert _kernels(fused) == []


def _quantized_concat_chain() -> IRModule:
    # DenseNet's float code between two quantized convolutions: concat of dequantized
    # values -> quantize -> dequantize -> BatchNorm (multiply, add) -> quantize
    ib = IRBuilder()
    with ib.function("main"):
        a = ib.param("a", (1, 3, 4, 4), "float32")
        b = ib.param("b", (1, 5, 4, 4), "float32")
        s = g.Constant(np.array(0.05, "float32"), "s")
        z = g.Constant(np.array(128, "uint8"), "z")
        m = g.Constant(RNG.uniform(0.5, 2, (1, 8, 1, 1)).astype("float32"), "m")
        k = g.Constant(RNG.standard_normal((1, 8, 1, 1)).astype("float32"), "k")
        c = ib.emit(ops.call("concat", a, b, axis=1), "c")
        q = ib.emit(ops.call("quantize_linear", c, s, z), "q")
        d = ib.emit(ops.call("dequantize_linear", q, s, z), "d")
        y = ib.emit(ops.call("add", ib.emit(ops.call("multiply", d, m), "bn"), k), "y")
        ib.ret(ib.emit(ops.call("quantize_linear", y, s, z), "out"))
    return ib.get()


def test_dtype_changes_join_a_layout_chain_exactly() -> None:
    mod = _quantized_concat_chain()
    fused = FuseOps().run(mod)
    assert len(fused["main"].bindings) == 1  # type: ignore[union-attr]
    assert _kernels(fused)[0].startswith("fused_concat_quantize_linear_dequantize_linear")
    a = (RNG.standard_normal((1, 3, 4, 4)) * 3).astype("float32")
    b = (RNG.standard_normal((1, 5, 4, 4)) * 3).astype("float32")
    want = evaluate(mod, "main", a, b)
    out = np.empty_like(want)
    evaluate(get_pipeline("default", "graph")(mod), "main", a, b, out)
    np.testing.assert_array_equal(out, want)


def test_a_dtype_change_does_not_join_an_anchor() -> None:
    # a float convolution's hand-built epilogue keeps its dtype: the cast stays apart
    ib = IRBuilder()
    with ib.function("main"):
        x = ib.param("x", (1, 3, 8, 8), "float32")
        w = g.Constant(RNG.standard_normal((4, 3, 3, 3)).astype("float32"), "w")
        c = ib.emit(ops.call("conv2d", x, w, pads=(1, 1, 1, 1)), "c")
        r = ib.emit(ops.call("relu", c), "r")
        ib.ret(ib.emit(ops.call("cast", r, dtype="float16"), "h"))
    assert _kernels(FuseOps().run(ib.get())) == ["fused_conv2d_relu"]


def _relu_over_concat(extra_use: bool = False) -> IRModule:
    """relu(concat(conv2d(x), exp(x))), `exp(x)` also returned when `extra_use`."""
    ib = IRBuilder()
    with ib.function("main"):
        x = ib.param("x", (1, 3, 8, 8), "float32")
        w = g.Constant(RNG.standard_normal((4, 3, 1, 1)).astype("float32"), "w")
        parts = (ib.emit(ops.call("conv2d", x, w), "c"), ib.emit(ops.call("exp", x), "e"))
        r = ib.emit(ops.call("relu", ib.emit(ops.call("concat", *parts, axis=1), "k")), "r")
        ib.ret(g.Tuple((r, parts[1])) if extra_use else r)
    return ib.get()


def test_a_unary_op_over_a_concat_moves_onto_its_inputs() -> None:
    """relu(concat(conv, exp)) -> concat(relu(conv), relu(exp)), each ReLU fused into its
    producer; not when an input is read elsewhere (its ReLU could fuse into nothing)."""
    fused = FuseOps().run(_relu_over_concat())
    assert _kernels(fused) == ["fused_conv2d_relu", "fused_exp_relu"]
    last = fused["main"].bindings[-1].value  # type: ignore[union-attr]
    assert isinstance(last, g.Call) and last.op == "concat"
    assert _kernels(FuseOps().run(_relu_over_concat(extra_use=True))) == ["fused_concat_relu"]
    for mod in (_relu_over_concat(), _relu_over_concat(extra_use=True)):
        _assert_lowered_agrees_with_the_interpreter(mod)
