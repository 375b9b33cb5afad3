"""What the symbolic-op tests of this directory share: building a small ONNX model and
checking one symbolic compile against onnxruntime at three sizes."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import kiln
from support.graphs import GraphBuilder
from support.reference import ort_session

Feeds = Callable[[np.random.Generator, int, int], Mapping[str, np.ndarray]]


def f32(name: str, shape: list[str | int]) -> onnx.ValueInfoProto:
    """A float32 graph input (strings in `shape` are `dim_param`s)."""
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def const(name: str, value: object) -> onnx.TensorProto:
    """An initializer holding `value`."""
    return numpy_helper.from_array(np.asarray(value), name)


def onnx_model(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto],
               initializers: Iterable[onnx.TensorProto] = (), n_outputs: int = 1,
               out_type: int = TensorProto.FLOAT) -> onnx.ModelProto:
    """An opset-17 model whose outputs are `o` (or `o0`, `o1`, ... for several), any shape."""
    b = GraphBuilder()
    b.add(*nodes)
    b.consts(initializers)
    for name in ["o"] if n_outputs == 1 else [f"o{k}" for k in range(n_outputs)]:
        b.output(name, None, out_type)
    return b.model(inputs, ir_version=None, check=False)


def check_vs_onnxruntime(model: onnx.ModelProto, feeds: Feeds, target: str) -> None:
    """Compile `model` once, with its dims symbolic, and run it at three (b, s) sizes
    against onnxruntime: exact for integer results, rel. L2 < 1e-6 for floats."""
    ex = kiln.compile(kiln.frontend.from_onnx(model), target)
    session = ort_session(model)
    rng = np.random.default_rng(23)
    for b, s in ((1, 1), (2, 3), (3, 6)):
        inputs = feeds(rng, b, s)
        wants = session.run(None, dict(inputs))
        gots = ex["main"](*inputs.values())
        gots = gots if isinstance(gots, (tuple, list)) else [gots]
        assert len(gots) == len(wants)
        for got, want in zip(gots, wants, strict=True):
            got = np.asarray(got)
            assert got.shape == want.shape, f"b={b}, s={s}: {got.shape} != {want.shape}"
            if np.issubdtype(want.dtype, np.floating) and want.size:
                err = np.linalg.norm(got - want) / max(float(np.linalg.norm(want)), 1e-30)
                assert err < 1e-6, f"b={b}, s={s}: rel. L2 {err}"
            else:
                np.testing.assert_array_equal(got, want)
