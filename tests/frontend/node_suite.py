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
- "unsupported": it uses an op type kiln has no converter for (not run);
- "xfail": listed in XFAIL with a reason (run anyway; a pass is reported so the
  entry gets removed);
- "run": everything else; it must pass.
"""

from __future__ import annotations

import functools
import re
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# ONNX op type -> indices of inputs that must be compile-time constants.
STATIC_OPERANDS: dict[str, tuple[int, ...]] = {
    "Reshape": (1,), "Slice": (1, 2, 3, 4), "Split": (1,), "Squeeze": (1,),
    "Unsqueeze": (1,), "Tile": (1,), "Expand": (1,), "Pad": (1, 2, 3),
    "Resize": (1, 2, 3), "Upsample": (1,), "Clip": (1, 2), "ConstantOfShape": (0,),
    "Range": (0, 1, 2), "Dropout": (1, 2), "Trilu": (1,), "CumSum": (1,), "CumProd": (1,),
    "TopK": (1,),
    "OneHot": (1,), "CenterCropPad": (1,), "ReduceSum": (1,), "ReduceMean": (1,),
    "ReduceMax": (1,), "ReduceMin": (1,), "ReduceProd": (1,), "ReduceL1": (1,),
    "ReduceL2": (1,), "ReduceLogSum": (1,), "ReduceLogSumExp": (1,),
    "ReduceSumSquare": (1,),
}

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
    r"^test_identity_(sequence|opt)$": "sequence and optional types are not supported",
    r"^test_maxpool_with_argmax": "MaxPool's Indices output is not supported",
    r"^test_equal_string": "string tensors are not supported",
}

# Case name -> (rtol, atol) where the suite's reference data is less exact than
# kiln's default tolerance (the reason is in the comment).
TOLERANCE: dict[str, tuple[float, float]] = {
    # expected values are written with 4 decimals in onnx's test generator
    "test_averagepool_2d_ceil_last_window_starts_on_pad": (1e-3, 1e-4),
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
        opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
        name = raw.name if len(raw.data_sets) == 1 else f"{raw.name}[{k}]"
        cases.append(Case(name, model, values, tuple(_array(o) for o in outs),
                          frozenset(n.op_type for n in graph.node), int(opset)))
    return cases


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


def supported(op_types: Iterable[str]) -> bool:
    from kiln.ops.onnx_map import converters

    table = converters()
    return all(op in table for op in op_types)


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
    mantissa) 8e-3. Integers and bools must be equal.
    """
    if len(got) != len(want):
        raise AssertionError(f"{len(got)} outputs, expected {len(want)}")
    for k, (g, w) in enumerate(zip(got, want)):
        g = np.asarray(g)
        if g.dtype != w.dtype:
            raise AssertionError(f"output {k}: dtype {g.dtype}, expected {w.dtype}")
        if g.shape != w.shape:
            raise AssertionError(f"output {k}: shape {g.shape}, expected {w.shape}")
        if w.dtype.kind == "f" or w.dtype.name == "bfloat16":
            if tolerance is not None:
                rtol, atol = tolerance
            elif w.dtype.name == "bfloat16":
                rtol, atol = 8e-3, 8e-3
            elif w.dtype.itemsize == 2:
                rtol, atol = 1e-3, 1e-3
            else:
                rtol, atol = 1e-4, 1e-5
            np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64),
                                       rtol=rtol, atol=atol, err_msg=f"output {k}")
        else:
            np.testing.assert_array_equal(g, w, err_msg=f"output {k}")


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
        if not supported(op_types):
            missing = sorted(op for op in op_types if not supported([op]))
            unsupported.append(Outcome(raw.name, "unsupported",
                                       f"no converter for {', '.join(missing)}", op_types))
            continue
        runnable.extend(prepare(raw))
    return runnable, unsupported


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
    """A deterministic sample: the first case (by name) of every (op types, dtypes)
    group of small graphs, plus the COMPILED_ONLY cases."""
    groups: dict[Any, Case] = {}
    for c in sorted(cases, key=lambda c: c.name):
        if xfail_reason(c.name):
            continue
        if compiled_only(c.name):
            groups[("only", c.name)] = c
            continue
        if len(c.model.graph.node) > SAMPLE_MAX_NODES:
            continue
        dtypes = tuple(sorted({str(v.dtype) for v in c.inputs.values()}
                              | {str(o.dtype) for o in c.outputs}))
        groups.setdefault((c.op_types, dtypes), c)
    return sorted(groups.values(), key=lambda c: c.name)


def run_compiled(cases: Sequence[Case], target: str = "llvm", batch: int = 40
                 ) -> list[Outcome]:
    """Compile the cases in batches (one module, one function per case), jit, check.

    A batch that fails to compile is retried case by case, so a failure names
    its case.
    """
    outcomes: list[Outcome] = []
    for start in range(0, len(cases), batch):
        outcomes.extend(_run_batch(list(cases[start:start + batch]), target))
    return outcomes


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
    mod = IRModule({name: m["main"] for name, (_, m) in imported.items()})
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
        return outcomes + [o for c, _ in imported.values() for o in _run_batch([c], target)]
    seconds = (time.perf_counter() - start) / len(imported)
    for name, (case, m) in imported.items():
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
