"""How a session starts (kiln/session/start.py): serialized ONNX bytes and an
onnx.ModelProto are cached by the bytes' digest as a file is, an IRModule by its
structural fingerprint; a miss on a file reads it once; a kernel a symbolic size leaves
generic is reported by the ONNX node the user knows (its name and op type), not by
kiln's value name."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from session_model import write_model

import kiln
import kiln.driver.compiler
import kiln.frontend.onnx.importer
from kiln.errors import GenericKernelWarning
from support.graphs import GraphBuilder
from support.reference import onnxruntime_outputs

pytestmark = pytest.mark.usefixtures("own_cache")  # each test: an empty cache (conftest)
X = np.random.default_rng(5).standard_normal((2, 8)).astype(np.float32)
# onnx's entry points that parse a model's bytes (load_with_views and parse_onnx use them)
_PARSERS = ("load", "load_model", "load_from_string", "load_model_from_string")


def _count_parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of onnx's parsers called from now on, in order."""
    calls: list[str] = []

    def counting(name: str) -> Any:
        parse = getattr(onnx, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            calls.append(name)
            return parse(*args, **kwargs)

        return counted

    for name in _PARSERS:
        monkeypatch.setattr(onnx, name, counting(name))
    return calls


def _no_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a cache hit imported or compiled the model")

    for module, name in ((kiln.driver.compiler, "compile"),
                         (kiln.frontend.onnx.importer, "parse_onnx"),
                         (kiln.frontend.onnx.importer, "from_onnx")):
        monkeypatch.setattr(module, name, boom)


def test_bytes_and_a_model_proto_hit_the_cache(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_model(tmp_path / "tiny.onnx")
    data = path.read_bytes()
    parses = _count_parses(monkeypatch)
    missed = kiln.InferenceSession(data)
    assert not missed.cache_hit and parses == ["load_from_string"]  # parsed once
    proto = onnx.load_model_from_string(data)
    _no_compile(monkeypatch)
    parses.clear()
    from_bytes = kiln.InferenceSession(bytearray(data))
    from_proto = kiln.InferenceSession(proto)  # its serialized bytes: the same key
    assert from_bytes.cache_hit and from_proto.cache_hit and parses == []
    assert from_proto.get_modelmeta() == missed.get_modelmeta()
    assert from_proto.get_inputs() == missed.get_inputs()
    for session in (from_bytes, from_proto):
        for got, want in zip(session.run(None, {"x": X}), onnxruntime_outputs(path, {"x": X}),
                             strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    limited = kiln.SessionOptions()
    limited.max_loop_iterations = 3  # an option that changes the library: another key
    with pytest.raises(AssertionError, match="a cache hit imported or compiled"):
        kiln.InferenceSession(proto, limited)


def test_an_irmodule_is_keyed_by_its_fingerprint(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_model(tmp_path / "tiny.onnx")
    assert not kiln.InferenceSession(kiln.frontend.from_onnx(path)).cache_hit
    again = kiln.frontend.from_onnx(path)  # another object of the same structure
    _no_compile(monkeypatch)
    hit = kiln.InferenceSession(again)
    assert hit.cache_hit
    for got, want in zip(hit.run(None, {"x": X}), onnxruntime_outputs(path, {"x": X}),
                         strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _features() -> onnx.ModelProto:
    """The LRN block of an AlexNet-style network (its convolution left out to keep the
    test fast), its nodes named as torch's exporter names them, over a dynamic image
    height: kiln's LRN kernel takes a symbolic batch only, so both LRNs run their generic
    loops.
    The second LRN has no name (some exporters and hand-edited graphs leave it out):
    it is named by its output."""
    gb = GraphBuilder(seed=7)
    x = gb.input("images", (1, 4, "height", 8))
    gb.node("Relu", [x], ["r0"], name="/features/features.1/Relu")
    gb.node("LRN", ["r0"], ["n0"], size=5, alpha=1e-4, beta=0.75, bias=2.0,
            name="/features/features.2/LocalResponseNorm")
    gb.node("LRN", ["n0"], ["features"], size=3)
    gb.output("features", (1, 4, "height", 8))
    return gb.model()


def _generic_warning(path: Path) -> tuple[kiln.InferenceSession, str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        session = kiln.InferenceSession(path)
    [warned] = [w for w in caught if issubclass(w.category, GenericKernelWarning)]
    return session, str(warned.message)


def test_a_miss_reads_the_file_once_and_names_generic_kernels_by_onnx_node(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _features()
    path = tmp_path / "features.onnx"
    onnx.save(model, str(path))
    parses = _count_parses(monkeypatch)
    session, text = _generic_warning(path)
    assert not session.cache_hit
    assert parses == ["load_from_string"], parses  # the import's read, nothing before it
    assert "2 kernel(s) run their generic loops" in text
    assert ("node '/features/features.2/LocalResponseNorm' (LRN), kiln's lrn of "
            "[1, 4, height, 8]: lrn when pinned: shape_dict={\"height\": HEIGHT}") in text
    assert "node with output 'features' (LRN), kiln's lrn of [1, 4, height, 8]" in text
    entries = {e["onnx_node"] or e["onnx_output"]: e for e in session.generic_kernels}
    assert set(entries) == {"/features/features.2/LocalResponseNorm", "features"}
    assert {e["onnx_op"] for e in entries.values()} == {"LRN"}
    assert all("--shape height=HEIGHT" in e["hint"] for e in entries.values())
    images = np.random.default_rng(1).standard_normal((1, 4, 6, 8)).astype(np.float32)
    [expected] = onnxruntime_outputs(model, {"images": images})
    np.testing.assert_allclose(session.run(None, {"images": images})[0], expected,
                               rtol=1e-4, atol=1e-5)
    parses.clear()
    hit, again = _generic_warning(path)  # from the library's metadata: the same report
    assert hit.cache_hit and parses == [] and again == text
