"""Scripts written for onnxruntime's Python API, each a function of the module `rt`
(`onnxruntime` or `kiln`), the model's path and a scratch folder, returning what the
script computes (arrays, names, types) or raising.

tests/session/compat/test_ort_compat.py runs each with both modules and compares;
make_table.py writes the differences, with REASONS, into docs/session.md. These are
the only test functions that create onnxruntime sessions themselves: they are
onnxruntime scripts on purpose (tests/test_test_support.py lists this file).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

Script = Callable[[Any, str, Path], Any]
SCRIPTS: dict[str, Script] = {}
X = np.linspace(-1, 1, 24, dtype=np.float32).reshape(3, 8)

# variant -> why kiln differs from onnxruntime there (docs/session.md's table).
REASONS = {
    "optimized_model_filepath": "kiln writes no optimized ONNX model: its compiled library "
                                "is the optimized form (`kiln compile model.onnx -o m.so`)",
    "providers_unavailable_first": "the warning names each one's available providers",
    "session_config_unknown_key": "onnxruntime keeps an unknown key silently; kiln keeps it "
                                  "and warns that it does not use it",
    "sparse_tensor": "kiln has dense tensors only: rt.SparseTensor raises a KilnError "
                     "saying to pass a numpy array",
    "run_async": "kiln has no run_async: call run() on a thread (it releases the GIL)",
    "profile_events": "kiln's Node events are its fused kernels "
                      "(op_name 'fused_matmul_packed_relu'), onnxruntime's its nodes",
}


def script(fn: Script) -> Script:
    SCRIPTS[fn.__name__] = fn
    return fn


def _session(rt: Any, model: Any, options: Any = None, **kwargs: Any) -> Any:
    return rt.InferenceSession(model, options, providers=["CPUExecutionProvider"], **kwargs)


# ------------------------------------------------------------------ sessions
@script
def session_from_path(rt: Any, model: str, tmp: Path) -> Any:
    sess = rt.InferenceSession(model)
    return ([[i.name, i.shape, i.type] for i in sess.get_inputs()],
            [[o.name, o.shape, o.type] for o in sess.get_outputs()], sess.run(None, {"x": X}))


@script
def session_from_bytes(rt: Any, model: str, tmp: Path) -> Any:
    return _session(rt, Path(model).read_bytes()).run(None, {"x": X})


@script
def session_metadata(rt: Any, model: str, tmp: Path) -> Any:
    sess = _session(rt, model)
    meta = sess.get_modelmeta()
    return (meta.producer_name, meta.graph_name, meta.version, sess.get_providers(),
            sess.get_overridable_initializers())


@script
def disabled_optimizers_keyword(rt: Any, model: str, tmp: Path) -> Any:
    sess = rt.InferenceSession(model, providers=["CPUExecutionProvider"],
                               disabled_optimizers=["NchwcTransformer", "GemmActivationFusion"])
    return sess.run(None, {"x": X})


@script
def output_names_subset(rt: Any, model: str, tmp: Path) -> Any:
    sess = _session(rt, model)
    return sess.run(["y"], {"x": X}), sess.run([sess.get_outputs()[1].name], {"x": X[:1]})


# ------------------------------------------------------------------ options
@script
def options_threads(rt: Any, model: str, tmp: Path) -> Any:
    opts = rt.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    sess = _session(rt, model, opts)
    return sess.get_session_options().intra_op_num_threads, sess.run(None, {"x": X})


@script
def options_defaults(rt: Any, model: str, tmp: Path) -> Any:
    opts = rt.SessionOptions()
    return (str(opts.graph_optimization_level), str(opts.execution_mode),
            opts.graph_optimization_level == rt.GraphOptimizationLevel.ORT_ENABLE_ALL,
            opts.optimized_model_filepath, opts.enable_profiling, opts.profile_file_prefix,
            opts.log_severity_level, opts.logid, opts.enable_cpu_mem_arena)


@script
def graph_optimization_levels(rt: Any, model: str, tmp: Path) -> Any:
    out = []
    for level in (rt.GraphOptimizationLevel.ORT_DISABLE_ALL,
                  rt.GraphOptimizationLevel.ORT_ENABLE_BASIC,
                  rt.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
                  rt.GraphOptimizationLevel.ORT_ENABLE_ALL):
        opts = rt.SessionOptions()
        opts.graph_optimization_level = level
        out.append(_session(rt, model, opts).run(None, {"x": X}))
    return out


@script
def execution_mode_parallel(rt: Any, model: str, tmp: Path) -> Any:
    opts = rt.SessionOptions()
    opts.execution_mode = rt.ExecutionMode.ORT_PARALLEL
    opts.execution_order = rt.ExecutionOrder.PRIORITY_BASED
    return int(opts.execution_mode), _session(rt, model, opts).run(None, {"x": X})


@script
def options_accepted_fields(rt: Any, model: str, tmp: Path) -> Any:
    opts = rt.SessionOptions()
    opts.enable_cpu_mem_arena = False
    opts.enable_mem_pattern = False
    opts.enable_mem_reuse = False
    opts.use_deterministic_compute = True
    opts.log_severity_level = 3
    opts.logid = "compat"
    return _session(rt, model, opts).run(None, {"x": X})


@script
def optimized_model_filepath(rt: Any, model: str, tmp: Path) -> Any:
    opts = rt.SessionOptions()
    opts.optimized_model_filepath = str(tmp / "optimized.onnx")
    return _session(rt, model, opts).run(None, {"x": X})


@script
def free_dimension_override(rt: Any, model: str, tmp: Path) -> Any:
    opts = rt.SessionOptions()
    opts.add_free_dimension_override_by_name("batch", 3)
    sess = _session(rt, model, opts)
    return sess.get_inputs()[0].shape, sess.run(None, {"x": X})


@script
def session_config_known_key(rt: Any, model: str, tmp: Path) -> Any:
    opts = rt.SessionOptions()
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    value = opts.get_session_config_entry("session.intra_op.allow_spinning")
    return value, _session(rt, model, opts).run(None, {"x": X})


@script
def session_config_unknown_key(rt: Any, model: str, tmp: Path) -> Any:
    opts = rt.SessionOptions()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        opts.add_session_config_entry("session.some_future_key", "1")
    return opts.get_session_config_entry("session.some_future_key"), len(seen)


@script
def session_config_missing_key(rt: Any, model: str, tmp: Path) -> Any:
    return rt.SessionOptions().get_session_config_entry("session.not_set")


# ------------------------------------------------------------------ providers
@script
def get_all_providers(rt: Any, model: str, tmp: Path) -> Any:
    return "CPUExecutionProvider" in rt.get_all_providers(), rt.get_device()


@script
def get_available_providers(rt: Any, model: str, tmp: Path) -> Any:
    providers = rt.get_available_providers()  # each its own list; the CPU's is last
    return providers[-1], len(set(providers)) == len(providers)


@script
def providers_from_available(rt: Any, model: str, tmp: Path) -> Any:
    providers = [p for p in rt.get_available_providers() if p == "CPUExecutionProvider"]
    sess = rt.InferenceSession(model, providers=providers)
    return sess.get_providers(), sess.run(None, {"x": X})


def _fallback(rt: Any, model: str, providers: list[Any]) -> Any:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        sess = rt.InferenceSession(model, providers=providers)
    said = [str(w.message) for w in seen if issubclass(w.category, UserWarning)]
    return said, sess.get_providers(), sess.run(None, {"x": X})


@script
def providers_unavailable_first(rt: Any, model: str, tmp: Path) -> Any:
    return _fallback(rt, model, ["CUDAExecutionProvider", "CPUExecutionProvider"])


@script
def providers_fallback_prefix(rt: Any, model: str, tmp: Path) -> Any:
    said, providers, out = _fallback(rt, model, ["TensorrtExecutionProvider",
                                                 "CPUExecutionProvider"])
    return [s.partition("Available providers:")[0] for s in said], providers, out


@script
def provider_tuple_options(rt: Any, model: str, tmp: Path) -> Any:
    sess = rt.InferenceSession(model, providers=[("CPUExecutionProvider", {})])
    return sess.get_provider_options(), sess.run(None, {"x": X})


@script
def provider_options_argument(rt: Any, model: str, tmp: Path) -> Any:
    sess = rt.InferenceSession(model, providers=["CPUExecutionProvider"],
                               provider_options=[{}])
    return sess.get_providers(), sess.run(None, {"x": X})


# ------------------------------------------------------------------ run options
@script
def run_options_log_fields(rt: Any, model: str, tmp: Path) -> Any:
    ro = rt.RunOptions()
    ro.logid = "compat-run"
    ro.log_severity_level = 3
    ro.log_verbosity_level = 1
    ro.only_execute_path_to_fetches = True
    return (ro.terminate, ro.logid, ro.log_severity_level,
            _session(rt, model).run(None, {"x": X}, ro))


@script
def run_options_terminate(rt: Any, model: str, tmp: Path) -> Any:
    ro = rt.RunOptions()
    ro.terminate = True
    return _session(rt, model).run(None, {"x": X}, ro)


@script
def run_options_terminate_reset(rt: Any, model: str, tmp: Path) -> Any:
    ro = rt.RunOptions()
    ro.terminate = True
    ro.terminate = False
    return _session(rt, model).run(None, {"x": X}, ro)


@script
def run_config_entry(rt: Any, model: str, tmp: Path) -> Any:
    ro = rt.RunOptions()
    ro.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
    return (ro.get_run_config_entry("memory.enable_memory_arena_shrinkage"),
            _session(rt, model).run(None, {"x": X}, ro))


# ------------------------------------------------------------------ feeds and errors
@script
def feed_float_list(rt: Any, model: str, tmp: Path) -> Any:
    return _session(rt, model).run(None, {"x": X.tolist()})


@script
def feed_int_list(rt: Any, model: str, tmp: Path) -> Any:
    return _session(rt, model).run(None, {"x": [list(range(8)), list(range(8, 16))]})


@script
def feed_text_list(rt: Any, model: str, tmp: Path) -> Any:
    return _session(rt, model).run(None, {"x": [["a"] * 8]})


@script
def feed_ragged_list(rt: Any, model: str, tmp: Path) -> Any:
    return _session(rt, model).run(None, {"x": [[1.0] * 8, [2.0]]})


@script
def feed_wrong_dtype(rt: Any, model: str, tmp: Path) -> Any:
    return _session(rt, model).run(None, {"x": X.astype(np.float64)})


@script
def feed_wrong_rank(rt: Any, model: str, tmp: Path) -> Any:
    return _session(rt, model).run(None, {"x": X[0]})


@script
def feed_wrong_width(rt: Any, model: str, tmp: Path) -> Any:
    return _session(rt, model).run(None, {"x": X[:, :4]})


@script
def feed_missing_input(rt: Any, model: str, tmp: Path) -> Any:
    return _session(rt, model).run(None, {})


@script
def unknown_output_name(rt: Any, model: str, tmp: Path) -> Any:
    return _session(rt, model).run(["nope"], {"x": X})


@script
def missing_model_file(rt: Any, model: str, tmp: Path) -> Any:
    return rt.InferenceSession(str(tmp / "absent.onnx"))


@script
def bytes_not_a_model(rt: Any, model: str, tmp: Path) -> Any:
    return rt.InferenceSession(b"not an onnx model")


# ------------------------------------------------------------------ OrtValue, io_binding
@script
def ortvalue_from_numpy(rt: Any, model: str, tmp: Path) -> Any:
    v = rt.OrtValue.ortvalue_from_numpy(X)
    return (v.shape(), v.data_type(), v.element_type(), v.device_name(), v.is_tensor(),
            v.has_value(), v.tensor_size_in_bytes(), v.numpy(),
            np.shares_memory(v.numpy(), X))


@script
def ortvalue_from_shape_and_type(rt: Any, model: str, tmp: Path) -> Any:
    v = rt.OrtValue.ortvalue_from_shape_and_type([2, 3], np.int64)
    v.update_inplace(np.arange(6, dtype=np.int64).reshape(2, 3))
    return v.shape(), v.data_type(), v.element_type(), v.numpy()


@script
def ortvalue_dlpack(rt: Any, model: str, tmp: Path) -> Any:
    v = rt.OrtValue.from_dlpack(X)
    return v.shape(), v.numpy(), np.from_dlpack(v)


@script
def run_with_ort_values(rt: Any, model: str, tmp: Path) -> Any:
    sess = _session(rt, model)
    outs = sess.run_with_ort_values(None, {"x": rt.OrtValue.ortvalue_from_numpy(X)})
    return [(o.data_type(), o.shape(), o.numpy()) for o in outs]


@script
def io_binding_ortvalues(rt: Any, model: str, tmp: Path) -> Any:
    sess = _session(rt, model)
    io = sess.io_binding()
    io.bind_ortvalue_input("x", rt.OrtValue.ortvalue_from_numpy(X))
    y = rt.OrtValue.ortvalue_from_shape_and_type([3, 4], np.float32)
    io.bind_ortvalue_output("y", y)
    io.bind_output("s")
    sess.run_with_iobinding(io)
    outs = io.get_outputs()
    return [o.numpy() for o in outs], y.numpy(), io.copy_outputs_to_cpu()


@script
def io_binding_buffers(rt: Any, model: str, tmp: Path) -> Any:
    sess = _session(rt, model)
    io = sess.io_binding()
    io.bind_cpu_input("x", X)
    buf = np.zeros((3, 4), np.float32)
    io.bind_output("y", "cpu", 0, np.float32, list(buf.shape), buf.ctypes.data)
    io.bind_output("s")
    sess.run_with_iobinding(io)
    io.synchronize_outputs()
    return buf, io.copy_outputs_to_cpu()


@script
def io_binding_rebind(rt: Any, model: str, tmp: Path) -> Any:
    sess = _session(rt, model)
    io = sess.io_binding()
    io.bind_cpu_input("x", X)
    io.bind_output("y")
    sess.run_with_iobinding(io)
    first = io.copy_outputs_to_cpu()
    io.clear_binding_inputs()
    io.clear_binding_outputs()
    io.bind_cpu_input("x", X[:1] * 2)
    io.bind_output("s")
    io.bind_output("y")
    sess.run_with_iobinding(io)
    return first, io.copy_outputs_to_cpu()


@script
def io_binding_terminate(rt: Any, model: str, tmp: Path) -> Any:
    sess = _session(rt, model)
    io = sess.io_binding()
    io.bind_cpu_input("x", X)
    io.bind_output("y")
    ro = rt.RunOptions()
    ro.terminate = True
    sess.run_with_iobinding(io, ro)
    return io.copy_outputs_to_cpu()


@script
def ortvalue_types(rt: Any, model: str, tmp: Path) -> Any:
    arrays = [np.ones(2, t) for t in (np.bool_, np.float16, np.float64, np.int8, np.uint8,
                                      np.int32, np.uint64)]
    values = [rt.OrtValue.ortvalue_from_numpy(a) for a in arrays]
    return [(v.data_type(), v.element_type(), v.numpy().dtype.name) for v in values]


@script
def run_options_defaults(rt: Any, model: str, tmp: Path) -> Any:
    ro = rt.RunOptions()
    return (ro.terminate, ro.logid, ro.log_severity_level, ro.log_verbosity_level,
            ro.only_execute_path_to_fetches)


# ------------------------------------------------------------------ profiling
def _profiled(rt: Any, model: str, tmp: Path) -> Any:
    opts = rt.SessionOptions()
    opts.enable_profiling = True
    opts.profile_file_prefix = str(tmp / "prof")
    sess = _session(rt, model, opts)
    sess.run(None, {"x": X})
    sess.run(None, {"x": X[:1]})
    return sess


@script
def profile_file(rt: Any, model: str, tmp: Path) -> Any:
    sess = _profiled(rt, model, tmp)
    started = sess.get_profiling_start_time_ns()
    path = sess.end_profiling()
    events = json.loads(Path(path).read_text())
    return (Path(path).name.startswith("prof_"), path.endswith(".json"), started > 0,
            sorted({e["cat"] for e in events}), sorted({e["ph"] for e in events}),
            sum(e["name"] == "model_run" for e in events),
            all({"cat", "name", "ph", "ts", "dur", "pid", "tid", "args"} <= set(e)
                for e in events),
            all("op_name" in e["args"] for e in events if e["cat"] == "Node"))


@script
def profile_events(rt: Any, model: str, tmp: Path) -> Any:
    events = json.loads(Path(_profiled(rt, model, tmp).end_profiling()).read_text())
    return sorted({e["args"]["op_name"] for e in events if e["cat"] == "Node"})


@script
def profiling_off(rt: Any, model: str, tmp: Path) -> Any:
    sess = _session(rt, model)
    return sess.get_profiling_start_time_ns(), sess.end_profiling()


# ------------------------------------------------------------------ module names
@script
def logger_and_threads_settings(rt: Any, model: str, tmp: Path) -> Any:
    rt.set_default_logger_severity(3)
    rt.set_default_logger_verbosity(0)
    return _session(rt, model).run(None, {"x": X})


@script
def sparse_tensor(rt: Any, model: str, tmp: Path) -> Any:
    return rt.SparseTensor.__name__


@script
def run_async(rt: Any, model: str, tmp: Path) -> Any:
    sess = _session(rt, model)
    return callable(sess.run_async)
