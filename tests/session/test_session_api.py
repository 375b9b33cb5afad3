"""kiln.InferenceSession over each kind of source, its errors and its options."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from session_model import write_model

import kiln
from kiln.errors import ArgumentTypeError, CallError, UsageError
from support.reference import onnxruntime_outputs


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model(tmp_path_factory.mktemp("session") / "tiny.onnx")


@pytest.fixture(scope="module")
def session(model: Path) -> kiln.InferenceSession:
    return kiln.InferenceSession(str(model))


def _reference(model: Path, x: np.ndarray) -> list[np.ndarray]:

    return onnxruntime_outputs(model, {"x": x})


def test_every_source_gives_the_same_session(model: Path, session: kiln.InferenceSession,
                                             tmp_path: Path) -> None:
    x = np.random.default_rng(1).standard_normal((5, 8)).astype(np.float32)
    want = _reference(model, x)
    ex = kiln.compile(str(model))
    ex.export_library(tmp_path / "tiny.so")
    sources = [model, model.read_bytes(), ex, tmp_path / "tiny.so",
               kiln.runtime.load_module(tmp_path / "tiny.so")]
    for source in sources:
        sess = session if source is model else kiln.InferenceSession(source)
        assert [i.name for i in sess.get_inputs()] == ["x"], type(source)
        got = sess.run(None, {"x": x})
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_model_metadata(model: Path, session: kiln.InferenceSession, tmp_path: Path) -> None:
    assert session.get_modelmeta().producer_name == "kiln-tests"
    assert session.get_modelmeta().graph_name == "tiny"
    assert session.get_providers() == ["CPUExecutionProvider"]
    kiln.compile(str(model)).export_library(tmp_path / "m.so")
    assert kiln.InferenceSession(tmp_path / "m.so").get_modelmeta().producer_name == ""


def test_feed_errors_name_the_input(session: kiln.InferenceSession) -> None:
    x = np.ones((2, 8), np.float32)
    with pytest.raises(CallError, match="'z' is not an input of this model; its inputs: x"):
        session.run(None, {"x": x, "z": x})
    with pytest.raises(CallError, match="missing input"):
        session.run(None, {})
    # a list is converted to the input's dtype, as onnxruntime converts it; text is not
    np.testing.assert_array_equal(session.run(None, {"x": x.tolist()})[0],
                                  session.run(None, {"x": x})[0])
    with pytest.raises(ArgumentTypeError, match=r"input 'x' expects tensor\(float\)"):
        session.run(None, {"x": [["a"] * 8]})
    with pytest.raises(ArgumentTypeError, match=r"input 'x' expects tensor\(float\)"):
        session.run(None, {"x": [[1.0] * 8, [2.0]]})
    with pytest.raises(CallError, match=r"'x'.*dtype float32, got float64"):
        session.run(None, {"x": x.astype(np.float64)})
    with pytest.raises(CallError, match=r"'x'.*2 dimensions, got 3"):
        session.run(None, {"x": x[None]})
    with pytest.raises(CallError, match="'nope' is not an output of this model; its outputs: y, s"):
        session.run(["nope"], {"x": x})
    with pytest.raises(ArgumentTypeError, match="output_names"):
        session.run("y", {"x": x})  # type: ignore[arg-type]
    with pytest.raises(ArgumentTypeError, match="input_feed"):
        session.run(None, [x])  # type: ignore[arg-type]


def test_bindings_check_what_they_bind(session: kiln.InferenceSession) -> None:
    io = session.io_binding()
    with pytest.raises(CallError, match="its outputs: y, s"):
        io.bind_output("nope")
    with pytest.raises(UsageError, match="CPU memory only"):
        io.bind_output("y", "cuda", 0, np.float32, [2, 4], 1234)
    with pytest.raises(UsageError, match="element_type and shape"):
        io.bind_output("y", "cpu", 0, None, None, 1234)
    # a buffer of the wrong shape is refused by the call, naming the output
    x = np.ones((2, 8), np.float32)
    wrong = np.zeros((3, 4), np.float32)
    io.bind_cpu_input("x", x)
    io.bind_output("y", "cpu", 0, np.float32, wrong.shape, wrong.ctypes.data)
    with pytest.raises(CallError, match="'y'"):
        session.run_with_iobinding(io)


def test_providers_and_options(model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.warns(UserWarning, match=r"Specified provider 'FooExecutionProvider' is not "
                                         r"in available provider names\.Available providers: "
                                         r"'.*CPUExecutionProvider'"):
        fell_back = kiln.InferenceSession(model, providers=["FooExecutionProvider",
                                                            "CPUExecutionProvider"])
    assert fell_back.get_providers() == ["CPUExecutionProvider"]
    with_options = kiln.InferenceSession(model, providers=[("CPUExecutionProvider",
                                                            {"arena_extend_strategy": 1})])
    assert with_options.get_provider_options() == {"CPUExecutionProvider": {}}
    opts = kiln.SessionOptions()
    opts.intra_op_num_threads = -1
    with pytest.raises(UsageError, match="intra_op_num_threads"):
        kiln.InferenceSession(model, opts)
    monkeypatch.delenv("KILN_NUM_THREADS", raising=False)
    opts.intra_op_num_threads = 2
    kiln.InferenceSession(model, opts)
    assert "KILN_NUM_THREADS" not in os.environ  # the session's library only, not the process
    with pytest.raises(ArgumentTypeError, match="path_or_library"):
        kiln.InferenceSession(3.5)


def test_sources_that_are_not_models(tmp_path: Path) -> None:
    from kiln.script import T, ir_module

    @ir_module
    class Scale:
        @T.prim_func
        def scale(X: T.Buffer((8,), "float32"), Y: T.Buffer((8,), "float32")):  # type: ignore[no-untyped-def]
            for i in T.serial(8):
                Y[i] = X[i] * T.float32(2)

    with pytest.raises(CallError, match=r"no 'main' function \(it has scale\)"):
        kiln.InferenceSession(kiln.compile(Scale))
    with pytest.raises(kiln.MissingFileError, match="no ONNX model"):
        kiln.InferenceSession(tmp_path / "absent.onnx")
    with pytest.raises(kiln.FormatError, match=r"cannot load a \.txt file"):
        kiln.InferenceSession((tmp_path / "notes.txt").resolve())
