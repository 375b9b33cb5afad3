"""Initializers read as views of the file's bytes equal onnx's own decoding."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from kiln.errors import FrontendError
from kiln.frontend import from_onnx
from kiln.frontend.onnx import raw_data
from kiln.frontend.onnx.raw_data import load_with_views
from support.graphs import GraphBuilder


def _model(inits: list[TensorProto]) -> onnx.ModelProto:
    b = GraphBuilder()
    b.node("Identity", ["x"], ["y"])
    b.input("x", [2])
    b.output("y", [2])
    b.consts(inits)
    # Unchecked: some initializers are malformed on purpose.
    return b.model(ir_version=None, check=False)


def _inits() -> list[TensorProto]:
    rng = np.random.default_rng(0)
    arrays = {
        "f32": rng.standard_normal((3, 5)).astype(np.float32),
        "f16": rng.standard_normal((7,)).astype(np.float16),
        "f64": rng.standard_normal((2, 2, 2)),
        "i64": rng.integers(-9, 9, (4,)),
        "i8": rng.integers(-9, 9, (5, 1)).astype(np.int8),
        "u8": rng.integers(0, 255, (3,)).astype(np.uint8),
        "b": rng.integers(0, 2, (6,)).astype(bool),
        "scalar": np.array(3.5, np.float32),
        "empty": np.zeros((0, 4), np.float32),
    }
    inits = [numpy_helper.from_array(a, name) for name, a in arrays.items()]
    # Data outside raw_data, and an element type the scan leaves to onnx.
    inits.append(helper.make_tensor("listed", TensorProto.FLOAT, [3], [1.0, 2.0, 3.0]))
    inits.append(helper.make_tensor("bf16", TensorProto.BFLOAT16, [2], [1.0, -2.0]))
    return inits


def test_views_equal_onnx_decoding(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(_model(_inits()), path)
    # Read as a large model is: in pieces (here of 16 bytes, so some split a tensor) on
    # two threads.
    monkeypatch.setattr(raw_data, "_READ_PIECE", 16)
    monkeypatch.setattr(raw_data, "_PARALLEL_READ_MIN", 0)
    proto, views = load_with_views(str(path))
    reference = onnx.load(path)
    assert [t.name for t in proto.graph.initializer] == \
        [t.name for t in reference.graph.initializer]
    for i, (ours, theirs) in enumerate(zip(proto.graph.initializer,
                                           reference.graph.initializer)):
        got = views[i] if i in views else numpy_helper.to_array(ours)
        want = numpy_helper.to_array(theirs)
        assert got.dtype == want.dtype and got.shape == want.shape, ours.name
        np.testing.assert_array_equal(got, want)
    # Plain raw_data became views (read-only, no copy); the rest was decoded by onnx.
    names = {proto.graph.initializer[i].name for i in views}
    assert names == {"f32", "f16", "f64", "i64", "i8", "u8", "b", "scalar", "empty"}
    assert all(not v.flags.writeable for v in views.values())
    # Everything but the weights survives the stripping unchanged.
    stripped = onnx.load(path)
    for t in stripped.graph.initializer:
        t.ClearField("raw_data")
    for t in proto.graph.initializer:
        t.ClearField("raw_data")
    assert proto.SerializeToString() == stripped.SerializeToString()


def test_imported_constants_match(tmp_path: Path) -> None:
    path = tmp_path / "m.onnx"
    model = _model(_inits())
    onnx.save(model, path)
    by_path = from_onnx(str(path))
    by_proto = from_onnx(model)
    assert by_path.script() == by_proto.script()


def test_damaged_files_still_raise(tmp_path: Path) -> None:
    good = _model(_inits()).SerializeToString()
    for cut in (len(good) // 3, len(good) - 5):
        path = tmp_path / f"cut{cut}.onnx"
        path.write_bytes(good[:cut])
        with pytest.raises(FrontendError):
            from_onnx(str(path))
    # A raw_data whose length disagrees with dims: onnx's decoder names the problem.
    t = numpy_helper.from_array(np.ones(4, np.float32), "w")
    t.dims[:] = [5]
    path = tmp_path / "bad.onnx"
    path.write_bytes(_model([t]).SerializeToString())
    with pytest.raises(FrontendError, match="'w'"):
        from_onnx(str(path), check=False)
    with pytest.raises(FrontendError, match="tensor name: w"):
        from_onnx(str(path))  # onnx's checker names it too


def test_external_data_still_loads(tmp_path: Path) -> None:
    model = _model([numpy_helper.from_array(np.arange(4096, dtype=np.float32), "big")])
    path = tmp_path / "ext.onnx"
    onnx.save(model, path, save_as_external_data=True, location="weights.bin",
              size_threshold=0)
    proto, views = load_with_views(str(path))
    # read straight into an aligned array (the protobuf message never holds it: it
    # cannot pass 2 GiB), the tensor marked loaded
    np.testing.assert_array_equal(views[0], np.arange(4096, dtype=np.float32))
    assert views[0].ctypes.data % 64 == 0 and not views[0].flags.writeable
    assert proto.graph.initializer[0].data_location == onnx.TensorProto.DEFAULT
    assert not proto.graph.initializer[0].external_data
