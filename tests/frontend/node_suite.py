"""The ONNX backend node conformance suite, run through kiln.

`onnx.backend.test.case.node.collect_testcases()` builds ~1,900 small models,
each with inputs and the reference outputs computed by ONNX's own reference
code. This module decides which cases kiln runs, prepares them for a static
compiler, runs them through an executor and compares the outputs.

Preparation (documented in docs/onnx.md):
- every graph input gets its test data's shape through `shape_dict`;
- graph inputs feeding a *static operand* (a shape, axes, pads, slice bounds,
  scales...: see STATIC_OPERANDS) are turned into initializers holding the test
  value, because kiln compiles static graphs (TVM's test suite does the same).

Classification of a case:
- "unsupported": it uses an op type kiln cannot import (no converter and no ONNX
  function body, see missing_ops; the reason is in MISSING_OP_REASONS) or a
  sequence/optional graph input or output (not run);
- "xfail": listed in XFAIL with a reason (run anyway; a pass is reported so the
  entry gets removed);
- "run": everything else; it must pass.

onnxruntime runs every case too (run_onnxruntime, in a child process), on the
case's own model, checked by the same check_outputs: each case it passes and
kiln does not must have its reason in XFAIL or MISSING_OP_REASONS.
Compiled runs: compiled_sample for `llvm`, c_sample for `c` (run_compiled).
"""

from __future__ import annotations

import functools
import re
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

# ONNX op type -> indices of inputs that must be compile-time constants.
STATIC_OPERANDS: dict[str, tuple[int, ...]] = {
    "Reshape": (1,), "Slice": (1, 2, 3, 4), "Split": (1,), "Squeeze": (1,),
    "Unsqueeze": (1,), "Tile": (1,), "Expand": (1,), "Pad": (1, 2, 3),
    "Resize": (1, 2, 3), "Upsample": (1,), "Clip": (1, 2), "ConstantOfShape": (0,),
    "Range": (0, 1, 2), "Dropout": (1, 2), "Trilu": (1,), "CumSum": (1,), "CumProd": (1,),
    "TopK": (1,), "Col2Im": (1, 2), "MaxUnpool": (2,), "HannWindow": (0,),
    "HammingWindow": (0,), "BlackmanWindow": (0,), "MelWeightMatrix": (0, 1, 2, 3, 4),
    "OneHot": (1,), "CenterCropPad": (1,), "ReduceSum": (1,), "ReduceMean": (1,),
    "ReduceMax": (1,), "ReduceMin": (1,), "ReduceProd": (1,), "ReduceL1": (1,),
    "ReduceL2": (1,), "ReduceLogSum": (1,), "ReduceLogSumExp": (1,),
    "ReduceSumSquare": (1,),
}

# Why kiln cannot import an op type of the suite (cases using it are not run). Every
# case onnxruntime passes and kiln does not gets its reason from here or from XFAIL
# (test_onnx_node_suite checks it; docs/onnx.md lists them).
IF_SHAPES = ("If branches whose outputs differ in shape are refused (docs/onnx.md, "
             "*Control flow*)")
LOOP_SCAN_LENGTH = ("a Loop scan output whose length is known only at run time (an early "
                    "exit) is refused (docs/onnx.md, *Control flow*)")
STRINGS = "string tensors are not supported by kiln"
SEQUENCES = "sequence and optional values are not supported by kiln"
TRAINING = "training operators (ai.onnx.preview.training) are out of kiln's scope"
NOT_YET = "not implemented yet"
MISSING_OP_REASONS: dict[str, str] = {
    **dict.fromkeys(["StringConcat", "StringSplit", "StringNormalizer", "RegexFullMatch"],
                    STRINGS),
    **dict.fromkeys(["SequenceEmpty", "SequenceInsert", "SequenceLength", "SequenceAt",
                     "SequenceConstruct", "SequenceErase", "SplitToSequence",
                     "ConcatFromSequence", "OptionalGetElement", "OptionalHasElement",
                     "Optional", "SequenceMap"], SEQUENCES),
    "LabelEncoder": STRINGS + " (the suite's LabelEncoder cases map string keys)",
    **dict.fromkeys(["Adagrad", "Adam", "Momentum", "Gradient"], TRAINING),
    "BitCast": "needs a bit-reinterpreting cast in kiln's IR: " + NOT_YET,
    "ImageDecoder": "decodes encoded image bytes (JPEG, PNG...): out of kiln's scope",
    "Bernoulli": "random sampling (no reproducible reference)",
    "RandomUniformLike": "random sampling (no reproducible reference)",
    "RandomNormalLike": "random sampling (no reproducible reference)",
    "Multinomial": "random sampling (no reproducible reference)",
    **dict.fromkeys(["RoiAlign", "DFT", "STFT", "FlexAttention"], NOT_YET),
}


def missing_op_reason(op_type: str) -> str:
    return MISSING_OP_REASONS.get(op_type, "no reason recorded")


# Case-name regex -> why kiln does not pass it (cases are still run: a pass
# means the entry is stale and the test says so).
XFAIL: dict[str, str] = {
    r"^test_cast_.*(FLOAT8|FLOAT4|INT4|UINT4|INT2|UINT2)": "dtype not supported by kiln "
    "(float8/float4/int4/int2)",
    r"^test_castlike_.*(FLOAT8|FLOAT4|INT4|UINT4|INT2|UINT2)": "dtype not supported by kiln "
    "(float8/float4/int4/int2)",
    r"^test_(de)?quantizelinear_.*(e4m3|e5m2|int4|int2|float4)": "quantized dtype refused by "
    "kiln (float8/float4/int4/int2, docs/quantization.md)",
    r"^test_training_dropout(?!_zero_ratio)": "training-mode Dropout is random",
    r"^test_equal_string": STRINGS,
    r"^test_maxunpool_export_with_output_shape$": "kiln follows onnxruntime (and PyTorch): "
    "the indices address the output_shape tensor; onnx's reference pads the default-shaped "
    "result instead (onnxruntime fails this case too)",
    r"^test_affine_grid_(2d|3d)(_align_corners)?(_expanded)?$": IF_SHAPES + " (the function "
    "body of AffineGrid branches on the rank: 2-D and 3-D grids)",
    r"^test_range_.*_expanded$": LOOP_SCAN_LENGTH + " (the function body of Range loops "
    "over a run-time count)",
    r"^test_loop11$": "Slice with a run-time start (the loop counter) inside a Loop body: "
    "kiln needs Slice bounds at compile time",
    r"^test_scan_sum$": "Scan before opset 9 (a batch axis and sequence_lens) is refused",
    r"^test_bernoulli": "random sampling (the function body of Bernoulli uses "
    "RandomUniformLike)",
}

# Case name -> (rtol, atol) where the suite's reference data is less exact than
# kiln's default tolerance (the reason is in the comment).
TOLERANCE: dict[str, tuple[float, float]] = {
    # expected values are written with 4 decimals in onnx's test generator
    "test_averagepool_2d_ceil_last_window_starts_on_pad": (1e-3, 1e-4),
    "test_gridsample_bicubic": (1e-3, 1e-4),
}


@dataclass(frozen=True)
class Case:
    """One prepared node test case."""

    name: str
    model: Any                     # onnx.ModelProto, static operands frozen
    inputs: dict[str, np.ndarray]  # the remaining graph inputs, by name
    outputs: tuple[np.ndarray, ...]
    op_types: frozenset[str]
    opset: int


@dataclass
class Outcome:
    name: str
    status: str            # "pass", "fail", "xfail", "xpass", "unsupported"
    reason: str = ""
    op_types: frozenset[str] = field(default_factory=frozenset)
    seconds: float = 0.0


def xfail_reason(name: str) -> str | None:
    for pattern, reason in XFAIL.items():
        if re.search(pattern, name):
            return reason
    return None


@functools.cache
def raw_cases() -> tuple[Any, ...]:
    """The onnx package's node test cases (computed once per process, ~10 s)."""
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return tuple(collect_testcases())


def prepare(raw: Any) -> list[Case]:
    """One Case per data set of `raw` (an onnx TestCase), static operands frozen."""
    import onnx
    from onnx import numpy_helper

    cases = []
    for k, (ins, outs) in enumerate(raw.data_sets):
        model = onnx.ModelProto()
        model.CopyFrom(raw.model)
        graph = model.graph
        init_names = {t.name for t in graph.initializer}
        graph_inputs = [i for i in graph.input if i.name not in init_names]
        # Data sets list values for the leading inputs (optional trailing ones may be absent).
        values = {vi.name: _array(v) for vi, v in zip(graph_inputs, ins)}
        static = _static_input_names(graph)
        keep = []
        for vi in graph.input:
            if vi.name in static and vi.name in values:
                graph.initializer.append(numpy_helper.from_array(values.pop(vi.name), vi.name))
            else:
                keep.append(vi)
        del graph.input[:]
        graph.input.extend(keep)
        opset = model_opset(model)
        name = case_names(raw)[k]
        cases.append(Case(name, model, values, tuple(_array(o) for o in outs),
                          frozenset(n.op_type for n in graph.node), opset))
    return cases


def case_names(raw: Any) -> list[str]:
    """The case names of `raw`'s data sets: its name, or `name[k]` when it has several."""
    n = len(raw.data_sets)
    return [raw.name] if n == 1 else [f"{raw.name}[{k}]" for k in range(n)]


def model_opset(model: Any) -> int:
    """The model's default-domain opset (0 when it imports none)."""
    return int(next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
                    0))


def _array(value: Any) -> np.ndarray:
    """Test data as numpy (types numpy lacks, like bfloat16, come as TensorProtos)."""
    from onnx import TensorProto, numpy_helper

    return numpy_helper.to_array(value) if isinstance(value, TensorProto) else np.asarray(value)


# Nodes whose output depends on their input's shape only: the closure stops there.
SHAPE_ONLY = frozenset({"Shape", "Size"})


def _static_input_names(graph: Any) -> set[str]:
    """Values that flow into a static operand (a backward closure over the graph)."""
    names: set[str] = set()
    for node in graph.node:
        for pos in STATIC_OPERANDS.get(node.op_type, ()):
            if pos < len(node.input) and node.input[pos]:
                names.add(node.input[pos])
    changed = True
    while changed:
        changed = False
        for node in graph.node:
            if node.op_type in SHAPE_ONLY or not any(o in names for o in node.output):
                continue
            for i in node.input:
                if i and i not in names:
                    names.add(i)
                    changed = True
    return names


def missing_ops(model: Any) -> list[str]:
    """The op types of `model`'s graph kiln cannot import: no converter (keyed by domain)
    and no ONNX function body at the model's opset to import instead
    (kiln.frontend.onnx.functions)."""
    from kiln.frontend.onnx.control_flow import CONTROL_FLOW_OPS
    from kiln.frontend.onnx.converters.registry import converters
    from kiln.frontend.onnx.functions import function_schema

    table = converters()
    opset = model_opset(model)
    missing = set()

    def visit(graph: Any) -> None:  # If branches and Loop/Scan bodies too
        for node in graph.node:
            key = node.op_type if node.domain in ("", "ai.onnx") else \
                f"{node.domain}.{node.op_type}"
            if key not in table and key not in CONTROL_FLOW_OPS and \
                    function_schema(node.op_type, node.domain, opset) is None:
                missing.add(node.op_type)
            for attr in node.attribute:
                if attr.HasField("g"):
                    visit(attr.g)
                for sub in attr.graphs:
                    visit(sub)

    visit(model.graph)
    return sorted(missing)


@functools.cache
def missing_by_case() -> dict[str, list[str]]:
    """Case name -> missing_ops of its model, for every case of the suite."""
    return {n: missing_ops(r.model) for r in raw_cases() for n in case_names(r)}


NON_TENSOR_REASON = "kiln imports tensor inputs and outputs only"


def non_tensor_values(graph: Any) -> list[str]:
    """The kinds of graph inputs and outputs that are not tensors (sequence, optional)."""
    kinds = {vi.type.WhichOneof("value") or "untyped" for vi in [*graph.input, *graph.output]}
    return sorted(k.removesuffix("_type") for k in kinds - {"tensor_type"})


Executor = Callable[[Any, dict[str, np.ndarray]], Sequence[np.ndarray]]


def import_case(case: Case) -> Any:
    """The case's model imported with every input's shape bound from its data."""
    from kiln.frontend import from_onnx

    shape_dict = {name: v.shape for name, v in case.inputs.items()}
    return from_onnx(case.model, shape_dict)


def check_outputs(got: Sequence[np.ndarray], want: Sequence[np.ndarray],
                  tolerance: tuple[float, float] | None = None) -> None:
    """Compare like the ONNX backend tests, with kiln's tolerances; AssertionError if off.

    Floats: float32/64 rtol 1e-4 and atol 1e-5; float16 1e-3; bfloat16 (8-bit
    mantissa) 8e-3. Integers, bools and 8-bit floats must be equal. An expected
    sequence (a list, for onnxruntime's sequence outputs) is compared item by item.
    """
    if len(got) != len(want):
        raise AssertionError(f"{len(got)} outputs, expected {len(want)}")
    for k, (g, w) in enumerate(zip(got, want)):
        if isinstance(w, list):
            if not isinstance(g, list):
                raise AssertionError(f"output {k}: {type(g).__name__}, expected a sequence")
            check_outputs(g, w, tolerance)
            continue
        g = np.asarray(g)
        if g.dtype != w.dtype:
            raise AssertionError(f"output {k}: dtype {g.dtype}, expected {w.dtype}")
        if g.shape != w.shape:
            raise AssertionError(f"output {k}: shape {g.shape}, expected {w.shape}")
        if w.dtype.name.startswith("float8"):
            # 8-bit floats: exact, NaNs equal where both have one
            np.testing.assert_array_equal(g.astype(np.float64), w.astype(np.float64),
                                          err_msg=f"output {k}")
        elif w.dtype.kind == "f" or w.dtype.name == "bfloat16":
            rtol, atol = tolerance or float_tolerance(w.dtype)
            np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64),
                                       rtol=rtol, atol=atol, err_msg=f"output {k}")
        else:
            np.testing.assert_array_equal(g, w, err_msg=f"output {k}")


def float_tolerance(dtype: np.dtype) -> tuple[float, float]:
    """check_outputs's (rtol, atol) for a float dtype: float32/64 1e-4 and 1e-5, float16
    1e-3, bfloat16 8e-3."""
    if dtype.name == "bfloat16":
        return 8e-3, 8e-3
    return (1e-3, 1e-3) if dtype.itemsize == 2 else (1e-4, 1e-5)


def run_case(case: Case, execute: Executor) -> Outcome:
    """Import, execute and check one case; never raises."""
    reason = xfail_reason(case.name)
    start = time.perf_counter()
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            mod = import_case(case)
            got = execute(mod, case.inputs)
        check_outputs(got, case.outputs, TOLERANCE.get(case.name))
    except Exception as exc:  # the outcome records every failure
        msg = " ".join(str(exc).split())
        text = f"{type(exc).__name__}: {msg[:300]}"
        return Outcome(case.name, "xfail" if reason else "fail", reason or text,
                       case.op_types, time.perf_counter() - start)
    status = "xpass" if reason else "pass"
    return Outcome(case.name, status, reason or "", case.op_types, time.perf_counter() - start)


def all_cases(name_filter: str | None = None) -> tuple[list[Case], list[Outcome]]:
    """(runnable cases, outcomes of the unsupported ones)."""
    runnable: list[Case] = []
    unsupported: list[Outcome] = []
    for raw in raw_cases():
        if name_filter and not re.search(name_filter, raw.name):
            continue
        op_types = frozenset(n.op_type for n in raw.model.graph.node)
        missing = missing_ops(raw.model)
        kinds = non_tensor_values(raw.model.graph)
        if missing:
            why = "no converter for " + ", ".join(f"{op} ({missing_op_reason(op)})"
                                                  for op in missing)
        elif kinds:
            why = f"{' and '.join(kinds)} values: {NON_TENSOR_REASON}"
        else:
            runnable.extend(prepare(raw))
            continue
        unsupported.extend(Outcome(name, "unsupported", why, op_types)
                           for name in case_names(raw))
    return runnable, unsupported


# --------------------------------------------------------------------------- onnxruntime

def run_onnxruntime_in_process(raw: Sequence[Any] | None = None) -> list[Outcome]:
    """Every case of the suite (`raw`, default raw_cases()) through an onnxruntime
    InferenceSession on the case's own model (no operand frozen) and data, checked like
    kiln's outputs (check_outputs).

    Status "pass", "fail" (it ran, or could not be fed, and the check failed) or
    "refused" (onnxruntime cannot load the model: no kernel for an op or a type).
    """
    import onnxruntime as ort

    from support.reference import ort_session

    options = ort.SessionOptions()
    options.log_severity_level = 4  # its warnings about unused initializers are noise
    outcomes = []
    for case in raw_cases() if raw is None else raw:
        op_types = frozenset(n.op_type for n in case.model.graph.node)
        names = case_names(case)
        try:
            session = ort_session(case.model, options)
        except Exception as exc:  # onnxruntime raises its own types (Fail, NotImplemented)
            outcomes += [Outcome(n, "refused", _text(exc), op_types) for n in names]
            continue
        inputs = [i.name for i in session.get_inputs()]
        for name, (ins, outs) in zip(names, case.data_sets):
            try:
                want = [_ort_value(o) for o in outs]
                feeds = {n: _ort_value(v) for n, v in zip(inputs, ins)}
                check_outputs(session_outputs(session, feeds, want), want,
                              TOLERANCE.get(name))
            except Exception as exc:  # the outcome records every failure
                outcomes.append(Outcome(name, "fail", _text(exc), op_types))
                continue
            outcomes.append(Outcome(name, "pass", "", op_types))
    return outcomes


def session_outputs(session: Any, feeds: dict[str, Any], want: Sequence[Any]) -> list[Any]:
    """An onnxruntime session's outputs on `feeds`, whose types `want` (arrays of the
    expected outputs) gives: types numpy's binding of onnxruntime lacks (bfloat16, the
    float8s) go through OrtValues as raw bytes."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        if any(_byte_typed(v) for v in feeds.values()) or any(_byte_typed(w) for w in want):
            return _run_with_byte_types(session, feeds, list(want))
        return list(session.run(None, feeds))


def _ort_value(value: Any) -> Any:
    """A data-set value as onnxruntime takes it (a sequence is a list of arrays)."""
    if isinstance(value, list):
        return [_array(v) for v in value]
    return None if value is None else _array(value)


def _byte_typed(value: Any) -> bool:
    """Whether `value` is an array of a type onnxruntime's numpy binding lacks but that
    fills whole bytes (bfloat16, the float8s): it goes through OrtValues and raw bytes.
    Sub-byte types (int4, float4...) are packed by onnxruntime: not handled."""
    if not isinstance(value, np.ndarray) or value.dtype.kind in "biuc" or \
            value.dtype in (np.float16, np.float32, np.float64):
        return False
    from onnx import helper

    try:
        onnx_type = int(helper.np_dtype_to_tensor_dtype(value.dtype))
    except (KeyError, TypeError, ValueError):
        return False
    return onnx_type not in _PACKED and value.dtype.itemsize in (1, 2)


# ONNX element types stored several to a byte (int4, uint4, float4e2m1, int2, uint2).
_PACKED = frozenset({22, 21, 23, 25, 26})


def _run_with_byte_types(session: Any, feeds: dict[str, Any], want: list[np.ndarray]
                         ) -> list[np.ndarray]:
    """session.run through OrtValues: byte-typed inputs are given with their ONNX type,
    outputs numpy cannot name are read as raw bytes in the expected output's dtype."""
    import ctypes

    import onnxruntime as ort
    from onnx import helper

    values = {}
    for name, v in feeds.items():
        if _byte_typed(v):
            raw = v.view(np.uint8 if v.dtype.itemsize == 1 else np.uint16)
            values[name] = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
                raw, helper.np_dtype_to_tensor_dtype(v.dtype))
        else:
            values[name] = ort.OrtValue.ortvalue_from_numpy(v)
    got = []
    for out, w in zip(session.run_with_ort_values(None, values), want):
        if not _byte_typed(w):
            got.append(out.numpy())
            continue
        data = ctypes.string_at(out.data_ptr(), out.tensor_size_in_bytes())
        got.append(np.frombuffer(data, dtype=w.dtype).reshape(out.shape()))
    return got


def _text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"


def run_onnxruntime() -> list[Outcome]:
    """run_onnxruntime_in_process in a child process (onnxruntime is native code that
    could crash on a case); RuntimeError naming the exit status if the child dies.

    The child reads this process's raw_cases() from a pickle instead of collecting them
    again (onnx computes the cases' outputs with its Python reference: seconds of CPU)."""
    import json
    import pickle
    import subprocess
    import sys
    import tempfile

    from support.processes import child_env

    with tempfile.TemporaryDirectory(prefix="kiln-node-suite-") as tmp:
        cases = Path(tmp) / "raw_cases.pickle"
        cases.write_bytes(pickle.dumps(raw_cases(), protocol=pickle.HIGHEST_PROTOCOL))
        child = subprocess.run([sys.executable, __file__, "--onnxruntime", str(cases)],
                               capture_output=True, text=True, check=False,
                               env=child_env())
    if child.returncode != 0:
        raise RuntimeError(f"the onnxruntime run exited with status {child.returncode}: "
                           f"{child.stderr[-2000:]}")
    return [Outcome(name, status, reason, frozenset(ops))
            for name, status, reason, ops in json.loads(child.stdout)]


# --------------------------------------------------------------------------- executors

def ordered_inputs(mod: Any, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The input arrays in the order of main's parameters."""
    return [inputs[p.name] for p in mod["main"].params]


def execute_references(mod: Any, inputs: dict[str, np.ndarray]) -> tuple[np.ndarray, ...]:
    """Run main's graph with each operator's numpy reference (no lowering)."""
    from kiln.ir import graph as g
    from kiln.ops import evaluate_call

    fn = mod["main"]
    env: dict[Any, Any] = dict(zip(fn.params, ordered_inputs(mod, inputs)))

    def ev(e: Any) -> Any:
        if isinstance(e, g.Var):
            return env[e]
        if isinstance(e, g.Constant):
            return e.data
        if isinstance(e, g.Call):
            return evaluate_call(e.op, [ev(a) for a in e.args], e.attrs)
        if isinstance(e, g.Tuple):
            return tuple(ev(f) for f in e.fields)
        if isinstance(e, g.TupleGetItem):
            return ev(e.tuple_value)[e.index]
        raise TypeError(f"cannot evaluate {type(e).__name__}")

    for b in fn.bindings:
        env[b.var] = ev(b.value)
    result = ev(fn.result)
    return result if isinstance(result, tuple) else (result,)


def execute_interpreter(mod: Any, inputs: dict[str, np.ndarray]) -> tuple[np.ndarray, ...]:
    """Legalize every op into its PrimFunc and run the module with kiln.ir.evaluate."""
    from kiln.ir import evaluate
    from kiln.transform.legalize_ops import LegalizeOps

    lowered = LegalizeOps().run(mod)
    result = evaluate(lowered, "main", *ordered_inputs(mod, inputs))
    return result if isinstance(result, tuple) else (result,)


# --------------------------------------------------------------------------- compiled path

# Cases too slow for the interpreter (large 3-D pools): they run compiled only.
COMPILED_ONLY = (
    r"^test_(max|average|lp)pool_3d_default$",
    r"^test_(max|average)pool_3d_dilations_(use_ref_impl_)?large",
)
# The compiled sample skips big expanded graphs (attention, rotary...): their LLVM
# compile takes seconds each; the interpreter runs them.
SAMPLE_MAX_NODES = 10


def compiled_only(name: str) -> bool:
    return any(re.search(p, name) for p in COMPILED_ONLY)


def compiled_sample(cases: Sequence[Case]) -> list[Case]:
    """A deterministic sample for `llvm`: the first case (by name) of every (op types,
    dtypes) group of small graphs, plus the COMPILED_ONLY cases, plus a case of every
    op type the groups miss (op_cover)."""
    groups: dict[Any, Case] = {}
    eligible = [c for c in sorted(cases, key=lambda c: c.name) if not xfail_reason(c.name)]
    for c in eligible:
        if compiled_only(c.name):
            groups[("only", c.name)] = c
            continue
        if len(c.model.graph.node) > SAMPLE_MAX_NODES:
            continue
        dtypes = tuple(sorted({str(v.dtype) for v in c.inputs.values()}
                              | {str(o.dtype) for o in c.outputs}))
        groups.setdefault((c.op_types, dtypes), c)
    chosen = list(groups.values())
    return sorted(chosen + op_cover(eligible, chosen), key=lambda c: c.name)


def op_cover(cases: Sequence[Case], chosen: Sequence[Case] = ()) -> list[Case]:
    """For every op type of `cases` (except expected failures) that no case of `chosen`
    uses, the smallest case using it (fewest nodes, then name); greedy, deterministic."""
    covered = {op for c in chosen for op in c.op_types}
    eligible = sorted((c for c in cases if not xfail_reason(c.name)),
                      key=lambda c: (len(c.model.graph.node), c.name))
    added = []
    for op in sorted({op for c in eligible for op in c.op_types}):
        if op in covered:
            continue
        pick = next(c for c in eligible if op in c.op_types)
        added.append(pick)
        covered |= pick.op_types
    return added


def c_sample(cases: Sequence[Case]) -> list[Case]:
    """A deterministic sample for the `c` target: one case of every op type (op_cover)."""
    return sorted(op_cover(cases), key=lambda c: c.name)


def run_compiled(cases: Sequence[Case], target: str = "llvm", batch: int = 400
                 ) -> list[Outcome]:
    """Compile the cases in batches (one module, one function per case), jit, check.

    The default batch holds a sample (compiled_sample, c_sample) whole: one library per
    target, not one per 40 cases (each library links and compiles its host code anew).
    A batch that fails to compile is retried in halves down to single cases, so a
    failure names its case. A case this process compiled for `target` before (the same
    name and model) is not compiled again: its outcome is reused (compiled_case).
    """
    todo = [c for c in cases if (target, case_key(c)) not in _OUTCOMES]
    keys = {c.name: case_key(c) for c in todo}
    for start in range(0, len(todo), batch):
        for outcome in _run_batch(list(todo[start:start + batch]), target):
            _OUTCOMES[(target, keys[outcome.name])] = outcome
    return [_OUTCOMES[(target, case_key(c))] for c in cases]


@dataclass(frozen=True)
class CompiledCase:
    """A case as run_compiled compiled it: the library, the case's function in it and
    the imported module (whose main's parameters order the inputs)."""

    library: Any
    function: str
    module: Any

    def __call__(self, inputs: dict[str, np.ndarray]) -> tuple[np.ndarray, ...]:
        """The case's function on `inputs` (graph input name -> array)."""
        got = self.library[self.function](*ordered_inputs(self.module, inputs))
        return got if isinstance(got, tuple) else (got,)


# (target, case_key) -> run_compiled's outcome, and the compiled case where it compiled:
# each case compiles once per process and target, and the non-finite fuzz
# (tests/frontend/test_nonfinite_fuzz.py) runs the node suite's modules on its inputs.
_OUTCOMES: dict[tuple[str, str], Outcome] = {}
_COMPILED: dict[tuple[str, str], CompiledCase] = {}


def case_key(case: Case) -> str:
    """The case's name and a digest of its prepared model (two cases may share a name)."""
    import hashlib

    return f"{case.name}:{hashlib.sha1(case.model.SerializeToString()).hexdigest()}"


def compiled_case(case: Case, target: str = "llvm") -> CompiledCase | None:
    """`case` compiled for `target` (by run_compiled, now if this process has not yet),
    or None where it did not compile."""
    run_compiled([case], target)
    return _COMPILED.get((target, case_key(case)))


def _run_batch(cases: list[Case], target: str) -> list[Outcome]:
    import kiln
    from kiln.ir import IRModule

    imported: dict[str, tuple[Case, Any]] = {}
    outcomes: list[Outcome] = []
    for k, case in enumerate(cases):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                imported[f"case{k}"] = (case, import_case(case))
        except Exception as exc:
            outcomes.append(_failed(case, exc))
    if not imported:
        return outcomes
    # A module with more functions than `main` (If branches, Loop bodies) compiles alone:
    # its functions' names are the importer's, the same in every case.
    alone = [c for c, m in imported.values() if len(m.functions) > 1]
    if alone and len(imported) > 1:
        rest = [c for c, m in imported.values() if len(m.functions) == 1]
        done = _run_batch(rest, target) if rest else []
        return outcomes + done + [o for c in alone for o in _run_batch([c], target)]
    mod = IRModule({name: fn for key, (_, m) in imported.items()
                    for name, fn in ((key, m["main"]),
                                     *((n, f) for n, f in m.functions.items() if n != "main"))})
    start = time.perf_counter()
    try:
        lib = kiln.compile(mod, target).jit()
    except Exception:
        if len(imported) == 1:
            case = next(iter(imported.values()))[0]
            try:
                kiln.compile(mod, target).jit()
            except Exception as exc:
                return [*outcomes, _failed(case, exc)]
        # halves: a failing case among hundreds costs a few compiles, not one per case
        tried = [c for c, _ in imported.values()]
        half = len(tried) // 2
        return outcomes + _run_batch(tried[:half], target) + _run_batch(tried[half:], target)
    seconds = (time.perf_counter() - start) / len(imported)
    for name, (case, m) in imported.items():
        _COMPILED[(target, case_key(case))] = CompiledCase(lib, name, m)
        reason = xfail_reason(case.name)
        try:
            with np.errstate(all="ignore"):
                got = lib[name](*ordered_inputs(m, case.inputs))
            check_outputs(got if isinstance(got, tuple) else (got,), case.outputs,
                          TOLERANCE.get(case.name))
        except Exception as exc:
            outcomes.append(_failed(case, exc))
            continue
        outcomes.append(Outcome(case.name, "xpass" if reason else "pass", reason or "",
                                case.op_types, seconds))
    return outcomes


def _failed(case: Case, exc: BaseException) -> Outcome:
    reason = xfail_reason(case.name)
    msg = " ".join(str(exc).split())
    return Outcome(case.name, "xfail" if reason else "fail",
                   reason or f"{type(exc).__name__}: {msg[:300]}", case.op_types)


if __name__ == "__main__":
    import json
    import pickle
    import sys

    if sys.argv[1:2] != ["--onnxruntime"] or len(sys.argv) > 3:
        raise SystemExit("usage: node_suite.py --onnxruntime [CASES.pickle]  (prints "
                         "onnxruntime's outcomes as JSON; the cases pickled by "
                         "run_onnxruntime, else collected)")
    given = pickle.loads(Path(sys.argv[2]).read_bytes()) if len(sys.argv) == 3 else None
    json.dump([(o.name, o.status, o.reason, sorted(o.op_types))
               for o in run_onnxruntime_in_process(given)], sys.stdout)
