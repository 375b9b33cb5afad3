"""The symbolic arithmetic exporters rely on (issue 59): exact division of polynomial
sizes (kiln.ir.polynomial.divide), used by the canonical form's floor division and
remainder and by `exact_div`, checked against integer evaluation; and the
exporters' patterns it lets through, each compiled once with every axis symbolic and
run against onnxruntime at three sizes: a Range whose length is `batch*seq // batch`
(the dynamo exporter's position ids) and a Reshape to `[-1, past + seq, 4]` (its
attention over a key/value cache). What stays unproven is refused naming the node and
the fewest variables whose pin fixes it (kiln.ir.pin_hint)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping

import numpy as np
import onnx
import pytest
from onnx import helper
from symbolic_check import Feeds, check_vs_onnxruntime, const, f32, onnx_model

from kiln.errors import FrontendError
from kiln.frontend.onnx import from_onnx
from kiln.ir import polynomial
from kiln.ir.pin_hint import pin_hint, pin_hint_where
from kiln.ir.shape_expr import (
    dim_text,
    dim_var,
    dims_equal,
    eval_dim,
    exact_div,
    shape_text,
    simplify_dim,
    substitute,
)
from kiln.ir.tensor import BinaryOp, as_expr
from kiln.ops.manip import reshape_groups
from kiln.ops.reshape_dims import fill_rest

B, S, P = dim_var("batch"), dim_var("seq"), dim_var("past")
SAMPLES = [dict(zip(("batch", "seq", "past"), v))
           for v in itertools.product((1, 2, 7), (1, 5, 64), (0, 3, 9))]
node = helper.make_node


def _op(op: str, a: object, b: object) -> BinaryOp:
    return BinaryOp(op, as_expr(a, "int64"), as_expr(b, "int64"))  # type: ignore[arg-type]


def test_a_product_divided_by_a_factor_is_the_other_factor() -> None:
    assert dim_text(simplify_dim(_op("floordiv", B * S, B))) == "seq"
    assert simplify_dim(_op("floormod", B * S, B)) == 0
    assert dim_text(simplify_dim(_op("floordiv", B * (P + S) * 768, (P + S) * 64))) == "batch*12"
    assert simplify_dim(_op("floormod", (P + S) * 64, P + S)) == 0
    assert dim_text(simplify_dim(_op("div", B * S * 4 + B * P * 4, S + P))) == "batch*4"


def test_exact_div_proves_multiples_of_sums() -> None:
    assert dim_text(exact_div(B * 12 * (P + S) * 64, (P + S) * 64)) == "batch*12"
    assert dim_text(exact_div((P + S) * (P + S) * B, P + S)) == "batch*past + batch*seq"
    assert dim_text(exact_div(S * S - 1, S - 1)) == "seq + 1"       # over the rationals
    assert exact_div(2 * S + 2, S + 1) == 2
    assert exact_div(S + 1, 2 * S + 2) is None                      # 1/2: no integer polynomial
    assert exact_div(B * S + 1, B) is None
    assert exact_div(B * S, 2 * B) is None
    assert exact_div(S, 0) is None and exact_div(0, S) == 0


def test_division_is_exact_iff_a_multiple() -> None:
    # random products f*g divide by g (quotient f); f*g + r with a non-zero r of lower
    # degree never does
    rng = np.random.default_rng(59)
    atoms = [(("var", n, k),) for k, n in enumerate(("a", "b", "c"))]
    for _ in range(200):
        f, g = ({_mono(rng, atoms): int(rng.integers(1, 5)) for _ in range(rng.integers(1, 4))}
                for _ in range(2))
        product = polynomial.mul(f, g)
        assert polynomial.divide(product, g) == f
        if polynomial.degree(max(g, key=polynomial.degree)) > 0:
            assert polynomial.divide(polynomial.add(product, {(): 1}), g) is None


def _mono(rng: np.random.Generator, atoms: list[tuple[object, ...]]) -> polynomial.Mono:
    powers = rng.integers(0, 3, size=len(atoms))
    return tuple((atom[0], int(p)) for atom, p in zip(atoms, powers, strict=True) if p)


@pytest.mark.parametrize("expr", [
    _op("floordiv", B * S, B), _op("floormod", B * S + 3, B), _op("floordiv", B * S + 3, B),
    _op("floordiv", (P + S) * 64 * B, P + S), _op("floordiv", S * S - 1, S + 1),
    _op("floormod", S * S + S, S + 1), _op("floordiv", P * S, S + 1),
], ids=range(7))
def test_canonical_division_keeps_the_value(expr: BinaryOp) -> None:
    canon = simplify_dim(expr)
    for values in SAMPLES:
        if eval_dim(expr.b, values) != 0:
            assert eval_dim(canon, values) == eval_dim(expr, values), values


def test_reshape_infers_minus_one_over_a_cache_length() -> None:
    src = (B, 12, P + S, 64)
    out = fill_rest(src, (-1, P + S, 64))
    assert dims_equal(out[0], B * 12) is True
    assert reshape_groups(src, out) == [((0, 2), (0, 1)), ((2, 3), (1, 2)), ((3, 4), (2, 3))]


def test_pin_hint_pins_a_batch_to_one() -> None:
    assert pin_hint(["seq", "batch"]) == (
        'pin batch, seq with shape_dict={"batch": 1, "seq": 128} '
        "(CLI: kiln compile ... --shape batch=1 --shape seq=128)")


# --------------------------------------------------------------- exporters' patterns


def _position_ids() -> tuple[onnx.ModelProto, Feeds]:
    """The dynamo exporter's position ids: `Range(0, (batch*seq) // batch)` from the
    mask's shape and the ids' batch, added to the ids."""
    nodes = [node("Shape", ["mask"], ["b0"], start=0, end=1),
             node("Shape", ["mask"], ["s0"], start=1, end=2),
             node("Shape", ["ids"], ["b1"], start=0, end=1),
             node("Mul", ["b0", "s0"], ["n"]), node("Div", ["n", "b1"], ["len1"]),
             node("Squeeze", ["len1"], ["len"]),
             node("Range", ["zero", "len", "one"], ["pos"]),
             node("Add", ["ids", "pos"], ["o"])]
    model = onnx_model(nodes, [helper.make_tensor_value_info("ids", onnx.TensorProto.INT64,
                                                             ["b", "s"]),
                               helper.make_tensor_value_info("mask", onnx.TensorProto.INT64,
                                                             ["b", "s"])],
                       [const("zero", np.int64(0)), const("one", np.int64(1))],
                       out_type=onnx.TensorProto.INT64)

    def feeds(rng: np.random.Generator, b: int, s: int) -> Mapping[str, np.ndarray]:
        return {"ids": rng.integers(0, 50, (b, s)), "mask": np.ones((b, s), np.int64)}
    return model, feeds


def _heads_over_a_cache() -> tuple[onnx.ModelProto, Feeds]:
    """The dynamo exporter's attention over a cache: keys `[b, 2, p + s, 4]` viewed as
    `[-1, p + s, 4]` (a multiple of `(p + s)*4`), the scores batched over `b*2`."""
    nodes = [node("Concat", ["past", "k"], ["keys"], axis=2),
             node("Shape", ["keys"], ["tail"], start=-2),
             node("Concat", ["minus_one", "tail"], ["target"], axis=0),
             node("Reshape", ["keys", "target"], ["flat"]),
             node("Transpose", ["flat"], ["flat_t"], perm=[0, 2, 1]),
             node("Shape", ["q"], ["q_tail"], start=-2),
             node("Concat", ["minus_one", "q_tail"], ["target_q"], axis=0),
             node("Reshape", ["q", "target_q"], ["q3"]),
             node("MatMul", ["q3", "flat_t"], ["o"])]
    model = onnx_model(nodes, [f32("q", ["b", 2, "s", 4]), f32("k", ["b", 2, "s", 4]),
                               f32("past", ["b", 2, "p", 4])],
                       [const("minus_one", np.int64([-1]))])

    def feeds(rng: np.random.Generator, b: int, s: int) -> Mapping[str, np.ndarray]:
        return {"q": rng.standard_normal((b, 2, s, 4)).astype(np.float32),
                "k": rng.standard_normal((b, 2, s, 4)).astype(np.float32),
                "past": rng.standard_normal((b, 2, s + b, 4)).astype(np.float32)}
    return model, feeds


@pytest.mark.parametrize("make", [_position_ids, _heads_over_a_cache],
                         ids=["range_of_a_quotient", "reshape_over_a_cache"])
def test_exporters_patterns_match_onnxruntime(make: object) -> None:
    model, feeds = make()  # type: ignore[operator]
    check_vs_onnxruntime(model, feeds, "llvm")


def test_a_size_that_is_no_multiple_is_refused_naming_the_node_and_a_pin() -> None:
    nodes = [node("Reshape", ["x", "target"], ["o"], name="view_it")]
    model = onnx_model(nodes, [f32("x", ["batch", "seq", 3])],
                       [const("target", np.int64([-1, 2]))])
    with pytest.raises(FrontendError) as info:
        from_onnx(model)
    text = str(info.value)
    assert text.startswith("node 'view_it' (Reshape): reshape: cannot view [batch, seq, 3] as "
                           "[-1, 2]: batch*seq*3 is not a multiple of 2 for every value of the "
                           "symbolic dimensions; "), text
    # the fewest variables whose pin makes it a multiple, and the pin works
    assert text.endswith(pin_hint(["seq"])), text
    from_onnx(model, shape_dict={"seq": 128})


def test_sizes_an_operator_needs_equal_that_differ_by_two_names_become_one() -> None:
    # An export that named the past keys' and values' lengths apart (torch's Dim.DYNAMIC):
    # the scores [.., s, p + s] times the values [.., q + s, 4] need p == q, which two
    # names of one size are: the import makes them one variable (p), checked per call.
    nodes = [node("Concat", ["past_scores", "new_scores"], ["scores"], axis=3),
             node("Concat", ["past_v", "v"], ["values"], axis=2),
             node("MatMul", ["scores", "values"], ["o"], name="weigh")]
    model = onnx_model(nodes, [f32("past_scores", ["b", 2, "s", "p"]),
                               f32("new_scores", ["b", 2, "s", "s"]),
                               f32("past_v", ["b", 2, "q", 4]), f32("v", ["b", 2, "s", 4])])
    main = from_onnx(model)["main"]
    assert [shape_text(p.type.shape) for p in main.params][2] == "[b, 2, p, 4]"
    assert shape_text(main.ret_type.shape) == "[b, 2, s, 4]"


def test_the_pin_hint_names_the_fewest_variables_that_fix_a_size() -> None:
    # `batch*seq*3` viewed with a -1 beside a 2: pinning batch to 1 leaves seq*3, no
    # multiple of 2; pinning seq to 128 alone makes it one
    count, known = B * S * 3, 2

    def holds(pins: Mapping[str, int]) -> bool:
        return exact_div(substitute(count, pins), substitute(known, pins)) is not None

    assert pin_hint_where(holds, ["batch", "seq"]) == pin_hint(["seq"])
    assert pin_hint_where(lambda pins: False, ["seq", "batch"]) == pin_hint(["batch", "seq"])
    assert dim_text(substitute(B * S + P, {"batch": 1, "past": 4})) == "seq + 4"
