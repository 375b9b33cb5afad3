"""Two names for one size: input dimensions the graph needs equal become one variable.

torch's `Dim.AUTO` exports name each input's axes apart (the past keys' length `s20`,
the past values' `s8`); an Add, Concat or MatMul that needs them equal cannot prove
it. kiln imports assuming them equal, then makes each such pair one variable
(kiln.frontend.onnx.importer), so the library runs at every size onnxruntime runs and
refuses a call whose inputs disagree (docs/dynamic-shapes.md).
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import kiln
from kiln.errors import CallError, FrontendError
from kiln.frontend import from_onnx
from kiln.ir.shape_expr import dim_text, equated_variables
from kiln.ir.tensor import Var
from support.graphs import GraphBuilder
from support.graphs import value_info as vi
from support.reference import onnxruntime_outputs


def _model(nodes: list, inputs: dict[str, list], out: str = "y") -> object:
    b = GraphBuilder()
    b.add(*nodes)
    return b.model([vi(n, d) for n, d in inputs.items()], [vi(out, None)], check=False)


# keys and values of a cache named apart: `concat(past_k, k) + concat(k, past_v)`
CACHE = _model([helper.make_node("Concat", ["past_k", "k"], ["pk"], axis=0),
                helper.make_node("Concat", ["k", "past_v"], ["kp"], axis=0),
                helper.make_node("Add", ["pk", "kp"], ["y"])],
               {"past_k": ["s20", 4], "past_v": ["s8", 4], "k": ["s41", 4]})
# a product whose inner sizes are named apart, then a broadcast against a third name
PRODUCT = _model([helper.make_node("MatMul", ["a", "b"], ["ab"]),
                  helper.make_node("Add", ["ab", "c"], ["y"])],
                 {"a": ["m", "k1"], "b": ["k2", "n"], "c": ["m2", "n"]})


def test_equated_variables_finds_two_names_of_one_size() -> None:
    s20, s8, s41 = Var("s20", "int64"), Var("s8", "int64"), Var("s41", "int64")
    assert equated_variables(s20 + s41, s41 + s8) == ("s20", "s8")
    assert equated_variables(s20, s8) == ("s20", "s8")
    assert equated_variables(s20 * 2, s8 * 2) is None   # equal then too, but not x - y
    assert equated_variables(s20 + 1, s8) is None
    assert equated_variables(s20, s20) is None


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_a_cache_named_apart_runs_as_onnxruntime_and_refuses_disagreeing_inputs(
        target: str) -> None:
    module = from_onnx(CACHE)
    shapes = {p.name: [dim_text(d) for d in p.type.shape] for p in module["main"].params}
    assert shapes["past_k"][0] == shapes["past_v"][0] != shapes["k"][0]
    main = kiln.compile(module, target)["main"]
    rng = np.random.default_rng(0)
    for past, new in ((0, 2), (3, 3), (5, 1)):
        feeds = {"past_k": rng.standard_normal((past, 4), np.float32),
                 "past_v": rng.standard_normal((past, 4), np.float32),
                 "k": rng.standard_normal((new, 4), np.float32)}
        (want,) = onnxruntime_outputs(CACHE, feeds)
        np.testing.assert_allclose(np.asarray(main(*feeds.values())), want, rtol=1e-6)
    bad = (np.zeros((3, 4), np.float32), np.zeros((2, 4), np.float32),
           np.zeros((1, 4), np.float32))
    with pytest.raises(CallError, match=r"dimension 's\d+' is 3 .*'past_k' but 2 .*'past_v'"):
        main(*bad)


def test_a_product_and_a_broadcast_named_apart_become_one_variable_each() -> None:
    module = from_onnx(PRODUCT)
    shapes = {p.name: [dim_text(d) for d in p.type.shape] for p in module["main"].params}
    assert shapes["a"][1] == shapes["b"][0] and shapes["a"][0] == shapes["c"][0]
    main = kiln.compile(module, "llvm")["main"]
    rng = np.random.default_rng(1)
    feeds = {"a": rng.standard_normal((3, 5), np.float32),
             "b": rng.standard_normal((5, 2), np.float32),
             "c": rng.standard_normal((3, 2), np.float32)}
    (want,) = onnxruntime_outputs(PRODUCT, feeds)
    np.testing.assert_allclose(np.asarray(main(*feeds.values())), want, rtol=1e-5)


def test_sizes_that_are_not_two_names_of_one_size_are_still_refused() -> None:
    # `2*s` against `t`: no renaming makes them one variable; the refusal names the node
    # and the pin
    model = _model([helper.make_node("Concat", ["a", "a"], ["aa"], axis=0),
                    helper.make_node("Add", ["aa", "b"], ["y"], name="the_add")],
                   {"a": ["s", 4], "b": ["t", 4]})
    with pytest.raises(FrontendError, match=r"the_add.*kiln cannot prove s\*2 == t.*shape_dict"):
        from_onnx(model)
