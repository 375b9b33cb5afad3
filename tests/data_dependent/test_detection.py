"""A detection post-processing graph (boxes + scores -> NonMaxSuppression -> Gather of
the kept boxes and scores) against onnxruntime, exported with export_library and
loaded in a fresh process, on llvm and c; the box count is symbolic."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from dd_check import model
from onnx import TensorProto, helper, numpy_helper

import kiln
from support.reference import ort_session

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def _detection_model() -> object:
    inits = [numpy_helper.from_array(np.array([3], np.int64), "max_out"),
             numpy_helper.from_array(np.array([0.3], np.float32), "iou"),
             numpy_helper.from_array(np.array([0.25], np.float32), "score_thr"),
             numpy_helper.from_array(np.array(2, np.int64), "two"),
             numpy_helper.from_array(np.array([0], np.int64), "zero")]
    nodes = [helper.make_node("NonMaxSuppression", ["boxes", "scores", "max_out", "iou",
                                                    "score_thr"], ["sel"]),
             helper.make_node("Gather", ["sel", "two"], ["box_idx"], axis=1),
             helper.make_node("Squeeze", ["boxes", "zero"], ["all_boxes"]),
             helper.make_node("Gather", ["all_boxes", "box_idx"], ["kept"], axis=0),
             helper.make_node("GatherND", ["scores", "sel"], ["kept_scores"])]
    inputs = [helper.make_tensor_value_info("boxes", F, [1, "n", 4]),
              helper.make_tensor_value_info("scores", F, [1, 2, "n"])]
    return model(nodes, inputs, [("sel", I64), ("kept", F), ("kept_scores", F)], inits)


def _feeds() -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(7)
    feeds = []
    for n in (1, 5, 12):
        corner = rng.random((1, n, 2)).astype(np.float32) * 4
        size = rng.random((1, n, 2)).astype(np.float32) * 2 + 0.5
        scores = (rng.permutation(2 * n).reshape(1, 2, n) / (2 * n)).astype(np.float32)
        feeds.append({"boxes": np.concatenate([corner, corner + size], -1), "scores": scores})
    feeds.append({"boxes": feeds[1]["boxes"], "scores": np.zeros((1, 2, 5), np.float32)})
    return feeds


RUN = """
import sys
import numpy as np
from kiln.runtime import load_module
feeds = np.load(sys.argv[2])
with load_module(sys.argv[1]) as lib:
    out = {}
    for k in range(int(sys.argv[3])):
        for j, r in enumerate(lib["main"](feeds[f"boxes{k}"], feeds[f"scores{k}"])):
            out[f"r{k}_{j}"] = r
np.savez(sys.argv[4], **out)
"""


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_detection_post_processing_exported_and_loaded(tmp_path: Path, target: str) -> None:
    m = _detection_model()
    feeds = _feeds()
    session = ort_session(m)
    lib = kiln.compile(kiln.frontend.from_onnx(m), target).export_library(tmp_path / "det.so")
    np.savez(tmp_path / "in.npz", **{f"{name}{k}": v for k, f in enumerate(feeds)
                                     for name, v in f.items()})
    proc = subprocess.run([sys.executable, "-c", RUN, str(lib), str(tmp_path / "in.npz"),
                           str(len(feeds)), str(tmp_path / "out.npz")],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    got = np.load(tmp_path / "out.npz")
    kept_any = False
    for k, feed in enumerate(feeds):
        for j, want in enumerate(session.run(None, feed)):
            np.testing.assert_array_equal(got[f"r{k}_{j}"], want, err_msg=f"feed {k}, result {j}")
        kept_any |= got[f"r{k}_0"].shape[0] > 0
    assert kept_any and got[f"r{len(feeds) - 1}_0"].shape == (0, 3)
