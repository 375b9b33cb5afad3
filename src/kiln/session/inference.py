"""`InferenceSession`: onnxruntime's session API over a kiln library or an ONNX file."""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from kiln.artifact import generic_kernels
from kiln.driver import cache
from kiln.errors import ArgumentTypeError, CallError, GenericKernelWarning, UsageError, shown
from kiln.runtime import Module, load_module
from kiln.runtime.abi import numpy_dtype
from kiln.session import config_entries, feeds, ort_names, start
from kiln.session.io_binding import IOBinding
from kiln.session.node_arg import ModelMetadata, NodeArg, SessionOptions
from kiln.session.ort_value import OrtValue
from kiln.session.profiling import SessionProfiler
from kiln.session.providers import CPU_PROVIDER, provider_name, warn_unavailable
from kiln.session.run_options import RunOptions
from kiln.session.session_options import check_ort_fields

if TYPE_CHECKING:
    from kiln.runtime.function import PackedFunction

_ENTRY = "main"


class InferenceSession:
    """Run a model as `onnxruntime.InferenceSession` does.

    An ONNX file is looked up in the compile cache by its bytes and the options before
    anything is imported: a hit loads the library linked before (kiln.session.start);
    a miss compiles, showing or reporting its progress (`SessionOptions.progress`,
    kiln.session.progress), and stores the linked library.

    Args:
        path_or_library: an ONNX file (compiled for this machine, `host`, through the
            compile cache), its serialized bytes or an onnx.ModelProto (cached by the
            bytes' digest); a library written by
            `export_library` (.so, .tar); a `kiln.Executable`, a loaded
            `kiln.runtime.Module`, or an IRModule (compiled for `host`).
        sess_options: a `kiln.SessionOptions` (kiln.session.session_options).
        providers: None or execution providers as onnxruntime takes them (names, or
            (name, options dict) tuples); kiln runs on the CPU: another provider is
            skipped with onnxruntime's warning, as onnxruntime falls back
            (kiln.session.providers).
        provider_options: None or one options dict per name in `providers`.

    Raises:
        ArgumentTypeError: an argument of the wrong type (named, with the type expected).
        UsageError: an option's bad value, or one kiln cannot honour
            (`optimized_model_filepath`).
        MissingFileError, FormatError, FrontendError, CompileError: the model cannot
            be read or compiled.
    """

    def __init__(self, path_or_library: Any, sess_options: SessionOptions | None = None,
                 providers: Sequence[Any] | None = None,
                 provider_options: Sequence[Mapping[str, Any]] | None = None,
                 **kwargs: Any) -> None:
        _check_keywords(kwargs)
        self._options = _checked_options(sess_options, providers, provider_options)
        warn_unavailable(providers)  # onnxruntime's fallback, with its warning
        self._meta = ModelMetadata()
        self.cache_hit = False  # kiln's own: the library came from the compile cache
        threads = _thread_count(self._options)
        self._generic: list[dict[str, Any]] = []
        self._profiler: SessionProfiler | None = None
        self._function = self._open(path_or_library, threads)
        if self._generic:  # once per session, naming the caller's line
            warnings.warn(generic_kernels.report(self._generic), GenericKernelWarning,
                          stacklevel=2)
        self._inputs = [NodeArg.of(p) for p in self._function.params]
        self._outputs = [NodeArg.of(r) for r in self._function.results]
        self._output_index = {o.name: i for i, o in enumerate(self._outputs)}
        self._dtypes = [_numpy_dtype(str(p["dtype"])) for p in self._function.params]
        if self._profiler is not None:
            self._profiler.initialized()

    # ------------------------------------------------------------ loading
    def _open(self, source: Any, threads: int) -> PackedFunction:
        _check_loop_limit(self._options, source)
        if self._options.enable_profiling:  # from the start, as onnxruntime's
            self._profiler = SessionProfiler(self._options.profile_file_prefix, None)
        with warnings.catch_warnings():  # the session warns once, from the metadata
            warnings.simplefilter("ignore", GenericKernelWarning)
            module = self._module(source, threads)
        metadata = getattr(module, "metadata", None) or {}
        self._generic = list(metadata.get(generic_kernels.METADATA_KEY) or [])
        if threads and hasattr(module, "set_num_threads"):
            module.set_num_threads(threads)  # this library only, from its next call
        spin = config_entries.spin_us(self._options.session_config_entries())
        if spin is not None and hasattr(module, "set_spin_us"):
            module.set_spin_us(spin)
        if self._profiler is not None and metadata.get("profile", {}).get("sites"):
            self._profiler.read = module.profile  # the kernels' timers, per run
        return _entry(module)

    def _module(self, source: Any, threads: int) -> Any:
        """The loaded library behind `source` (compiled for host when it is a model)."""

        if isinstance(source, Module):
            return source
        if isinstance(source, (bytes, bytearray)) or _is_model_proto(source):
            return self._open_in_memory(source, threads)
        if isinstance(source, (str, os.PathLike)):
            path = Path(source)
            if path.suffix.lower() == ".onnx":
                return self._open_onnx(path, threads)
            return load_module(path, num_threads=threads or None)
        if callable(getattr(source, "export_library", None)):  # a kiln.Executable
            return source.jit()
        if type(source).__name__ == "IRModule":
            start.with_shape_dict(source, self._options)  # UsageError: imported already
            key = None
            if cache.cache_enabled(_pass_config()):
                key = start.module_session_key(source, self._options)
            return self._cached_or_compiled(source, key, None, threads)
        raise ArgumentTypeError(
            "InferenceSession: path_or_library must be an ONNX file, its bytes or an "
            "onnx.ModelProto, a library (.so, .tar), a kiln.Executable, Module or IRModule; got "
            f"{type(source).__name__}")

    def _open_onnx(self, path: Path, threads: int) -> Any:
        """The library of the ONNX file at `path`: the compile cache's, else compiled."""
        start.require_file(path)
        key = None
        if cache.cache_enabled(_pass_config()):
            try:
                key = start.session_key(path, self._options)
            except OSError:  # a directory, unreadable: the import says what it is
                key = None
        return self._cached_or_compiled(path, key, path, threads)

    def _open_in_memory(self, source: Any, threads: int) -> Any:
        """The library of ONNX bytes or an onnx.ModelProto, keyed by the bytes' digest (a
        proto's serialized bytes) as a file is by its own."""
        key = None
        if cache.cache_enabled(_pass_config()):
            try:
                data = source if isinstance(source, (bytes, bytearray)) \
                    else source.SerializeToString()
            except ValueError:  # a proto over protobuf's 2 GiB: compiled, not cached
                data = None
            if data is not None:
                key = start.bytes_session_key(data, self._options)
        return self._cached_or_compiled(source, key, None, threads)

    def _cached_or_compiled(self, source: Any, key: str | None, path: Path | None,
                            threads: int) -> Any:
        """The library of the cache entry `key` (None: no cache) when it holds one, else
        `source` compiled (and stored under `key`)."""
        if key is not None:
            found = start.cached_session(key, path, threads)
            if found is not None:
                module, self._meta = found
                self.cache_hit = True
                return module
        module, self._meta = start.compiled_session(source, key, self._options, threads,
                                                    _metadata_of)
        return module

    # ------------------------------------------------------------ describing
    @property
    def generic_kernels(self) -> list[dict[str, Any]]:
        """The kernels a symbolic size left on their generic loops, each with the node,
        the op, the kernel that takes it pinned and the `shape_dict` pin ("hint"); empty
        when every kernel is hand-built (docs/dynamic-shapes.md)."""
        return [dict(e) for e in self._generic]

    def get_inputs(self) -> list[NodeArg]:
        """The model's inputs: name, shape (symbolic dimensions by name), type."""
        return list(self._inputs)

    def get_outputs(self) -> list[NodeArg]:
        """The model's outputs, in the order `run(None, ...)` returns them."""
        return list(self._outputs)

    def get_overridable_initializers(self) -> list[NodeArg]:
        """None in kiln: weights are compiled into the library."""
        return []

    def get_providers(self) -> list[str]:
        """The execution providers in use: the CPU's."""
        return [CPU_PROVIDER]

    def get_provider_options(self) -> dict[str, dict[str, str]]:
        """Each provider in use with its options: the CPU's, with none (as onnxruntime's
        CPU provider, which keeps none of the options it is given)."""
        return {CPU_PROVIDER: {}}

    def end_profiling(self) -> str:
        """With `SessionOptions.enable_profiling`: write onnxruntime's profile JSON
        (kiln.session.profiling) and return its path; profiling stops. Else ""."""
        profiler, self._profiler = self._profiler, None
        return "" if profiler is None else profiler.end()

    def get_profiling_start_time_ns(self) -> int:
        """When profiling started (ns since the epoch); 0 without profiling."""
        return 0 if self._profiler is None else self._profiler.start_ns

    def get_session_options(self) -> SessionOptions:
        """The options this session was made with."""
        return self._options

    def get_modelmeta(self) -> ModelMetadata:
        """The ONNX model's producer, graph name, domain, description, version and
        metadata properties (empty over a compiled library)."""
        return self._meta

    # ------------------------------------------------------------ running
    def run(self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any],
            run_options: RunOptions | None = None) -> list[np.ndarray]:
        """Run the model: the outputs named by `output_names` (None: all), as arrays.
        `run_options.terminate = True`, set from another thread, stops the run.

        Raises:
            CallError: an input missing or unknown, of the wrong dtype, rank or shape; an
                unknown output name; the run was terminated (its message says so).
        """
        picks = self._picks(output_names)
        results = self._call(self._arguments(input_feed), None, run_options)
        return [results[i] for i in picks]

    def run_with_ort_values(self, output_names: Sequence[str] | None,
                            input_dict_ort_values: Mapping[str, Any],
                            run_options: RunOptions | None = None) -> list[OrtValue]:
        """`run` with OrtValues in and out (kiln.OrtValue: numpy arrays behind
        onnxruntime's methods; arrays are taken too)."""
        return [OrtValue(a) for a in self.run(output_names, input_dict_ort_values,
                                              run_options)]

    def io_binding(self) -> IOBinding:
        """A binding of inputs and preallocated outputs for `run_with_iobinding`."""
        return IOBinding(self)

    def run_with_iobinding(self, iobinding: IOBinding, run_options: Any = None) -> None:
        """Run with the binding's inputs; write its bound outputs in place, allocate the
        others (read them with `iobinding.copy_outputs_to_cpu()`)."""
        if not isinstance(iobinding, IOBinding):
            raise ArgumentTypeError(f"run_with_iobinding takes the IOBinding of "
                                    f"session.io_binding(), got {_given(iobinding)}")
        args = self._arguments(iobinding.inputs)
        given = [iobinding.outputs.get(o.name) for o in self._outputs]
        if all(g is None for g in given):
            iobinding.results = self._call(args, None, run_options)
            return
        shapes = self._function.output_shapes(*args)
        bound = tuple(g if g is not None else np.empty(shape, _numpy_dtype(r["dtype"]))
                      for g, shape, r in zip(given, shapes, self._function.results))
        iobinding.results = self._call(args, bound, run_options)

    def _arguments(self, feed: Mapping[str, Any]) -> list[Any]:
        """The input feed as positional arguments, checked by name."""
        if not isinstance(feed, Mapping):
            raise ArgumentTypeError(
                f"input_feed must be a dict of input name -> array, got {type(feed).__name__}")
        names = [i.name for i in self._inputs]
        unknown = [k for k in feed if k not in names]
        if unknown:
            raise CallError(f"'{unknown[0]}' is not an input of this model; its inputs: "
                            f"{', '.join(names) or '(none)'}")
        missing = [n for n in names if n not in feed]
        if missing:
            raise CallError(f"missing input(s): {', '.join(missing)} (the model's inputs: "
                            f"{', '.join(names)})")
        return [feeds.converted(n, feed[n], dtype) for n, dtype in zip(names, self._dtypes)]

    def _call(self, args: list[Any], out: tuple[np.ndarray, ...] | None,
              run_options: RunOptions | None = None) -> list[np.ndarray]:
        if run_options is not None and not isinstance(run_options, RunOptions):
            raise ArgumentTypeError(f"run_options must be a kiln.RunOptions or None, got "
                                    f"{type(run_options).__name__}")
        flag = None if run_options is None else run_options.flag
        if flag is not None and flag.is_set and not self._function.terminable:
            # A library too old to poll the flag: refuse the run up front, as onnxruntime
            # does and as a library with the flag would, at its first check.
            raise CallError(f"{self._function.name}: terminated: the caller set the call's "
                            "terminate flag (before the run: this library, built before "
                            "kiln's library metadata version 5, cannot stop during one)")

        def call() -> Any:
            if flag is None:
                return self._function(*args, out=out)
            return self._function.call_with_flag(flag, *args, out=out)

        result = call() if self._profiler is None else self._profiler.run(call)
        return list(result) if isinstance(result, tuple) else [result]

    def _picks(self, output_names: Sequence[str] | None) -> list[int]:
        if output_names is None:
            return list(range(len(self._outputs)))
        if isinstance(output_names, str):
            raise ArgumentTypeError(
                f"output_names must be a list of names or None, got the string "
                f"{output_names!r}")
        if not isinstance(output_names, Sequence):
            raise ArgumentTypeError(f"output_names must be a list of names or None, got "
                                    f"{_given(output_names)}")
        picks = []
        for name in output_names:
            if name not in self._output_index:
                raise CallError(f"'{name}' is not an output of this model; its outputs: "
                                f"{', '.join(self._output_index)}")
            picks.append(self._output_index[name])
        return picks

    def output_index(self, name: str) -> int:
        """The position of output `name` (CallError naming the outputs if unknown)."""
        return self._picks([name])[0]

    def __getattr__(self, name: str) -> Any:
        raise ort_names.missing("InferenceSession", name)


def _check_keywords(kwargs: Mapping[str, Any]) -> None:
    """onnxruntime's keyword `disabled_optimizers` (names of its graph transformers, of
    which kiln has none: checked, then nothing to disable); UsageError for any other."""
    disabled = kwargs.get("disabled_optimizers")
    if disabled is not None and (isinstance(disabled, (str, bytes)) or not all(
            isinstance(n, str) for n in disabled)):
        raise ArgumentTypeError("InferenceSession: disabled_optimizers must be a list of "
                                f"optimizer names, got {_given(disabled)}")
    unknown = sorted(k for k in kwargs if k != "disabled_optimizers")
    if unknown:
        raise UsageError(f"InferenceSession: unknown keyword(s) {', '.join(unknown)}")


def _check_loop_limit(options: SessionOptions, source: Any) -> None:
    """UsageError when the options ask for a Loop limit that a compiled library cannot
    take (the limit is compiled in: kiln.compile(..., max_loop_iterations=N))."""
    compiles = isinstance(source, (bytes, bytearray)) or type(source).__name__ == "IRModule" \
        or _is_model_proto(source) \
        or (isinstance(source, (str, os.PathLike)) and Path(source).suffix.lower() == ".onnx")
    if getattr(options, "max_loop_iterations", None) is not None and not compiles:
        raise UsageError("SessionOptions.max_loop_iterations applies when the session "
                         "compiles the model (an ONNX file or bytes, an IRModule); compile a "
                         "library with kiln.compile(..., max_loop_iterations=N) instead")
    if getattr(options, "shape_dict", None) is not None and not compiles:
        raise UsageError("SessionOptions.shape_dict applies when the session compiles an ONNX "
                         "model (a file or its bytes); import with kiln.frontend.from_onnx(..., "
                         "shape_dict=...) and compile a library instead")


def _entry(module: Any) -> PackedFunction:
    """The model's entry function of a loaded library or Executable."""
    if _ENTRY not in module.function_names():
        raise CallError(f"this library has no '{_ENTRY}' function (it has "
                        f"{', '.join(module.function_names()) or 'none'}): InferenceSession "
                        "runs models compiled from ONNX (kiln compile model.onnx -o m.so)")
    function: PackedFunction = module[_ENTRY]
    if function.kind != "graph":
        raise CallError("'main' of this library is a tensor-level function; "
                        "InferenceSession runs graph-level models")
    return function


def _numpy_dtype(dtype: str) -> np.dtype[Any]:
    return numpy_dtype(dtype)


def _given(value: Any) -> str:
    """A value as an error message quotes it: its type, and its repr when short (read
    through kiln.errors.shown, so a huge argument costs no more than a short one)."""
    text = shown(value, 61)
    return type(value).__name__ + (f" {text}" if len(text) <= 60 else "")


def _checked_options(sess_options: Any, providers: Any,
                     provider_options: Any) -> SessionOptions:
    """The session's options, each constructor argument checked as onnxruntime types it:
    ArgumentTypeError naming the argument and the type it takes."""
    if sess_options is None:
        sess_options = SessionOptions()
    elif not isinstance(sess_options, SessionOptions):
        raise ArgumentTypeError(f"InferenceSession: sess_options must be a kiln.SessionOptions "
                                f"or None, got {_given(sess_options)}")
    if provider_options is not None:
        _check_provider_options(provider_options, providers)
    if providers is not None:
        if isinstance(providers, (str, bytes)) or not isinstance(providers, Sequence):
            raise ArgumentTypeError(
                "InferenceSession: providers must be None or a list of provider names or "
                f"(name, options dict) tuples, e.g. [{CPU_PROVIDER!r}]; got {_given(providers)}")
        for entry in providers:
            _check_provider(entry)
    for name in ("intra_op_num_threads", "inter_op_num_threads"):
        _thread_option(sess_options, name)
    check_ort_fields(sess_options)
    progress = getattr(sess_options, "progress", None)
    if progress is not None and not callable(progress):
        raise ArgumentTypeError(f"SessionOptions.progress must be a callable taking a "
                                f"kiln.driver.progress.ProgressEvent, or None; got "
                                f"{_given(progress)}")
    return sess_options


def _check_provider_options(options: Any, providers: Any) -> None:
    if isinstance(options, (str, bytes, Mapping)) or not isinstance(options, Sequence) or \
            not all(isinstance(o, Mapping) for o in options):
        raise ArgumentTypeError("InferenceSession: provider_options must be None or a list of "
                                f"dicts, one per provider; got {_given(options)}")
    if providers is not None and isinstance(providers, Sequence):
        if len(options) != len(providers):
            raise UsageError(f"InferenceSession: {len(providers)} provider(s) but "
                             f"{len(options)} provider_options dict(s); give one per provider")
        if not all(isinstance(p, str) for p in providers):
            raise ArgumentTypeError("InferenceSession: with provider_options, providers must "
                                    f"be names (str); got {_given(providers)}")


def _check_provider(entry: Any) -> None:
    """One entry of `providers`: a name, or a (name, options dict) tuple (a provider kiln
    does not have is skipped with onnxruntime's warning, kiln.session.providers)."""
    name = provider_name(entry)
    if not isinstance(name, str):
        raise ArgumentTypeError(f"InferenceSession: each provider must be a name (str) or a "
                                f"(name, options dict) tuple, got {_given(entry)}")


def _thread_option(options: SessionOptions, name: str) -> int:
    n = getattr(options, name)
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise UsageError(f"SessionOptions.{name} must be an integer >= 0, got {n!r}")
    return n


def _thread_count(options: SessionOptions) -> int:
    return _thread_option(options, "intra_op_num_threads")


def _pass_config() -> dict[str, Any] | None:
    """The config of the caller's PassContext (`kiln.cache` off there turns the cache
    off), or None when kiln.transform was never imported (no context can be open)."""
    context = sys.modules.get("kiln.transform.context")
    return None if context is None else dict(context.PassContext.current().config)


def _is_model_proto(source: Any) -> bool:
    """Whether `source` is an onnx.ModelProto (told without importing onnx: a session over
    a library never needs it)."""
    return type(source).__name__ == "ModelProto" and callable(
        getattr(source, "SerializeToString", None))


def _metadata_of(model: Any) -> ModelMetadata:
    """The ModelMetadata of an onnx.ModelProto."""
    return ModelMetadata(
        producer_name=model.producer_name, graph_name=model.graph.name,
        domain=model.domain, description=model.doc_string,
        graph_description=model.graph.doc_string,
        # onnxruntime answers INT64_MAX for a model that does not set its version
        version=model.model_version if model.HasField("model_version") else (1 << 63) - 1,
        custom_metadata_map={p.key: p.value for p in model.metadata_props})
