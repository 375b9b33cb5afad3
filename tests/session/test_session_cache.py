"""A session over an .onnx file and the compile cache: a hit found from the file's bytes
and the options loads the linked library without importing or compiling; a miss reports
its progress (kiln/session/start.py, kiln/session/progress.py)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pty
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from session_model import write_model

import kiln
import kiln.driver.compiler
import kiln.frontend.onnx.importer
from kiln.codegen import kernel_cache
from kiln.driver import cache
from kiln.driver.progress import ProgressEvent
from kiln.errors import ArgumentTypeError
from support.reference import onnxruntime_outputs

pytestmark = pytest.mark.usefixtures("own_cache")  # each test: an empty cache (conftest)
X = np.random.default_rng(3).standard_normal((3, 8)).astype(np.float32)


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return write_model(tmp_path / "tiny.onnx")


def _no_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make any import or compile fail the test."""
    def boom(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a cache hit imported or compiled the model")

    monkeypatch.setattr(kiln.driver.compiler, "compile", boom)
    monkeypatch.setattr(kiln.frontend.onnx.importer, "parse_onnx", boom)


def _library_files(folder: Path) -> dict[str, tuple[int, int]]:
    """(inode, mtime) of every stored object: a rewrite changes them."""
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns)
            for p in (folder / cache.LAYOUT / "objects").rglob("*") if p.is_file()}


def test_a_hit_loads_the_library_without_import_or_compile(
        model: Path, own_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missed = kiln.InferenceSession(model)
    assert not missed.cache_hit
    stored = _library_files(own_cache)
    assert len(stored) == 1  # the linked library only: the weights are inside it
    _no_compile(monkeypatch)
    hit = kiln.InferenceSession(str(model))
    assert hit.cache_hit
    assert _library_files(own_cache) == stored  # loaded where it lies, not rewritten
    assert hit.get_inputs() == missed.get_inputs()
    assert hit.get_outputs() == missed.get_outputs()
    assert hit.get_modelmeta() == missed.get_modelmeta()
    assert hit.get_modelmeta().producer_name == "kiln-tests"
    got, want = hit.run(None, {"x": X}), missed.run(None, {"x": X})
    for g, w in zip(got, want, strict=True):
        assert np.array_equal(g, w)
    for g, w in zip(got, onnxruntime_outputs(model, {"x": X}), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    _entry, obj = _entry_and_object(own_cache)
    obj.touch()  # not the very file stored any more: hashed whole, intact, still a hit
    assert kiln.InferenceSession(model).cache_hit


def test_runtime_options_hit_and_compile_options_or_bytes_miss(model: Path) -> None:
    kiln.InferenceSession(model)
    threads = kiln.SessionOptions()
    threads.intra_op_num_threads = 1  # how the library runs, not what it is: a hit
    assert kiln.InferenceSession(model, threads).cache_hit
    onnxruntime_fields = kiln.SessionOptions()  # accepted, change nothing compiled: a hit
    onnxruntime_fields.graph_optimization_level = kiln.GraphOptimizationLevel.ORT_DISABLE_ALL
    onnxruntime_fields.add_session_config_entry("session.intra_op.allow_spinning", "0")
    assert kiln.InferenceSession(model, onnxruntime_fields,
                                 providers=[("CPUExecutionProvider", {})]).cache_hit
    limited = kiln.SessionOptions()
    limited.max_loop_iterations = 7
    parts = dict(kernel_cache.STATS)
    assert not kiln.InferenceSession(model, limited).cache_hit
    # A miss finds the kernels the first session compiled (its compile keeps the kernel
    # cache on while the compile cache's entry stays out) and compiles none again.
    assert kernel_cache.STATS["hits"] > parts["hits"]
    assert kernel_cache.STATS["misses"] == parts["misses"]
    assert kiln.InferenceSession(model, limited).cache_hit
    proto = onnx.load(str(model))
    proto.doc_string = "other bytes, same graph"
    onnx.save(proto, str(model))
    changed = kiln.InferenceSession(model)
    assert not changed.cache_hit
    assert changed.get_modelmeta().description == "other bytes, same graph"


def _entry_and_object(folder: Path) -> tuple[Path, Path]:
    entry, = (folder / cache.LAYOUT / "entries").glob("*.json")
    obj = cache.object_path(json.loads(entry.read_text())["artifacts"][0]["object"])
    return entry, obj


def test_a_damaged_library_is_refused_and_compiled_again(model: Path, own_cache: Path) -> None:
    kiln.InferenceSession(model)
    _entry, obj = _entry_and_object(own_cache)
    data = bytearray(obj.read_bytes())
    data[len(data) // 2] ^= 0xFF
    # A new file renamed over it, as damage at rest looks to a later process: writing
    # into the file would change the library the first session has mapped.
    damaged = obj.with_name("damaged")
    damaged.write_bytes(bytes(data))
    damaged.replace(obj)
    with pytest.warns(cache.CacheWarning, match="do not match its SHA-256"):
        again = kiln.InferenceSession(model)
    assert not again.cache_hit
    np.testing.assert_allclose(again.run(None, {"x": X})[0],
                               onnxruntime_outputs(model, {"x": X})[0], rtol=1e-5, atol=1e-6)
    assert kiln.InferenceSession(model).cache_hit  # stored again, intact


def _rewrite(entry: Path, change: Any) -> None:
    """Change the entry's JSON with `change(entry dict)`, its checksum made right again:
    an intact entry, only not this key's library."""
    body = json.loads(entry.read_text())
    change(body)
    del body["checksum"]
    body["checksum"] = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
    entry.write_text(json.dumps(body))


def test_a_foreign_entry_is_refused_and_compiled_again(model: Path, own_cache: Path) -> None:
    kiln.InferenceSession(model)
    entry, _obj = _entry_and_object(own_cache)
    _rewrite(entry, lambda e: e["artifacts"][0].update(codegen_id="llvm"))  # a compile's
    with pytest.warns(cache.CacheWarning, match="holds llvm/lib.so, not a linked library"):
        assert not kiln.InferenceSession(model).cache_hit
    _rewrite(entry, lambda e: e.update(key="f" * 64))  # another model's, moved here
    with pytest.warns(cache.CacheWarning, match=f"is the entry of key {'f' * 64}"):
        assert not kiln.InferenceSession(model).cache_hit
    assert json.loads(entry.read_text())["key"] == entry.stem  # stored again under its key
    assert kiln.InferenceSession(model).cache_hit


def test_external_data_is_part_of_the_model(tmp_path: Path) -> None:
    proto = onnx.load(str(write_model(tmp_path / "inline.onnx")))
    model = tmp_path / "split.onnx"
    onnx.save(proto, str(model), save_as_external_data=True, location="weights.bin",
              size_threshold=0)
    assert kiln.InferenceSession(model).cache_hit is False
    assert kiln.InferenceSession(model).cache_hit
    weights = tmp_path / "weights.bin"
    data = np.frombuffer(weights.read_bytes(), np.float32) * 2  # same size, new bytes
    weights.write_bytes(data.tobytes())
    changed = kiln.InferenceSession(model)
    assert not changed.cache_hit
    np.testing.assert_allclose(changed.run(None, {"x": X})[0],
                               onnxruntime_outputs(model, {"x": X})[0], rtol=1e-5, atol=1e-6)


def test_a_miss_reports_its_progress(model: Path) -> None:
    events: list[ProgressEvent] = []
    options = kiln.SessionOptions()
    options.progress = events.append
    kiln.InferenceSession(model, options)
    stages = [e.stage for e in events]
    assert stages[0] == "importing the ONNX model" and stages[-1] == "done"
    assert any(s.startswith("pass ") for s in stages) and "codegen" in stages
    assert all(e.what == "tiny.onnx" for e in events) and events[-1].passes > 0
    events.clear()
    assert kiln.InferenceSession(model, options).cache_hit and events == []
    options.progress = "verbose"  # type: ignore[assignment]
    with pytest.raises(ArgumentTypeError, match=r"SessionOptions\.progress must be a callable"):
        kiln.InferenceSession(model, options)


def test_a_miss_logs_to_the_kiln_logger_off_a_terminal(
        model: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="kiln"):
        kiln.InferenceSession(model)
    lines = [r.getMessage() for r in caplog.records if r.name == "kiln"]
    assert lines[0].startswith("compiling tiny.onnx: importing the ONNX model")
    assert lines[-1].startswith("compiling tiny.onnx: done")


def test_a_compile_failed_in_its_import_does_not_hide_the_next_ones_first_line(
        model: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(model.read_bytes()[:40])  # cut short: the import fails
    with caplog.at_level(logging.INFO, logger="kiln"):
        with pytest.raises(kiln.KilnError):
            kiln.InferenceSession(broken)
        caplog.clear()
        kiln.InferenceSession(model)
    lines = [r.getMessage() for r in caplog.records if r.name == "kiln"]
    assert lines[0].startswith("compiling tiny.onnx: importing the ONNX model")


def test_without_the_cache_nothing_is_stored(model: Path, own_cache: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILN_CACHE", "0")
    first = kiln.InferenceSession(model)
    assert not first.cache_hit and not kiln.InferenceSession(model).cache_hit
    assert not (own_cache / cache.LAYOUT / "entries").exists()


def test_on_a_terminal_the_line_is_drawn_and_nothing_logged(
        monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("rich", reason="the terminal line needs rich (the compiler extra)")
    from kiln.session.progress import progress_for

    main, side = pty.openpty()
    with open(side, "w", closefd=True) as terminal:
        monkeypatch.setattr(sys, "stderr", terminal)
        shown = progress_for("m.onnx", kiln.SessionOptions())
        assert shown.enabled and shown.report is None
        options = kiln.SessionOptions()
        options.progress = print
        called = progress_for("m.onnx", options)
        assert not called.enabled and called.report is print
    os.close(main)
