"""Unique (sorted or not, flat or along an axis, all four outputs) and NonMaxSuppression
(both box formats, optional inputs left out or given) against onnxruntime on llvm and c,
including empty results (no box kept)."""

from __future__ import annotations

import numpy as np
import pytest
from dd_check import check, model
from onnx import TensorProto, helper, numpy_helper

F, I64 = TensorProto.FLOAT, TensorProto.INT64
TARGETS = ["llvm", "c"]


def _vi(name: str, ty: int, shape: list[int | str]) -> object:
    return helper.make_tensor_value_info(name, ty, shape)


@pytest.mark.parametrize("target", TARGETS)
def test_unique(target: str) -> None:
    outs = ["y", "idx", "inv", "cnt"]
    nodes = [helper.make_node("Unique", ["x"], [f"{o}{k}" for o in outs], sorted=s, **axis)
             for k, (s, axis) in enumerate([(1, {}), (0, {}), (1, {"axis": 0}),
                                            (0, {"axis": 1})])]
    names = [(f"{o}{k}", F if o == "y" else I64) for k in range(4) for o in outs]
    m = model(nodes, [_vi("x", F, [4, 3])], names, opset=11)
    rng = np.random.default_rng(5)
    x = rng.integers(0, 3, (4, 3)).astype(np.float32)
    x[2] = x[0]  # a repeated row
    feeds = [{"x": x}, {"x": np.zeros((4, 3), np.float32)},
             {"x": np.arange(12, dtype=np.float32).reshape(4, 3)[::-1].copy()}]
    check(m, feeds, target)


def _nms_model(center: int, optional: int) -> object:
    inputs = ["boxes", "scores", "max_out", "iou", "score_thr"][:2 + optional]
    inits = [numpy_helper.from_array(np.array([4], np.int64), "max_out"),
             numpy_helper.from_array(np.array([0.4], np.float32), "iou"),
             numpy_helper.from_array(np.array([0.2], np.float32), "score_thr")][:optional]
    node = helper.make_node("NonMaxSuppression", inputs, ["sel"], center_point_box=center)
    return model([node], [_vi("boxes", F, [2, 6, 4]), _vi("scores", F, [2, 3, 6])],
                 [("sel", I64)], inits, opset=11)


def _boxes(rng: np.random.Generator, center: int) -> np.ndarray:
    if center:
        xy, wh = rng.random((2, 6, 2)) * 4, rng.random((2, 6, 2)) * 3 + 0.5
        return np.concatenate([xy, wh], axis=-1).astype(np.float32)
    a, b = rng.random((2, 6, 2)) * 4, rng.random((2, 6, 2)) * 4
    return np.concatenate([a, b], axis=-1).astype(np.float32)  # corners in any order


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(("center", "optional"), [(0, 3), (1, 3), (0, 2), (1, 1), (0, 0)])
def test_non_max_suppression(target: str, center: int, optional: int) -> None:
    rng = np.random.default_rng(6 + center + optional)
    feeds = []
    for _ in range(3):
        scores = rng.permutation(36).reshape(2, 3, 6).astype(np.float32) / 36  # distinct
        feeds.append({"boxes": _boxes(rng, center), "scores": scores})
    feeds.append({"boxes": _boxes(rng, center), "scores": np.zeros((2, 3, 6), np.float32)})
    check(_nms_model(center, optional), feeds, target)


@pytest.mark.parametrize("target", TARGETS)
def test_non_max_suppression_with_run_time_limit_and_thresholds(target: str) -> None:
    node = helper.make_node("NonMaxSuppression", ["boxes", "scores", "max_out", "iou", "thr"],
                            ["sel"])
    inputs = [_vi("boxes", F, [1, 6, 4]), _vi("scores", F, [1, 2, 6]), _vi("max_out", I64, [1]),
              _vi("iou", F, [1]), _vi("thr", F, [1])]
    m = model([node], inputs, [("sel", I64)], opset=11)
    rng = np.random.default_rng(9)
    feeds = []
    for limit, iou, thr in ((-1, 0.5, 0.0), (0, 0.5, 0.0), (1, 0.5, 0.0), (6, 0.1, 0.3),
                            (6, 0.9, 0.0), (3, 0.5, 2.0)):
        scores = (rng.permutation(12).reshape(1, 2, 6) / 12).astype(np.float32)
        feeds.append({"boxes": _boxes(rng, 0)[:1], "scores": scores,
                      "max_out": np.array([limit], np.int64),
                      "iou": np.array([iou], np.float32), "thr": np.array([thr], np.float32)})
    check(m, feeds, target)
