"""Reshapes that introduce several new symbolic sizes (issue 23): `[batch*seq]` viewed
as `[batch, 1, 1, seq]`, as the TorchScript exporter reshapes BERT's attention mask.

The reshape's `shape` attribute spells such sizes as dimension texts over the input's
variables (kiln/ops/reshape_dims.py); the module prints, parses back and evaluates;
the compiled model matches onnxruntime at three sizes on llvm and c; a target whose
element count is not provably the input's is refused by name.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
import pytest
from onnx import helper
from symbolic_check import check_vs_onnxruntime, const, f32, onnx_model

import kiln
from kiln.errors import FrontendError, IRError
from kiln.ir import graph as g
from kiln.ir.shape_expr import dim_var, shape_text
from kiln.ir.structural import assert_structural_equal
from kiln.ir.types import TensorType
from kiln.ir.verify import verify
from kiln.ops import call
from kiln.script.source import from_source

node = helper.make_node


def _mask_reshape() -> onnx.ModelProto:
    # x [b, s] -> flat [b*s] -> [b, 1, 1, s], the target read from x's Shape.
    nodes = [node("Reshape", ["x", "minus1"], ["flat"]),
             node("Shape", ["x"], ["shape"]),
             node("Gather", ["shape", "i0"], ["b"]), node("Gather", ["shape", "i1"], ["s"]),
             node("Unsqueeze", ["b", "axis0"], ["b1"]), node("Unsqueeze", ["s", "axis0"], ["s1"]),
             node("Concat", ["b1", "ones", "s1"], ["target"], axis=0),
             node("Reshape", ["flat", "target"], ["o"])]
    inits = [const("minus1", np.array([-1], np.int64)), const("i0", np.int64(0)),
             const("i1", np.int64(1)), const("axis0", np.array([0], np.int64)),
             const("ones", np.array([1, 1], np.int64))]
    return onnx_model(nodes, [f32("x", ["b", "s"])], inits)


def _feeds(rng: np.random.Generator, b: int, s: int) -> Mapping[str, np.ndarray]:
    return {"x": rng.standard_normal((b, s)).astype(np.float32)}


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_reshape_to_several_new_symbolic_sizes_matches_onnxruntime(target: str) -> None:
    check_vs_onnxruntime(_mask_reshape(), _feeds, target)


def test_dimension_texts_print_parse_back_and_evaluate() -> None:
    mod = kiln.frontend.from_onnx(_mask_reshape())
    main = mod["main"]
    assert isinstance(main, g.Function)
    assert isinstance(main.ret_type, TensorType)
    assert shape_text(main.ret_type.shape) == "[b, 1, 1, s]"
    verify(mod)
    text = mod.script()
    assert 'shape=("b", 1, 1, "s")' in text
    assert_structural_equal(from_source(text), mod, map_free_vars=True)
    x = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    np.testing.assert_array_equal(kiln.evaluate(mod, "main", x), x.reshape(3, 1, 1, 5))


def _flat() -> g.Var:
    b, s = dim_var("b"), dim_var("s")
    return g.Var("flat", TensorType((b * s,), "float32"))


def test_a_text_whose_count_differs_is_refused() -> None:
    with pytest.raises(IRError, match=r"cannot view.*float32\[b\*s\] as shape \[b, 2, s\]"):
        call("reshape", _flat(), shape=("b", 2, "s"))


def test_a_text_naming_a_variable_the_input_lacks_is_refused() -> None:
    with pytest.raises(IRError, match=r"names seq, which the input's shape \[b\*s\]"):
        call("reshape", _flat(), shape=("b", "seq"))


def test_a_malformed_text_is_refused() -> None:
    with pytest.raises(IRError, match=r"reshape: shape \('b', 's\*'\)"):
        call("reshape", _flat(), shape=("b", "s*"))


def test_a_target_with_an_unprovable_count_names_the_node() -> None:
    # [b*s] -> [s, b, 2]: the sizes are inputs' but the count is b*s*2, not b*s.
    nodes = [node("Reshape", ["x", "minus1"], ["flat"]), node("Shape", ["x"], ["shape"]),
             node("Gather", ["shape", "i1"], ["s"]), node("Gather", ["shape", "i0"], ["b"]),
             node("Concat", ["s", "b", "two"], ["target"], axis=0),
             node("Reshape", ["flat", "target"], ["o"], name="mask_view")]
    inits = [const("minus1", np.array([-1], np.int64)), const("i0", np.array([0], np.int64)),
             const("i1", np.array([1], np.int64)), const("two", np.array([2], np.int64))]
    model = onnx_model(nodes, [f32("x", ["b", "s"])], inits)
    with pytest.raises(FrontendError) as info:
        kiln.frontend.from_onnx(model)
    assert str(info.value).startswith("node 'mask_view' (Reshape): reshape: cannot view [b*s] "
                                      "as [s, b, 2]: the element counts b*s and b*s*2 are not "
                                      "provably equal")
    assert str(info.value).endswith('pin b, s with shape_dict={"b": 1, "s": 128} '
                                    "(CLI: kiln compile ... --shape b=1 --shape s=128)")
