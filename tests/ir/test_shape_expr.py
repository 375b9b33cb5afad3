"""kiln.ir.shape_expr: canonical symbolic dimensions, checked against integer evaluation."""

from __future__ import annotations

import itertools

import pytest

from kiln.errors import CallError, IRError
from kiln.ir.shape_expr import (
    dim_product,
    dim_terms,
    dim_text,
    dim_var,
    dim_vars,
    dims_equal,
    eval_dim,
    exact_div,
    is_static,
    shape_text,
    shapes_equal,
    simplify_dim,
)
from kiln.ir.tensor import min_
from kiln.ir.types import TensorType

B, S, H = dim_var("batch"), dim_var("seq"), dim_var("h")
SAMPLES = [dict(zip(("batch", "seq", "h"), v))
           for v in itertools.product((1, 2, 7), (1, 5, 128), (3, 8, 225))]

EXPRS = [
    B * S * 768, S * 4, S + S + S + S - 2 * S, (H + 2 * 1 - 3) // 2 + 1, (H * 2 + 2) // 2,
    (H - 1) % 4, B * (S + 1) - B, 3 * (B + S) - B * 0, (S * 12) // 12 + (H // 1),
    3 - S, -S, -(2 * S) - B + 4, S - min_(1, S),
]


@pytest.mark.parametrize("expr", EXPRS, ids=range(len(EXPRS)))
def test_canonical_form_keeps_the_value(expr):
    canon = simplify_dim(expr)
    for values in SAMPLES:
        assert eval_dim(canon, values) == eval_dim(expr, values)


def test_equal_spellings_are_equal():
    assert dims_equal(S * 4, S + S + S + S) is True
    assert dims_equal(B * S, S * B) is True
    assert dims_equal(S + 1, S) is False
    assert dims_equal(S, B) is None
    assert dims_equal((H + 2 - 3) // 2 + 1, (H - 1) // 2 + 1) is True
    assert simplify_dim(S - S + 3) == 3 and is_static(S - S + 3) and not is_static([S, 4])


def test_exact_division():
    q = exact_div(B * S * 768, S * 12)
    assert q is not None and dims_equal(q, B * 64) is True
    assert exact_div(2 * S + 2, S + 1) == 2
    assert exact_div(S, B) is None
    assert exact_div(S * 3, 2) is None
    assert exact_div(S, 0) is None
    assert exact_div(0, S) == 0


def test_products_vars_and_text():
    assert dims_equal(dim_product([B, 3, S, 2]), 6 * B * S) is True
    assert dim_product([]) == 1
    assert [v.name for v in dim_vars([S * B, 4, H])] == ["batch", "h", "seq"]
    assert dim_text((H + 2 - 3) // 2 + 1) == "(h - 1)//2 + 1"
    assert shape_text([B, S * 4, 64]) == "[batch, seq*4, 64]"
    assert dim_text(min_(1, S) * -1 + S) == "seq - min(1, seq)"
    assert dim_text(3 - S) == "3 - seq" and dim_text(-S) == "-seq"
    with pytest.raises(CallError, match="dimension 'seq \\+ 1' has no value for 'seq'"):
        eval_dim(S + 1, {"batch": 1})
    with pytest.raises(IRError, match="division by zero"):
        simplify_dim(S - S + (B // (S - S)) * 0 + 4 // (H - H + 0 * B))


@pytest.mark.parametrize("expr", EXPRS, ids=range(len(EXPRS)))
def test_dim_terms_sum_to_the_dimension(expr):
    # Each sum with positive coefficients splits into terms that add up to it at every
    # value; a negative coefficient or constant gives None.
    terms = dim_terms(expr)
    if terms is None:  # a negative part (`3 - seq`): test_dim_terms_of_a_cache_length
        return
    for values in SAMPLES:
        assert sum(eval_dim(t, values) for t in terms) == eval_dim(expr, values)


def test_dim_terms_of_a_cache_length():
    assert [dim_text(t) for t in dim_terms(B + S * 2 + 1)] == ["batch", "seq", "seq", "1"]
    assert dim_terms(S - 1) is None
    assert dim_terms(3 - S) is None
    assert [dim_text(t) for t in dim_terms(B * S * 2)] == ["batch*seq", "batch*seq"]


def test_tensor_types_compare_symbolic_dims_by_value() -> None:
    # two ops build the same size as separate expressions: equal types, equal hashes
    h, w = dim_var("h"), dim_var("w")
    a = TensorType((1, 8, (h - 1) // 2 + 1, w + 2), "float32")
    b = TensorType((1, 8, 1 + (h - 1) // 2, 2 + w), "float32")
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a != TensorType((1, 8, (h - 1) // 2 + 1, w + 3), "float32")
    assert a != TensorType((1, 8, (h - 1) // 2 + 1, w + 2), "float16")
    assert shapes_equal((h * w, 3), (w * h, 3)) and not shapes_equal((h,), (w,))


def test_batchnorm_folds_into_a_convolution_over_a_symbolic_image() -> None:
    import numpy as np

    import kiln
    from kiln.frontend import from_onnx
    from support.graphs import GraphBuilder
    from support.reference import ort_session

    gb = GraphBuilder(seed=2)
    x = gb.input("x", (1, 3, "h", "w"))
    gb.output(gb.op("Relu", gb.bn(gb.conv(x, 3, 8, 3, bias=False), 8)), typed=False)
    model = gb.model(check=False)
    ex = kiln.compile(from_onnx(model), "llvm")
    names = [n for n in ex.ir.functions if n != "main"]
    assert not any("multiply" in n or "add" in n for n in names), names  # folded
    a = np.random.default_rng(0).standard_normal((1, 3, 11, 7)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(ex["main"](a)),
                               ort_session(model).run(None, {"x": a})[0], rtol=1e-5, atol=1e-5)
