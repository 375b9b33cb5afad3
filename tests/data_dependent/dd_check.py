"""What the data-dependent tests share: small ONNX models, and one compile per backend
checked against onnxruntime (and kiln's reference interpreter) on several inputs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

import kiln


def model(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto],
          outputs: Sequence[tuple[str, int]], initializers: Sequence[onnx.TensorProto] = (),
          opset: int = 17) -> onnx.ModelProto:
    """An ONNX model with `outputs` as (name, element type) of unknown shape."""
    outs = [helper.make_tensor_value_info(n, ty, None) for n, ty in outputs]
    graph = helper.make_graph(nodes, "g", inputs, outs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def check(m: onnx.ModelProto, feeds: Sequence[Mapping[str, np.ndarray]], target: str) -> None:
    """Compile `m` once for `target`; each feed's results equal onnxruntime's and the
    reference interpreter's (shape and values, exactly)."""
    mod = kiln.frontend.from_onnx(m)
    exe = kiln.compile(mod, target)
    session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    for k, feed in enumerate(feeds):
        wants = session.run(None, dict(feed))
        gots = as_list(exe["main"](*feed.values()))
        refs = as_list(kiln.evaluate(mod, "main", *feed.values()))
        assert len(gots) == len(wants) == len(refs)
        for got, ref, want in zip(gots, refs, wants, strict=True):
            assert got.shape == want.shape, f"feed {k}: {got.shape} != {want.shape}"
            np.testing.assert_array_equal(got, want, err_msg=f"feed {k}")
            np.testing.assert_array_equal(ref, want, err_msg=f"feed {k} (interpreter)")


def as_list(value: object) -> list[np.ndarray]:
    items = value if isinstance(value, (tuple, list)) else [value]
    return [np.asarray(v) for v in items]
