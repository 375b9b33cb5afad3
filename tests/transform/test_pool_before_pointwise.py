"""PoolBeforePointwise (kiln.transform.pool_before_pointwise): an average pool of a 1x1
convolution's output pools the convolution's input instead; the rewritten graph's results
(the reference interpreter with the ops' numpy references, kiln.evaluate) against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx

from kiln.frontend import from_onnx
from kiln.ir import graph as g
from kiln.ops import evaluate
from kiln.transform.pool_before_pointwise import PoolBeforePointwise
from support.graphs import GraphBuilder
from support.reference import onnxruntime_outputs


def _transitions() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Three 1x1 convolutions + 2x2/2 average pools over one ReLU: a DenseNet transition
    (taken), one whose output is also a result, one whose pool pads (both left)."""
    b = GraphBuilder(seed=3)
    x = b.op("Relu", b.input("x", [1, 16, 8, 8]))
    taken = b.op("AveragePool", b.conv(x, 16, 8, 1), kernel_shape=[2, 2], strides=[2, 2])
    read = b.conv(x, 16, 8, 1)
    twice = b.op("AveragePool", read, kernel_shape=[2, 2], strides=[2, 2])
    padded = b.op("AveragePool", b.conv(x, 16, 8, 1), kernel_shape=[2, 2], strides=[2, 2],
                  pads=[1, 1, 1, 1], count_include_pad=1)
    for out, size in ((taken, 4), (read, 8), (twice, 4), (padded, 5)):
        b.output(out, [1, 8, size, size])
    feeds = {"x": np.random.default_rng(4).standard_normal((1, 16, 8, 8)).astype(np.float32)}
    return b.model(), feeds


def test_only_the_sole_unpadded_pool_moves_and_results_match_onnxruntime() -> None:
    model, feeds = _transitions()
    mod = PoolBeforePointwise()(from_onnx(model))
    main = mod["main"]
    assert isinstance(main, g.Function)
    ops = [b.value.op for b in main.bindings if isinstance(b.value, g.Call)]
    # the first pool now reads the ReLU and its convolution the pool; the others stay
    assert ops[:3] == ["relu", "avg_pool2d", "conv2d"]
    assert ops[3:] == ["conv2d", "avg_pool2d", "conv2d", "avg_pool2d"]
    pooled = main.bindings[1]
    assert pooled.value.type.shape == (1, 16, 4, 4)  # type: ignore[attr-defined]
    got = evaluate(mod, "main", *feeds.values())
    for k, want in zip(got, onnxruntime_outputs(model, feeds), strict=True):
        np.testing.assert_allclose(k, want, rtol=1e-5, atol=1e-5)
