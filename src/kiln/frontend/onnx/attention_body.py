"""onnxruntime's masking in ONNX Attention's function body (opsets 23 and 24).

kiln imports Attention as the function body onnx defines (functions.py). onnxruntime
runs those two versions with a kernel of its own, which composes the masks in a way
the body does not, and that differs where a masked position holds NaN or infinity
(docs/onnx.md, *Non-finite values*):

- the causal mask *replaces* the float `attn_mask` at the positions it masks, where the
  body adds its -inf to the mask (a NaN or +inf mask value there made the row NaN);
- `nonpad_kv_seqlen` replaces the *scores* past the valid length, and those after the
  causal frontier it offsets, by the type's lowest finite value, after the mask and the
  softcap, where the body adds -inf to them (a NaN key, or a score that overflows,
  there made the row NaN); without `nonpad_kv_seqlen` a score the causal mask excludes
  is added to -inf, as in the body;
- a row is fully masked (its probabilities are 0) when every position of its mask is at
  most the type's lowest value (-inf, or the float mask's lowest finite value), or is
  padding. The body takes the row's ReduceMax and compares it with -inf, so a float
  mask of the lowest finite value was not a masked position, and ReduceMax skipped a
  NaN after the first position;
- the scores are `alpha Q K^T + mask` in float32, rounded to the type once, where the
  body scales Q and K by sqrt(alpha) each and, for float16, rounds at every step.

`rewrite` edits the body's nodes, found by the value names onnx's function builder
gives them; a body without them (another version of onnx) is left as it is. From
opset 25 on onnxruntime runs the body itself, and so does kiln.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: The Attention versions onnxruntime computes with its own kernel.
REWRITTEN_VERSIONS = (23, 24)


def rewrite(schema: Any, nodes: list[Any]) -> list[Any]:
    """Attention's body `nodes` with onnxruntime's masking, or `nodes` unchanged for
    another operator or version."""
    if schema.name != "Attention" or schema.since_version not in REWRITTEN_VERSIONS:
        return nodes
    out = _scores_in_float(nodes)
    out = _causal_replaces(out)
    out = _padding_replaces(out)
    return _rows_fully_masked(out)


# ONNX element types: float32, float16, bfloat16
_FLOAT, _FLOAT16, _BFLOAT16 = 1, 10, 16


def _scores_in_float(nodes: list[Any]) -> list[Any]:
    """Q K^T in float32, times the scale, plus the mask, rounded to the type once: the
    body scales Q and K by sqrt(scale) each in their type (16-bit ones round there) and
    adds the mask in it; onnxruntime's product is float32 (alpha * Q K^T + mask)."""
    names = ("QScaled", "KScaled", "QKAttnWeight", "QKAttnCast", "ScaleFactor")
    found = {n: _producer(nodes, n) for n in names}
    at = {n: k for n, k in found.items() if k is not None}
    if len(at) != len(names):
        return nodes
    q, k, product, scores = (nodes[at[n]] for n in names[:4])
    to = next((a.i for a in scores.attribute if a.name == "to"), None)
    if q.op_type != "Mul" or k.op_type != "Mul" or product.op_type != "MatMul" or \
            scores.op_type != "Cast" or to not in (_FLOAT, _FLOAT16, _BFLOAT16) or \
            list(product.input) != ["QScaled", "KScaled"] or \
            q.input[1] != "ScaleFactorF" or k.input[1] != "ScaleFactorF":
        return nodes

    def convert(value: str, name: str, dtype: int) -> Any:  # float32 to float32: no kernel
        return _node("Identity", [value], name) if to == _FLOAT else \
            _node("Cast", [value], name, to=dtype)

    out = list(nodes)
    out[at["QScaled"]] = convert(q.input[0], "QScaled", _FLOAT)
    out[at["KScaled"]] = convert(k.input[0], "KScaled", _FLOAT)
    # QKAttnWeight stays the scaled product in the type (qk_matmul_output's mode 0)
    out[at["QKAttnWeight"]:at["QKAttnWeight"] + 1] = [
        _node("MatMul", ["QScaled", "KScaled"], "QKAttnProduct32"),
        _node("Cast", ["ScaleFactor"], "ScaleFactor32", to=_FLOAT),
        _node("Mul", ["QKAttnProduct32", "ScaleFactor32"], "QKAttnScaled32"),
        convert("QKAttnScaled32", "QKAttnWeight", int(to))]
    a = _producer(out, "QKAttnWeightSoftcap")
    if a is not None and out[a].op_type == "Add" and \
            list(out[a].input) == ["QKAttnCast", "AttnBiasT"]:
        out[a:a + 1] = [
            convert("AttnBiasT", "AttnBias32", _FLOAT),
            _node("Add", ["QKAttnScaled32", "AttnBias32"], "QKAttnWeight32"),
            convert("QKAttnWeight32", "QKAttnWeightSoftcap", int(to))]
    return out


def _producer(nodes: list[Any], name: str) -> int | None:
    return next((k for k, n in enumerate(nodes) if name in n.output), None)


def _node(op: str, inputs: list[str], output: str, **attrs: Any) -> Any:
    from onnx import helper  # optional: onnx (the compiler extra)

    return helper.make_node(op, inputs, [output], **attrs)


def _causal_replaces(nodes: list[Any]) -> list[Any]:
    """AttnBias + MaskTri -> Where(BoolMaskTri, MaskTri, AttnBias): the causal -inf
    replaces the mask value instead of being added to it."""
    k = _producer(nodes, "AttnBiasCausalOrNot")
    if k is None or nodes[k].op_type != "Add" or list(nodes[k].input) != ["AttnBias", "MaskTri"]:
        return nodes
    out = list(nodes)
    out[k] = _node("Where", ["BoolMaskTri", "MaskTri", "AttnBias"], "AttnBiasCausalOrNot")
    return out


def _padding_replaces(nodes: list[Any]) -> list[Any]:
    """The padding's -inf replaces the bias past nonpad_kv_seqlen, and the lowest finite
    value the scores there and after the causal frontier."""
    k = _producer(nodes, "AttnBiasCausalPad")
    s = _producer(nodes, "QKAttnWeightSoftcap")
    c = _producer(nodes, "QKAttnCast")
    if k is None or s is None or c is None or nodes[c].op_type != "Cast" or \
            nodes[k].op_type != "Add" or \
            list(nodes[k].input) != ["AttnBiasCausalOrNot", "PaddingMask4D"]:
        return nodes
    out = list(nodes)
    padded = [_node("IsInf", ["PaddingMask4D"], "PaddingMasked4D", detect_positive=0)]
    # with nonpad_kv_seqlen, the causal frontier (offset by it) replaces scores too
    closed = "PaddingMasked4D"
    if _producer(nodes, "BoolMaskTri") is not None:
        closed = "ScoresMasked4D"
        padded.append(_node("Or", ["PaddingMasked4D", "BoolMaskTri"], closed))
    out[k] = _node("Where", ["PaddingMasked4D", "PaddingMask4D", "AttnBiasCausalOrNot"],
                   "AttnBiasCausalPad")
    out[k:k] = padded
    s += len(padded)
    out[s] = _renamed_output(out[s], "QKAttnWeightPadded")
    # onnxruntime's fill is the lowest finite value: where every other score is -inf,
    # the padding takes the probabilities
    out[s + 1:s + 1] = [
        _constant("ScoresLowest", _lowest_of(nodes, "QKAttnCast")),
        _node("Where", [closed, "ScoresLowest", "QKAttnWeightPadded"], "QKAttnWeightSoftcap")]
    return out


def _lowest_of(nodes: list[Any], cast: str) -> np.ndarray:
    """The lowest finite value of the type the Cast node producing `cast` casts to."""
    from onnx import helper  # optional: onnx (the compiler extra)

    node = nodes[_producer(nodes, cast) or 0]
    to = next(a.i for a in node.attribute if a.name == "to")
    dtype = helper.tensor_dtype_to_np_dtype(to)
    return np.asarray(_lowest(dtype)).astype(dtype).reshape(())


def _constant(name: str, value: np.ndarray) -> Any:
    from onnx import numpy_helper  # optional: onnx (the compiler extra)

    return _node("Constant", [], name, value=numpy_helper.from_array(value))


def _renamed_output(node: Any, name: str) -> Any:
    from onnx import NodeProto  # optional: onnx (the compiler extra)

    copy = NodeProto()
    copy.CopyFrom(node)
    copy.output[0] = name
    return copy


def _rows_fully_masked(nodes: list[Any]) -> list[Any]:
    """RowAllMasked: no position of the bias row above the type's lowest value (NaN
    is above), in place of `ReduceMax(bias) == -inf`."""
    r = _producer(nodes, "BiasRowMax")
    e = _producer(nodes, "RowAllMasked")
    t = _producer(nodes, "AttnBiasT")
    if r is None or e is None or t is None or nodes[t].op_type != "Cast":
        return nodes
    from onnx import helper  # optional: onnx (the compiler extra)

    out = list(nodes)
    out[r:r + 1] = [
        _constant("BiasLowest", _lowest_of(nodes, "AttnBiasT")),
        _node("Greater", ["AttnBiasT", "BiasLowest"], "BiasAboveLowest"),
        _node("IsNaN", ["AttnBiasT"], "BiasNan"),
        _node("Or", ["BiasAboveLowest", "BiasNan"], "BiasOpen"),
        _node("Cast", ["BiasOpen"], "BiasOpenF", to=_FLOAT),
        _node("ReduceMax", ["BiasOpenF", *list(nodes[r].input[1:])], "BiasRowMax",
              **{a.name: helper.get_attribute_value(a) for a in nodes[r].attribute}),
    ]
    e = _producer(out, "RowAllMasked")
    assert e is not None
    out[e:e + 1] = [
        _constant("BiasRowClosed", np.zeros((), np.float32)),
        _node("Equal", ["BiasRowMax", "BiasRowClosed"], "RowAllMasked")]
    return out


def _lowest(dtype: Any) -> Any:
    """The lowest finite value of a float type (ml_dtypes' for bfloat16)."""
    if np.dtype(dtype).name == "bfloat16":
        import ml_dtypes  # optional: ml_dtypes (the ml-dtypes extra)

        return ml_dtypes.finfo(dtype).min
    return np.finfo(dtype).min
