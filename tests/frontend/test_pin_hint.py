"""The hint that tells how to pin a symbolic dimension: one helper (kiln.ir.pin_hint), used
by every import error about a size kiln cannot keep symbolic, naming the ONNX node."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

from kiln.errors import FrontendError
from kiln.frontend.onnx import from_onnx
from kiln.ir.pin_hint import pin_hint
from kiln.ir.shape_expr import dim_product, dim_var
from support.graphs import GraphBuilder


def test_pin_hint_names_both_forms_for_each_variable() -> None:
    assert pin_hint(["seq", "batch", "seq"]) == (
        'pin batch, seq with shape_dict={"batch": 1, "seq": 128} '
        "(CLI: kiln compile ... --shape batch=1 --shape seq=128)")


def test_pin_hint_without_names_is_generic() -> None:
    assert "--shape NAME=N" in pin_hint([])


def test_pin_hint_for_walks_expressions() -> None:
    from kiln.ir.pin_hint import pin_hint_for

    shape = (dim_product((dim_var("batch"), dim_var("seq"))), 4)
    assert pin_hint_for([shape]) == pin_hint(["batch", "seq"])


def _model(node: onnx.NodeProto, inits: tuple = ()) -> onnx.ModelProto:
    b = GraphBuilder()
    b.add(node)
    b.consts(inits)
    b.input("x", ["seq"])
    for n in node.output:
        b.output(n)
    return b.model(opset=18, ir_version=None, check=False)


HINT = ('pin seq with shape_dict={"seq": 128} (CLI: kiln compile ... --shape seq=128)')


@pytest.mark.parametrize("model,where", [
    (_model(helper.make_node("Split", ["x"], ["y", "z"], name="split_it", axis=0,
                             num_outputs=2)), "node 'split_it' (Split)"),
    (_model(helper.make_node("Pad", ["x", "p"], ["y"], name="pad_it", mode="reflect"),
            (helper.make_tensor("p", TensorProto.INT64, [2], [1, 1]),)),
     "node 'pad_it' (Pad)"),
])
def test_import_errors_name_the_node_and_how_to_pin(model: onnx.ModelProto, where: str) -> None:
    with pytest.raises(FrontendError) as info:
        from_onnx(model)
    text = str(info.value)
    assert text.startswith(where), text
    assert text.endswith(HINT), text
    # and the hint works: pinned, the model imports
    from_onnx(model, shape_dict={"seq": 128})


def test_a_shape_kiln_cannot_follow_names_the_node_and_how_to_pin() -> None:
    # Shape -> Cast(float) -> Cast(int64) -> Reshape: kiln follows no float shape
    # arithmetic (a Resize size from an image's, as exporters write it), so the target is
    # unknown; the error says to pin the model's variables, and pinned, it imports.
    b = GraphBuilder()
    b.node("Shape", ["x"], ["s"])
    b.node("Cast", ["s"], ["f"], to=TensorProto.FLOAT)
    b.node("Cast", ["f"], ["i"], to=TensorProto.INT64)
    b.node("Reshape", ["x", "i"], ["y"], name="view_it")
    b.input("x", ["seq"])
    b.output("y")
    model = b.model(opset=18, ir_version=None, check=False)
    with pytest.raises(FrontendError) as info:
        from_onnx(model)
    assert str(info.value) == ("node 'view_it' (Reshape): Reshape shape must be a compile-time "
                               "constant (kiln needs static shapes); if it is computed from "
                               f"the input shapes, {HINT}")
    from_onnx(model, shape_dict={"seq": 128})
