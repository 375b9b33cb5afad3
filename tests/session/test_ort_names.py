"""Every public name of onnxruntime's Python API is kiln's or says what to use instead
(kiln.session.ort_names): `import kiln as rt` never meets an AttributeError for a
name an onnxruntime script can use."""

from __future__ import annotations

import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import onnxruntime
import pytest
from session_model import write_model

import kiln
from kiln.errors import ArgumentTypeError, UsageError
from kiln.session import ort_names, providers

PAIRS = {"InferenceSession": kiln.InferenceSession, "SessionOptions": kiln.SessionOptions,
         "RunOptions": kiln.RunOptions, "IOBinding": kiln.IOBinding, "OrtValue": kiln.OrtValue}


def _public(obj: Any) -> set[str]:
    """The public names of `obj`, without the standard modules a module imported."""
    return {n for n in dir(obj) if not n.startswith("_") and not (
        isinstance(getattr(obj, n), ModuleType)
        and not getattr(obj, n).__name__.startswith("onnxruntime"))}


def test_every_onnxruntime_module_name_is_kilns_or_refused_with_a_hint() -> None:
    for name in sorted(_public(onnxruntime)):
        try:
            getattr(kiln, name)
        except UsageError as exc:
            assert "kiln does not have it; " in str(exc), name
        # an AttributeError fails the test: the name is neither kiln's nor listed
    with pytest.raises(AttributeError):
        kiln.no_such_name  # noqa: B018 - a name onnxruntime does not have stays plain
    with pytest.raises(UsageError, match=r"onnxruntime\.capi: kiln does not have it; .*kiln\.h"):
        kiln.session.capi  # noqa: B018


def test_every_onnxruntime_method_is_kilns_or_refused_with_a_hint() -> None:
    for owner, cls in PAIRS.items():
        has = _public(cls() if owner in ("SessionOptions", "RunOptions") else cls)
        missing = _public(getattr(onnxruntime, owner)) - has
        unlisted = missing - set(ort_names.CLASSES[owner])
        assert not unlisted, f"{owner}: onnxruntime has {sorted(unlisted)}; kiln neither"


def test_instances_refuse_onnxruntime_methods_with_what_to_use(tmp_path: Path) -> None:
    sess = kiln.InferenceSession(write_model(tmp_path / "m.onnx"))
    with pytest.raises(UsageError, match=r"InferenceSession\.set_providers: kiln does not "):
        sess.set_providers(["CPUExecutionProvider"])
    with pytest.raises(UsageError, match=r"register_custom_ops_library.*docs/ops\.md"):
        kiln.SessionOptions().register_custom_ops_library("libcustom.so")
    with pytest.raises(AttributeError):
        sess.not_an_onnxruntime_method  # noqa: B018
    x = np.ones((2, 8), np.float32)
    with pytest.raises(UsageError, match="terminate"):
        kiln.SessionOptions().set_load_cancellation_flag(True)
    assert sess.run_with_ort_values(["y"], {"x": x})[0].data_type() == "tensor(float)"


def test_cuda_listed_when_kilns_cuda_target_runs(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(providers, "cuda_usable", lambda: True)
    assert kiln.get_available_providers() == ["CUDAExecutionProvider", "CPUExecutionProvider"]
    with pytest.warns(UserWarning, match="CUDAExecutionProvider is available, but kiln's "
                                         "InferenceSession compiles for the CPU"):
        sess = kiln.InferenceSession(write_model(tmp_path / "m.onnx"),
                                     providers=kiln.get_available_providers())
    assert sess.get_providers() == ["CPUExecutionProvider"]


def test_session_config_entries(tmp_path: Path) -> None:
    opts = kiln.SessionOptions()
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    with pytest.warns(UserWarning, match=r"'session\.future' is kept but kiln does not use it"):
        opts.add_session_config_entry("session.future", "x")
    assert opts.unused_session_config_entries() == ["session.future"]
    with pytest.raises(UsageError, match="'0' or '1'"):
        opts.add_session_config_entry("session.intra_op.allow_spinning", "yes")
    with pytest.raises(UsageError, match="ONNX models only"):
        opts.add_session_config_entry("session.load_model_format", "ORT")
    with pytest.raises(ArgumentTypeError, match="two strings"):
        opts.add_session_config_entry("session.intra_op.allow_spinning", 0)  # type: ignore[arg-type]
    opts.graph_optimization_level = 5  # type: ignore[assignment]
    with pytest.raises(UsageError, match=r"graph_optimization_level must be a "
                                         r"kiln\.GraphOptimizationLevel"):
        kiln.InferenceSession(write_model(tmp_path / "m.onnx"), opts)


def test_ortvalue_checks_what_it_is_given() -> None:
    with pytest.raises(ArgumentTypeError, match="takes a numpy array, got list"):
        kiln.OrtValue.ortvalue_from_numpy([1.0, 2.0])
    with pytest.raises(UsageError, match="CPU memory only, got device_type 'cuda'"):
        kiln.OrtValue.ortvalue_from_numpy(np.ones(2, np.float32), "cuda")
    with pytest.raises(ArgumentTypeError, match="shape must be a list of ints >= 0"):
        kiln.OrtValue.ortvalue_from_shape_and_type([2, -1], np.float32)
    with pytest.raises(ArgumentTypeError, match="no tensor type for numpy dtype <U1"):
        kiln.OrtValue(np.array(["a"]))
    with pytest.raises(ArgumentTypeError, match="no tensor type for numpy dtype complex64"):
        kiln.OrtValue.ortvalue_from_numpy(np.ones(2, np.complex64))
    value = kiln.OrtValue.ortvalue_from_numpy(np.arange(4, dtype=np.int32))
    back = np.from_dlpack(value)
    assert back.dtype == np.int32 and np.shares_memory(back, value.numpy())
    assert value.element_type() == 6 and value.data_ptr() == value.numpy().ctypes.data


def test_profiling_a_library_without_timers_keeps_the_session_events(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    library = tmp_path / "m.so"
    kiln.compile(str(write_model(tmp_path / "m.onnx")), "host").export_library(library)
    opts = kiln.SessionOptions()
    opts.enable_profiling = True
    sess = kiln.InferenceSession(library, opts)
    sess.run(None, {"x": np.ones((2, 8), np.float32)})
    path = Path(sess.end_profiling())
    assert path.parent == Path(".") and path.name.startswith("onnxruntime_profile__")
    import json

    names = [e["name"] for e in json.loads(path.read_text())]
    assert names == ["session_initialization", "model_run"]
    assert sess.end_profiling() == "" and sess.get_profiling_start_time_ns() == 0


def test_module_settings_are_accepted() -> None:
    kiln.set_default_logger_severity(3)
    with pytest.raises(UsageError, match="0 to 4"):
        kiln.set_default_logger_severity(7)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kiln.disable_telemetry_events()
    kiln.set_global_thread_pool_sizes(1, 1)
    kiln.set_global_thread_pool_sizes(0, 0)  # back to one thread per CPU


def test_feeds_convert_as_onnxruntime_and_refuse_what_would_change() -> None:
    from kiln.session.feeds import converted

    got = converted("ids", [[1, 2], [3, 4]], np.dtype(np.int64))
    assert got.dtype == np.int64 and got.tolist() == [[1, 2], [3, 4]]
    assert converted("x", 2, np.dtype(np.float32)).dtype == np.float32  # a scalar: rank 0
    assert converted("mask", [True, False], np.dtype(np.bool_)).tolist() == [True, False]
    with pytest.raises(ArgumentTypeError, match=r"input 'ids' expects tensor\(int64\): "
                                                r"\[1\.5\] has values that int64 cannot hold"):
        converted("ids", [1.5], np.dtype(np.int64))
    with pytest.raises(ArgumentTypeError, match=r"input 'x' expects tensor\(float\), got "
                                                r"str 'a' \(numpy reads it as <U1\)"):
        converted("x", "a", np.dtype(np.float32))
    array = np.ones(3, np.float64)
    assert converted("x", array, np.dtype(np.float32)) is array  # arrays: the call checks
