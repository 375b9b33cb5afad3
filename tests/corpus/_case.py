"""CorpusCase and the helpers that run a case's functions on random inputs.

Reference protocol (`CorpusCase.reference[func_name]`), written with numpy and
independently of the IR:
- PrimFunc: called with copies of all arguments (scalars and arrays, outputs
  included with their initial contents); returns the expected final value of
  the last k buffer parameters — one array for k = 1, a tuple for k > 1. Any
  buffer not returned must be left unchanged by the function.
- graph Function: called with the arguments; returns the result (an array, or a
  tuple for a tuple result).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kiln import evaluate  # kiln.ir's interpreter with kiln's operators
from kiln.ir import IRModule
from kiln.ir import dtype as dt
from kiln.ir import graph as g
from kiln.ir import tensor as t
from kiln.ir.types import TensorType, TupleType, Type

# inputs(rng, func_name) -> the arguments for that function, or None for random ones.
InputsFn = Callable[[np.random.Generator, str], list[Any] | None]


@dataclass
class CorpusCase:
    """One IRModule of the corpus, how to feed its functions, and numpy references."""

    name: str
    build: Callable[[], IRModule]
    inputs: InputsFn | None = None
    reference: dict[str, Callable[..., Any]] = field(default_factory=dict)
    rtol: float = 1e-5
    atol: float = 1e-5
    # Free-form labels backends may filter on, e.g. "extern", "graph", "float16".
    tags: frozenset[str] = frozenset()
    _module: IRModule | None = field(default=None, init=False, repr=False, compare=False)

    def module(self) -> IRModule:
        """The built module (built once and cached)."""
        if self._module is None:
            self._module = self.build()
        return self._module

    def functions(self) -> list[str]:
        return list(self.module().functions)

    def args(self, func_name: str, rng: np.random.Generator) -> list[Any]:
        """Arguments for `func_name`: the case's `inputs`, else random by dtype."""
        if self.inputs is not None:
            custom = self.inputs(rng, func_name)
            if custom is not None:
                return custom
        return random_args(self.module()[func_name], rng)


def random_value(shape: Sequence[int], dtype: str, rng: np.random.Generator) -> Any:
    """Random array (or scalar for shape None) of `dtype`: floats N(0, 1), ints small."""
    npdt = dt.to_numpy(dtype)
    if not all(isinstance(d, int) for d in shape):
        raise ValueError(f"cannot make random data for symbolic shape {tuple(shape)}; give "
                         "the case explicit inputs")
    size = tuple(int(d) for d in shape)
    if dt.is_float(dtype):
        arr: np.ndarray = rng.standard_normal(size).astype(np.float32).astype(npdt)
    elif dtype == "bool":
        arr = rng.integers(0, 2, size).astype(bool)
    elif dt.kind(dtype) == "uint":
        arr = rng.integers(0, 21, size).astype(npdt)
    else:
        arr = rng.integers(-10, 11, size).astype(npdt)
    return np.array(arr, order="C")  # (np.ascontiguousarray turns 0-d into 1-d)


def random_args(func: t.PrimFunc | g.Function, rng: np.random.Generator) -> list[Any]:
    """Random arguments for every parameter of `func` (outputs get random junk too).

    Symbolic dimensions get small random sizes: a scalar parameter used as a
    dimension gets a value in [1, 8] and the arrays are shaped to match.
    """
    sizes = _DimSizes(rng)
    for p in func.params:
        if isinstance(p, t.Var) and p in _dimension_vars(func):
            sizes.values[p] = int(rng.integers(1, 9))
    out: list[Any] = []
    for p in func.params:
        if isinstance(p, t.Buffer):
            out.append(random_value(sizes.shape(p.shape), p.dtype, rng))
        elif isinstance(p, t.Var):
            value = sizes.values.get(p)
            out.append(value if value is not None else random_value((), p.dtype, rng)[()].item())
        else:
            out.append(_random_typed(p.var_type, rng, sizes))
    return out


def _dimension_vars(func: t.PrimFunc | g.Function) -> set[t.Var]:
    found: set[t.Var] = set()

    def walk(d: Any) -> None:
        if isinstance(d, t.Var):
            found.add(d)
        elif isinstance(d, (t.BinaryOp, t.Cast)):
            for child in (d.a, d.b) if isinstance(d, t.BinaryOp) else (d.value,):
                walk(child)

    for p in func.params:
        if isinstance(p, t.Buffer):
            for d in p.shape:
                walk(d)
    return found


class _DimSizes:
    """Sizes chosen for symbolic dimensions (Vars get 1..8 on first sight)."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.values: dict[t.Var, int] = {}

    def shape(self, shape: Sequence[Any]) -> tuple[int, ...]:
        return tuple(self.dim(d) for d in shape)

    def dim(self, d: Any) -> int:
        if isinstance(d, int):
            return d
        if isinstance(d, t.Const):
            return int(d.value)
        if isinstance(d, t.Var):
            if d not in self.values:
                self.values[d] = int(self.rng.integers(1, 9))
            return self.values[d]
        if isinstance(d, t.Cast):
            return self.dim(d.value)
        if isinstance(d, t.BinaryOp) and d.op in _DIM_OPS:
            return int(_DIM_OPS[d.op](self.dim(d.a), self.dim(d.b)))
        raise ValueError(f"cannot choose a size for dimension {d!r}; give the case "
                         "explicit inputs")


_DIM_OPS: dict[str, Callable[[int, int], int]] = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "floordiv": lambda a, b: a // b, "floormod": lambda a, b: a % b, "min": min, "max": max,
}


def _random_typed(ty: Type, rng: np.random.Generator, sizes: _DimSizes) -> Any:
    if isinstance(ty, TupleType):
        return tuple(_random_typed(f, rng, sizes) for f in ty.fields)
    assert isinstance(ty, TensorType)
    return random_value(sizes.shape(ty.shape), ty.dtype, rng)


def _copy(args: Sequence[Any]) -> list[Any]:
    return [a.copy() if isinstance(a, np.ndarray) else a for a in args]


def run_reference(case: CorpusCase, func_name: str, args: Sequence[Any]) -> Any:
    """Expected results: for a PrimFunc all arguments after the call; for a graph
    function its result. Raises KeyError if the case has no reference for it."""
    ref = case.reference[func_name]
    fn = case.module()[func_name]
    copies = _copy(args)
    result = ref(*_copy(args))
    if isinstance(fn, g.Function):
        return result
    buffers = [k for k, p in enumerate(fn.params) if isinstance(p, t.Buffer)]
    outs = list(result) if isinstance(result, tuple) else [result]
    if len(outs) > len(buffers):
        raise ValueError(f"{case.name}.{func_name}: reference returned {len(outs)} outputs "
                         f"but the function has {len(buffers)} buffers")
    for k, value in zip(buffers[len(buffers) - len(outs):], outs):
        p = fn.params[k]
        assert isinstance(p, t.Buffer)
        arr = np.asarray(value).astype(dt.to_numpy(p.dtype))
        want = np.shape(args[k])
        if arr.shape != want:
            raise ValueError(f"{case.name}.{func_name}: reference output for '{p.name}' has "
                             f"shape {arr.shape}, expected {want}")
        copies[k] = arr
    return copies


def run_interpreter(case: CorpusCase, func_name: str, args: Sequence[Any]) -> Any:
    """The interpreter's results, in the same form as `run_reference`."""
    copies = _copy(args)
    result = evaluate(case.module(), func_name, *copies)
    fn = case.module()[func_name]
    return result if isinstance(fn, g.Function) else copies


def assert_outputs_match(case: CorpusCase, expected: Any, actual: Any, what: str = "") -> None:
    """Compare results (arrays, lists/tuples of arrays, scalars) with the case's tolerance."""
    where = what or case.name
    if isinstance(expected, (list, tuple)):
        assert isinstance(actual, (list, tuple)), f"{where}: expected a sequence"
        assert len(expected) == len(actual), f"{where}: {len(expected)} vs {len(actual)} values"
        for k, (e, a) in enumerate(zip(expected, actual)):
            assert_outputs_match(case, e, a, f"{where}[{k}]")
        return
    if not isinstance(expected, np.ndarray):
        assert expected == actual, f"{where}: {expected!r} != {actual!r}"
        return
    assert isinstance(actual, np.ndarray), f"{where}: got {type(actual).__name__}"
    assert actual.dtype == expected.dtype, f"{where}: dtype {actual.dtype} != {expected.dtype}"
    assert actual.shape == expected.shape, f"{where}: shape {actual.shape} != {expected.shape}"
    if expected.dtype.kind == "f" or expected.dtype.name == "bfloat16":
        np.testing.assert_allclose(actual.astype(np.float64), expected.astype(np.float64),
                                   rtol=case.rtol, atol=case.atol, err_msg=where)
    else:
        np.testing.assert_array_equal(actual, expected, err_msg=where)
