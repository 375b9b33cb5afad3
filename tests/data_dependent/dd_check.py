"""What the data-dependent tests share: small ONNX models, and one compile per backend
checked against onnxruntime (and kiln's reference interpreter) on several inputs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx

import kiln
from kiln.ir.attrs import ATTR_NUM_OUTPUTS
from kiln.ir.evaluate import evaluate
from kiln.ir.tensor import Buffer
from kiln.runtime.abi import numpy_dtype
from kiln.runtime.function import trim_result
from support.graphs import GraphBuilder
from support.reference import ort_session


def model(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto],
          outputs: Sequence[tuple[str, int]], initializers: Sequence[onnx.TensorProto] = (),
          opset: int = 17) -> onnx.ModelProto:
    """An ONNX model with `outputs` as (name, element type) of unknown shape."""
    b = GraphBuilder()
    b.add(*nodes)
    b.consts(initializers)
    for name, elem in outputs:
        b.output(name, None, elem)
    return b.model(inputs, opset=opset, ir_version=None, check=False)


def check(m: onnx.ModelProto, feeds: Sequence[Mapping[str, np.ndarray]], target: str) -> None:
    """Compile `m` once for `target`; each feed's results equal onnxruntime's and the
    reference interpreter's (shape and values, exactly)."""
    mod = kiln.frontend.from_onnx(m)
    exe = kiln.compile(mod, target)
    session = ort_session(m)
    for k, feed in enumerate(feeds):
        wants = session.run(None, dict(feed))
        gots = as_list(exe["main"](*feed.values()))
        refs = as_list(kiln.evaluate(mod, "main", *feed.values()))
        assert len(gots) == len(wants) == len(refs)
        for got, ref, want in zip(gots, refs, wants, strict=True):
            assert got.shape == want.shape, f"feed {k}: {got.shape} != {want.shape}"
            np.testing.assert_array_equal(got, want, err_msg=f"feed {k}")
            np.testing.assert_array_equal(ref, want, err_msg=f"feed {k} (interpreter)")
        lowered = run_lowered(exe, list(feed.values()), [g.shape for g in gots])
        for got, low in zip(gots, lowered or gots, strict=True):
            np.testing.assert_array_equal(low, got, err_msg=f"feed {k} (lowered IR)")


def run_lowered(exe: kiln.Executable, inputs: list[np.ndarray],
                shapes: Sequence[tuple[int, ...]]) -> list[np.ndarray] | None:
    """Run the lowered `main` (static inputs only) in kiln's reference interpreter:
    results at their bounds, the run-time sizes' buffer after them, as the entry does."""
    main = exe.ir["main"]
    if not all(isinstance(p, Buffer) for p in main.params):
        return None
    n_out = int(main.attrs[ATTR_NUM_OUTPUTS])
    bufs = [p for p in main.params if isinstance(p, Buffer)]
    outs = [np.zeros(p.shape, numpy_dtype(p.dtype)) for p in bufs[len(inputs):][:n_out]]
    runtime = [np.zeros(p.shape, np.int64) for p in bufs[len(inputs) + n_out:]]
    evaluate(exe.ir, "main", *inputs, *outs, *runtime)
    return [trim_result(o, s) for o, s in zip(outs, shapes, strict=True)]


def as_list(value: object) -> list[np.ndarray]:
    items = value if isinstance(value, (tuple, list)) else [value]
    return [np.asarray(v) for v in items]
