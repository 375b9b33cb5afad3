"""`SessionOptions`: a session's settings, named as in onnxruntime."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kiln.errors import ArgumentTypeError, UsageError, shown
from kiln.session import config_entries, ort_names
from kiln.session.ort_enums import ExecutionMode, ExecutionOrder, GraphOptimizationLevel


class SessionOptions:
    """Session settings, named as in onnxruntime.

    Attributes:
        intra_op_num_threads: threads of the library's thread pool, the caller included;
            0 (default) = the process default (`kiln.runtime.set_num_threads`, else
            `KILN_NUM_THREADS`, else one per online CPU). Applied to this session's
            library only (`Module.set_num_threads`, docs/runtime.md).
        inter_op_num_threads: accepted for compatibility; kiln runs one op at a time.
        graph_optimization_level, execution_mode, execution_order: onnxruntime's enums
            (kiln.GraphOptimizationLevel, ...), checked and kept; kiln compiles with all
            of its passes and runs ops one after the other whatever they say.
        enable_profiling, profile_file_prefix: with profiling on, the session compiles
            its model with kiln's per-kernel timers and `end_profiling()` writes
            onnxruntime's profile JSON (kiln.session.profiling) named after the prefix.
        optimized_model_filepath: must stay "": kiln writes no optimized ONNX model (a
            session refuses a path, saying what to use).
        log_severity_level, log_verbosity_level, logid, enable_cpu_mem_arena,
            enable_mem_pattern, enable_mem_reuse, use_deterministic_compute,
            use_per_session_threads: accepted for compatibility (kiln's runs are
            deterministic and its memory is planned at compile time).
        max_loop_iterations: kiln's own: the most iterations an ONNX Loop may run when
            the session compiles the model (`kiln.compile(..., max_loop_iterations=)`);
            a run whose Loop would run more raises CallError naming the Loop node.
            None (default): no limit, as onnxruntime.
        progress: kiln's own: None, or a callable given a
            `kiln.driver.progress.ProgressEvent` at every step of a compile (a session
            over an ONNX file that misses the compile cache); None shows a line on a
            terminal, else logs to the `logging` logger "kiln" (docs/session.md).
        shape_dict: kiln's own: pins or bounds of the model's symbolic dimensions when
            the session compiles an ONNX model, as `kiln.frontend.from_onnx` takes them
            (`{"past_seq": range(0, 4097)}` bounds, `{"batch": 1}` pins). None
            (default): every symbolic dimension takes any size from 0 up.
    """

    def __init__(self) -> None:
        self.intra_op_num_threads = 0
        self.inter_op_num_threads = 0
        self.graph_optimization_level = GraphOptimizationLevel.ORT_ENABLE_ALL
        self.execution_mode = ExecutionMode.ORT_SEQUENTIAL
        self.execution_order = ExecutionOrder.DEFAULT
        self.optimized_model_filepath = ""
        self.enable_profiling = False
        self.profile_file_prefix = "onnxruntime_profile_"
        self.log_severity_level = -1
        self.log_verbosity_level = 0
        self.logid = ""
        self.enable_cpu_mem_arena = True
        self.enable_mem_pattern = True
        self.enable_mem_reuse = True
        self.use_deterministic_compute = False
        self.use_per_session_threads = True
        self.max_loop_iterations: int | None = None
        self.progress: Callable[[Any], None] | None = None
        self.shape_dict: dict[str, Any] | None = None
        self._config: dict[str, str] = {}

    def add_session_config_entry(self, key: str, value: str) -> None:
        """Set an onnxruntime session configuration entry: the keys kiln maps
        (kiln.session.config_entries.KNOWN, e.g. "session.intra_op.allow_spinning") are
        checked and applied; any other key is kept, with a warning that kiln does not use
        it, and listed by `unused_session_config_entries()`."""
        config_entries.check(key, value)
        self._config[key] = value

    def get_session_config_entry(self, key: str) -> str:
        """The value set by `add_session_config_entry(key, ...)`."""
        if key not in self._config:
            raise UsageError(f"SessionOptions does not have configuration with key: {key}")
        return self._config[key]

    def session_config_entries(self) -> dict[str, str]:
        """kiln's own: every configuration entry set, as a dict."""
        return dict(self._config)

    def unused_session_config_entries(self) -> list[str]:
        """kiln's own: the entries set that kiln does not read."""
        return config_entries.unused(self._config)

    def add_free_dimension_override_by_name(self, dim_name: str, dim_value: int) -> None:
        """Pin the symbolic dimension `dim_name` to `dim_value` when the session compiles
        the model: kiln's `shape_dict[dim_name] = dim_value`."""
        if not isinstance(dim_name, str) or isinstance(dim_value, bool) or \
                not isinstance(dim_value, int) or dim_value < 0:
            raise ArgumentTypeError("add_free_dimension_override_by_name takes a dimension's "
                                    f"name and an int >= 0, got {shown(dim_name, 40)}, "
                                    f"{shown(dim_value, 40)}")
        self.shape_dict = {**(self.shape_dict or {}), dim_name: dim_value}

    def has_providers(self) -> bool:
        """False: providers are chosen by the session's `providers` argument."""
        return False

    def __getattr__(self, name: str) -> Any:
        raise ort_names.missing("SessionOptions", name)


def check_ort_fields(options: SessionOptions) -> None:
    """UsageError for an onnxruntime field kiln cannot honour or a value it does not
    take: a path to write an optimized model, a level or mode that is not one of the
    enums' values."""
    if options.optimized_model_filepath not in ("", None):
        raise UsageError(
            f"SessionOptions.optimized_model_filepath={options.optimized_model_filepath!r}: "
            "kiln writes no optimized ONNX model; its compiled library is the optimized form: "
            "kiln.compile(model, 'host').export_library('model.so') (or `kiln compile "
            "model.onnx -o model.so`), then InferenceSession('model.so')")
    for field, enum in (("graph_optimization_level", GraphOptimizationLevel),
                        ("execution_mode", ExecutionMode), ("execution_order", ExecutionOrder)):
        value = getattr(options, field)
        if isinstance(value, bool) or not isinstance(value, int) or \
                value not in set(enum.__members__.values()):
            raise UsageError(f"SessionOptions.{field} must be a kiln.{enum.__name__} "
                             f"({', '.join(enum.__members__)}), got {shown(value, 40)}")
    if not isinstance(options.enable_profiling, bool) or \
            not isinstance(options.profile_file_prefix, str):
        raise ArgumentTypeError("SessionOptions.enable_profiling must be a bool and "
                                "profile_file_prefix a str, got "
                                f"{shown(options.enable_profiling, 30)}, "
                                f"{shown(options.profile_file_prefix, 60)}")


__all__ = ["SessionOptions", "check_ort_fields"]
