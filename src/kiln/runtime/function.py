"""Python wrappers of compiled functions.

`PackedFunction` binds Python arguments to a function's signature (the JSON
signature from the library metadata, docs/abi.md): positional or by IR
parameter name; for a graph function it allocates the results (or checks the
`out=` arrays) and returns them. Subclasses make the call:

- `NativeFunction` calls a packed C entry `{prefix}name`; the entry checks the
  arguments and reports through `{prefix}_last_error`.
- `RawKernelFunction` calls a raw kernel `int32_t k(T0*, ..., S0, ...)` (what the
  LLVM JIT produces) and performs the entry's checks itself, in Python, with the
  same message texts.
"""

from __future__ import annotations

import ctypes
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from numpy.lib.array_utils import byte_bounds

from kiln._registry import suggest
from kiln.errors import CallError, UsageError
from kiln.runtime import abi, ctypes_abi
from kiln.runtime.call_slots import ArgumentSlots, SlotPool
from kiln.runtime.ctypes_abi import Where, data_address
from kiln.runtime.dim_binding import bind_dims, compile_dim_text, dim_size
from kiln.runtime.in_place import check_shapes, drop_in_place, exact_overlap, in_place_pairs
from kiln.runtime.lifetime import CallGuard
from kiln.runtime.terminate import TerminateFlag


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _describe_param(p: Mapping[str, Any]) -> str:
    if p.get("kind") == "tensor":
        return f"{p['name']}: {p['dtype']}{ctypes_abi.format_shape(p['shape'])}"
    return f"{p['name']}: {p['dtype']}"


class PackedFunction:
    """A callable kiln function: `f(*args, out=None, **kwargs)`.

    Tensors are numpy arrays or DLPack tensors (torch, jax, ...) on the CPU and are
    passed without copying (a compiled library copies a strided input, such as a
    transpose, that the function only reads). A tensor-level function writes into the buffers you
    pass and returns None. A graph-level function returns a new array (a tuple
    when it returns a tuple), or writes into `out=` (an array, or a tuple of
    arrays) and returns that. For a tensor-level function, `out=` is simply its
    parameter named `out`, if it has one.
    """

    # Whether strided inputs are copied (signatures trusted to say what is written).
    copies_strided_inputs = False

    def __init__(self, signature: Mapping[str, Any]) -> None:
        self.signature: dict[str, Any] = dict(signature)
        self.name: str = str(signature["name"])
        self.kind: str = str(signature.get("kind", "tensor"))
        self.params: list[dict[str, Any]] = [dict(p) for p in signature.get("params", [])]
        self.results: list[dict[str, Any]] = [dict(r) for r in signature.get("results", [])]
        self.tuple_result = bool(signature.get("tuple_result", False))
        # Derived once here, used by every call.
        self._arguments = self.params + self.results  # what the compiled code takes
        self._index = {p["name"]: i for i, p in enumerate(self.params)}
        self._wheres = [Where(self.name, i, str(p["name"])) for i, p in enumerate(self._arguments)]
        # The value range of each integer scalar parameter (None for the others).
        self._int_bounds = [abi.SCALAR_RANGES.get(p["dtype"]) if p.get("kind") == "scalar" else None
                            for p in self.params]
        # Tensor arguments, and those the code writes: every result, and each parameter
        # the metadata marks "written" (libraries older than that mark carry none).
        self._tensors = [i for i, p in enumerate(self._arguments) if p.get("kind") == "tensor"]
        self._written = frozenset(i for i in self._tensors
                                  if i >= len(self.params) or self._arguments[i].get("written"))
        # Results that may be a parameter's own buffer (kiln.runtime.in_place).
        self._in_place = in_place_pairs(self.name, self.params, self.results)
        self._result_names = [str(r["name"]) for r in self.results]
        # Symbolic shapes (docs/dynamic-shapes.md): a dimension may be a variable's name or
        # an expression's text; a graph function lists its variables with their bounds.
        self.symbolic = any(isinstance(d, str) for i in self._tensors
                            for d in self._arguments[i]["shape"])
        self.dims: dict[str, tuple[int, int | None]] = {
            str(d["name"]): (int(d["min"]), None if d.get("max") is None else int(d["max"]))
            for d in signature.get("dims", [])}
        # Sizes the model divides by, which a call must not make 0 (a Reshape's -1).
        self.nonzero: list[tuple[str, str]] = [(str(d["dim"]), str(d["why"]))
                                               for d in signature.get("nonzero", [])]
        # Data-dependent sizes (docs/abi.md): results are allocated at their bound ("shape")
        # and trimmed to the extents the call reports.
        self.runtime_dims: list[dict[str, Any]] = [dict(d) for d in
                                                   signature.get("runtime_dims", [])]
        # The entry takes the caller's terminate flag after its arguments (docs/abi.md).
        self.terminable = signature.get("terminate") is True

    # -------------------------------------------------------------- calling
    def __call__(self, *args: Any, out: Any = None, **kwargs: Any) -> Any:
        return self._call(args, out, kwargs, None)

    def call_with_flag(self, flag: TerminateFlag, *args: Any, out: Any = None,
                       **kwargs: Any) -> Any:
        """`self(*args, out=out, **kwargs)` that `flag.set()`, from any thread, stops at
        its next kernel call or loop iteration with a CallError ("F: terminated: the
        caller set the call's terminate flag"). A function that cannot be stopped
        (`terminable` False: a library older than the flag, the llvmjit target, a
        tensor-level function) runs to its end."""
        return self._call(args, out, kwargs, flag)

    def _call(self, args: tuple[Any, ...], out: Any, kwargs: dict[str, Any],
              flag: TerminateFlag | None) -> Any:
        out, kwargs = self._tensor_out(out, kwargs)
        values, outputs = self._checked(args, kwargs, out)
        if flag is not None and self.terminable:
            actual = self._invoke_with_flag([*values, *outputs], self._wheres, flag)
        else:
            actual = self._invoke([*values, *outputs], self._wheres)
        if self.kind != "graph":
            return None
        if actual is not None:  # data-dependent sizes: views of the bound-sized buffers
            outputs = [trim_result(o, shape) for o, shape in zip(outputs, actual)]
        if self._in_place:
            check_shapes(self.name, self._in_place, values, outputs, self._result_names)
        if actual is None and out is not None:
            return out
        if len(outputs) == 1 and not self.tuple_result:
            return outputs[0]
        return tuple(outputs)

    def _tensor_out(self, out: Any, kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        """`out=` of a tensor-level function is its parameter named "out", if it has one;
        CallError otherwise."""
        if out is None or self.kind == "graph":
            return out, kwargs
        if "out" not in self._index:
            raise CallError(
                f"{self.name}: out= applies to graph-level functions; a tensor-level "
                "function writes into the buffers you pass as arguments")
        return None, {**kwargs, "out": out}

    def _checked(self, args: Sequence[Any], kwargs: Mapping[str, Any], out: Any
                 ) -> tuple[list[Any], list[np.ndarray]]:
        """A call's arguments bound and checked, and its result arrays (`out=`, checked,
        or allocated); CallError naming what is wrong, before anything is allocated."""
        values = self._bind(args, kwargs)
        allocating = self.kind == "graph" and out is None
        # Binding symbolic sizes reads the inputs' shapes: check them first, as the entry does.
        values = self._screen(values, check_shapes=allocating or self.symbolic)
        if self.kind == "graph" and self.symbolic:
            given = self._outputs(out) if out is not None else []
            sizes = self.bind_symbolic([*values, *given])
            outputs = given if out is not None else self._allocate(sizes)
        else:
            outputs = self._outputs(out) if self.kind == "graph" else []
        self._check_written([*values, *outputs])
        return values, outputs

    def prepare(self, *args: Any, out: Any = None, **kwargs: Any) -> PreparedCall:
        """This call, checked once, to repeat: `run = f.prepare(x, out=y)`, then each
        `run()` computes `f` on what `x` holds at that moment into `y` and returns what
        `f(x, out=y)` returns. Without `out=`, a graph function's results are allocated
        here, once, and every `run()` overwrites and returns them.

        Every argument is checked as a call checks it (the same CallErrors); tensors must
        be C-contiguous numpy arrays (UsageError otherwise: a strided array would be
        copied once and later writes to it missed). The arrays are held until the
        prepared call goes; change their contents between runs, never their shape.
        A prepared call runs on one thread at a time (its results are shared);
        prepare one per thread. For a library's function it costs only the C entry's
        own checks and the ctypes hand-off (docs/runtime.md, "Prepared calls")."""
        if self.runtime_dims:
            raise UsageError(f"{self.name}: its results' sizes are known only after each "
                             "call; call the function instead of preparing the call")
        given = [*args, *kwargs.values()]
        outs = [] if out is None else list(out) if isinstance(out, (tuple, list)) else [out]
        for value in [*given, *outs]:
            if ctypes_abi.is_tensor(value) and not (
                    isinstance(value, np.ndarray) and value.flags.c_contiguous):
                raise UsageError(
                    f"{self.name}: prepare() takes C-contiguous numpy arrays, got "
                    f"{_describe_value(value)}; pass np.ascontiguousarray(...) and write "
                    "into that array between runs")
        out, kwargs = self._tensor_out(out, kwargs)
        values, outputs = self._checked(args, kwargs, out)
        if out is not None:
            result = out
        elif self.kind != "graph":
            result = None
        else:
            result = outputs[0] if len(outputs) == 1 and not self.tuple_result \
                else tuple(outputs)
        return PreparedCall(self._prepared_run([*values, *outputs]), result,
                            [*values, *outputs])

    def _prepared_run(self, values: list[Any]) -> Callable[[], object]:
        """What a prepared call of these checked values runs (overridden where a
        backend can pack its arguments once)."""
        return functools.partial(self._invoke, values, self._wheres)

    def actual_shapes(self, bound: Sequence[tuple[int, ...]], sizes: Mapping[str, int],
                      values: Sequence[int]) -> list[tuple[int, ...]]:
        """The results' shapes after a call: `bound` with each extent a data-dependent
        dimension sizes replaced by its text evaluated for `sizes` and the dimensions'
        `values` (in the order of "runtime_dims")."""
        env = {**sizes, **{str(d["name"]): int(v) for d, v in zip(self.runtime_dims, values)}}
        shapes = [list(b) for b in bound]
        for d in self.runtime_dims:
            for place in d.get("places", []):
                k, axis = int(place["result"]), int(place["axis"])
                shapes[k][axis] = dim_size(self.name, str(place["actual"]), env)
        return [tuple(s) for s in shapes]

    def _invoke(self, values: list[Any], wheres: list[Where]) -> list[tuple[int, ...]] | None:
        """Call the compiled code with every argument (parameters, then results); for a
        function with data-dependent sizes, return the results' actual shapes."""
        raise NotImplementedError

    def _invoke_with_flag(self, values: list[Any], wheres: list[Where],
                          flag: TerminateFlag) -> list[tuple[int, ...]] | None:
        """`_invoke` passing the terminate flag too (a function that cannot take it runs
        to its end)."""
        return self._invoke(values, wheres)

    # -------------------------------------------------------------- symbolic shapes
    def bind_symbolic(self, values: Sequence[Any]) -> dict[str, int]:
        """The dimension variables' sizes for these arguments (arrays so far; results
        when given), checked as the C entry checks them (`bind_dims`, docs/abi.md)."""
        tensors = [i for i in self._tensors
                   if i < len(values) and isinstance(values[i], np.ndarray)]
        given = {}
        for i, p in enumerate(self.params):
            if p.get("kind") == "scalar" and self._int_bounds[i] is not None \
                    and ctypes_abi.type_code_of(values[i]) == abi.ARG_INT:
                given[str(p["name"])] = (ctypes_abi.scalar_int(values[i]), i, str(p["name"]))
        return bind_dims(self.name, [(str(self._arguments[i]["name"]), self._arguments[i]["shape"])
                                     for i in tensors],
                         [values[i].shape for i in tensors], self.dims,
                         indices=tensors, given=given, nonzero=self.nonzero)

    def concrete_shape(self, i: int, sizes: Mapping[str, int]) -> tuple[int, ...]:
        """Argument i's shape for these sizes of the dimension variables."""
        return tuple(d if isinstance(d, int) else dim_size(self.name, d, sizes)
                     for d in self._arguments[i]["shape"])

    def _allocate(self, sizes: Mapping[str, int]) -> list[np.ndarray]:
        n = len(self.params)
        return [allocate_result(self.concrete_shape(n + j, sizes), dtype, self._wheres[n + j])
                for j, (_, dtype) in enumerate(self._result_layouts)]

    def output_shapes(self, *args: Any, **kwargs: Any) -> list[tuple[int, ...]]:
        """The shapes of the results for these inputs, without running the function."""
        values = self._screen(self._bind(args, kwargs), check_shapes=True)
        sizes = self.bind_symbolic(values) if self.symbolic else {}
        n = len(self.params)
        return [self.concrete_shape(n + j, sizes) for j in range(len(self.results))]

    # -------------------------------------------------------------- binding
    def _bind(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[Any]:
        n = len(self.params)
        if len(args) > n:
            raise CallError(
                f"{self.name}: expected {_plural(n, 'argument')}, got {len(args) + len(kwargs)}")
        values: list[Any] = list(args) + [_MISSING] * (n - len(args))
        for key, value in kwargs.items():
            i = self._index.get(key)
            if i is None:
                names = list(self._index)
                raise CallError(
                    f"{self.name}: unknown argument '{key}'.{suggest(key, names)} "
                    f"Parameters: {', '.join(names) if names else '(none)'}")
            if values[i] is not _MISSING:
                raise CallError(f"{self.name}: argument {i} '{key}' given twice")
            values[i] = value
        for i, (value, bounds) in enumerate(zip(values, self._int_bounds)):
            if value is _MISSING:
                raise CallError(f"{self.name}: missing argument {i} '{self.params[i]['name']}'")
            if bounds is not None and ctypes_abi.type_code_of(value) == abi.ARG_INT:
                # An integer scalar must fit its parameter's dtype (C would wrap it silently).
                ivalue = ctypes_abi.scalar_int(value)
                if not bounds[0] <= ivalue <= bounds[1]:
                    raise self._wheres[i].error(
                        f"value {ivalue} out of range for {self.params[i]['dtype']}")
        return values

    def _screen(self, values: list[Any], *, check_shapes: bool) -> list[Any]:
        """Tensor parameters as numpy views (DLPack read once), checked for byte order.

        With `check_shapes` (results about to be allocated, or symbolic sizes about to
        be bound) every tensor parameter is checked too (a tensor, its ndim, dtype,
        shape and layout), so a wrong call allocates nothing and is reported as the
        entry reports it. Without, a value that is not a tensor stays as it is: the
        compiled entry reports it.
        """
        screened = list(values)
        n = len(self.params)
        for i in self._tensors:
            if i >= n:
                break
            value = values[i]
            if not ctypes_abi.is_tensor(value):
                if check_shapes:
                    checked_tensor(value, self.params[i], self._wheres[i])  # raises, naming it
                continue
            array = ctypes_abi.to_numpy(value, self._wheres[i])
            ctypes_abi.require_dl_type(array, self._wheres[i])
            if not array.flags.c_contiguous and self._copy_ok(i):
                # A strided input (a transpose, a slice) is copied, as onnxruntime does;
                # buffers the function writes must be contiguous (they are not copied).
                array = _contiguous_copy(array, self._wheres[i])
            if check_shapes and not self._fits(i, array):
                check_tensor(array, self.params[i], self._wheres[i])  # raises, naming it
            screened[i] = array
        return screened

    def _copy_ok(self, i: int) -> bool:
        """Whether parameter i is only read, so a strided array may be copied for it. Only
        compiled libraries' signatures are trusted to say (`copies_strided_inputs`): a
        graph entry's parameters are its inputs, a tensor function marks what it writes."""
        if not self.copies_strided_inputs:
            return False
        if self.kind == "graph" and self.results:
            return True  # parameters are the inputs; the results are allocated apart
        marks = [bool(p.get("written")) for p in self.params]
        return any(marks) and not marks[i]

    def _check_written(self, values: list[Any]) -> None:
        """Refuse a read-only buffer the code writes, and one overlapping another argument.

        The compiled code writes through raw pointers: numpy's read-only flag and
        its aliasing rules are invisible to it (docs/abi.md).
        """
        if not self._written:
            return
        arrays = [(i, v) for i in self._tensors if isinstance(v := values[i], np.ndarray)]
        near = _intersecting_spans(arrays)
        for i, w in arrays:
            if i not in self._written:
                continue
            if not w.flags.writeable:
                raise self._wheres[i].error(
                    "the array is read-only but the function writes into it; pass a writable "
                    "array (e.g. a copy)")
            for j in sorted(near.get(i, ())):
                if self._in_place.get(i) == j and exact_overlap(w, values[j]):
                    continue  # the result in place of its parameter (docs/abi.md)
                if np.shares_memory(w, values[j]):
                    only = (f" (it may be argument {j}'s own buffer only: the same first byte)"
                            if self._in_place.get(i) == j else "")
                    raise self._wheres[i].error(
                        f"overlaps argument {j} '{self._wheres[j].name}' in memory; the "
                        "function writes it while reading the other, so pass distinct "
                        f"arrays{only}")

    def _fits(self, i: int, array: np.ndarray) -> bool:
        """True if `array` has argument i's shape, dtype and a contiguous layout (fast path)."""
        shape, dtype = self._layouts[i]
        return array.shape == shape and array.dtype == dtype and array.flags.c_contiguous

    @functools.cached_property
    def _layouts(self) -> dict[int, tuple[tuple[int, ...], np.dtype[Any]]]:
        """(shape, numpy dtype) of each tensor argument, by argument index."""
        return {i: (tuple(self._arguments[i]["shape"]),
                    abi.numpy_dtype(self._arguments[i]["dtype"])) for i in self._tensors}

    @functools.cached_property
    def _result_layouts(self) -> list[tuple[tuple[int, ...], np.dtype[Any]]]:
        """(shape, numpy dtype) of each result, for allocating them."""
        return [(tuple(r["shape"]), abi.numpy_dtype(r["dtype"])) for r in self.results]

    def _outputs(self, out: Any) -> list[np.ndarray]:
        """Result arrays: freshly allocated, or the caller's `out=` after checking them."""
        n = len(self.params)
        if out is None:
            return [allocate_result(shape, dtype, self._wheres[n + j])
                    for j, (shape, dtype) in enumerate(self._result_layouts)]
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        if len(outs) != len(self.results):
            raise CallError(
                f"{self.name}: out= has {len(outs)} arrays; the function has "
                f"{_plural(len(self.results), 'result')}")
        checked = []
        for j, (arr, r) in enumerate(zip(outs, self.results)):
            where = self._wheres[n + j]
            if not ctypes_abi.is_tensor(arr):
                raise where.error(f"out= needs arrays, got {type(arr).__name__}")
            array = ctypes_abi.to_numpy(arr, where)
            ctypes_abi.require_dl_type(array, where)
            array = check_tensor(array, r, where)
            if not array.flags.writeable:
                raise where.error("the out= array is read-only")
            checked.append(array)
        for j, array in enumerate(checked):
            for k in range(j):
                if np.shares_memory(array, checked[k]):
                    raise self._wheres[n + j].error(
                        f"the out= array overlaps out= array {k} in memory")
        return checked

    # -------------------------------------------------------------- description
    def __repr__(self) -> str:
        params = ", ".join(_describe_param(p) for p in self.params)
        text = f"{self.name}({params})"
        if self.results:
            text += " -> " + ", ".join(_describe_param(r) for r in self.results)
        return f"<{type(self).__name__} {text}>"


def _describe_value(value: object) -> str:
    if isinstance(value, np.ndarray):
        return "a strided numpy array"
    return f"a {type(value).__name__}"


def _run_packed(run: Callable[[Any, Any, int], None], packed: Any, codes: Any, n: int,
                keep: object) -> None:
    """`run` on arguments packed once; `keep` (their owners) lives as long as the partial."""
    run(packed, codes, n)


class PreparedCall:
    """A function's call on fixed arrays, checked once (`PackedFunction.prepare`):
    `run()` calls it again and returns its results (the same arrays every time)."""

    __slots__ = ("_arrays", "_result", "_run")

    def __init__(self, run: Callable[[], object], result: Any, arrays: list[Any]) -> None:
        self._run = run
        self._result = result
        self._arrays = arrays  # the buffers the packed arguments point into

    def __call__(self) -> Any:
        self._run()
        return self._result

    def __repr__(self) -> str:
        return f"<PreparedCall of {len(self._arrays)} arguments>"


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


_MISSING: Any = _Missing()
_SLOW: Any = _Missing()  # the fast path declines; take the general one


class SymbolicSizes:
    """The fast path's view of a signature with symbolic dimensions: each variable read
    from its first plain occurrence among the inputs, and the shapes every argument then
    has. `shapes` answers None for anything else (a size that disagrees, out of its
    bounds, a missing rank): the general path then reports it with the entry's text.
    Everything that does not depend on the call is worked out here, once (a tiny
    model's call costs little more than these few lookups)."""

    def __init__(self, params: Sequence[Mapping[str, Any]], results: Sequence[Mapping[str, Any]],
                 bounds: Mapping[str, tuple[int, int | None]],
                 nonzero: Sequence[tuple[str, str]] = ()) -> None:
        first: dict[str, tuple[int, int]] = {}
        for i, p in enumerate(params):
            for axis, d in enumerate(p["shape"]):
                if isinstance(d, str) and d.isidentifier():
                    first.setdefault(d, (i, axis))
        self.first = list(first.items())
        self.bounds = [(name, low, high) for name, (low, high) in bounds.items()]
        # the sizes the model divides by (bind_dims' `nonzero`): a 0 among them is the
        # general path's to report, as the C entry would
        self.nonzero = [compile_dim_text(text) for text, _ in nonzero]
        # each argument's shape: the tuple itself when static, else its dims' sizes
        self.dims: list[tuple[int, ...] | list[Any]] = [
            tuple(p["shape"]) if all(isinstance(d, int) for d in p["shape"])
            else [d if isinstance(d, int) else compile_dim_text(d) for d in p["shape"]]
            for p in (*params, *results)]
        # Arguments declared with the same shape (a decoder's ~50 pasts, its presents)
        # share one evaluation per call: `kinds` the distinct shapes' dims, `kind_of` each
        # argument's index among them.
        declared = [tuple(p["shape"]) for p in (*params, *results)]
        first_of = {shape: declared.index(shape) for shape in reversed(declared)}
        order = list(dict.fromkeys(first_of[shape] for shape in declared))
        self.kinds = [self.dims[i] for i in order]
        self.kind_of = [order.index(first_of[shape]) for shape in declared]
        #: (argument, axis) of every symbolic dimension: what a call writes into the
        #: prebuilt DLTensors' shapes (`ArgumentSlots.set_sizes`)
        self.symbolic_axes = [(i, axis) for i, dims in enumerate(self.dims)
                              if not isinstance(dims, tuple)
                              for axis, d in enumerate(dims) if not isinstance(d, int)]

    def shapes(self, args: Sequence[Any]) -> list[tuple[int, ...]] | None:
        sizes: dict[str, int] = {}
        try:
            for name, (i, axis) in self.first:
                sizes[name] = args[i].shape[axis]
        except (AttributeError, IndexError):
            return None
        for name, low, high in self.bounds:
            size = sizes.get(name)
            if size is None or size < low or (high is not None and size > high):
                return None
        try:
            kinds = [dims if isinstance(dims, tuple)
                     else tuple(d if isinstance(d, int) else d(sizes) for d in dims)
                     for dims in self.kinds]
            if any(size(sizes) <= 0 for size in self.nonzero):
                return None
        except CallError:
            return None
        shapes = [kinds[k] for k in self.kind_of]
        for a, s in zip(args, shapes):
            if getattr(a, "shape", None) != s:
                return None
        return shapes


def _fits_exactly(array: Any, layout: tuple[tuple[int, ...], np.dtype[Any]]) -> bool:
    """A numpy array of exactly this shape and dtype (native byte order), C-contiguous."""
    return (isinstance(array, np.ndarray) and array.shape == layout[0]
            and array.dtype == layout[1] and array.flags.c_contiguous)


def _any_written_overlap(addresses: list[int], sizes: list[int], first_written: int) -> bool:
    """Whether a written buffer (index >= first_written) overlaps any other one.

    The buffers are contiguous, so overlapping byte ranges mean shared memory. One sweep
    over the ranges sorted by start (a decoder's step writes ~50 results among ~100
    arguments, too many to test pair by pair): a range overlaps an earlier one exactly
    when it starts before the furthest end so far, so tracking that end over all ranges
    and over the written ones finds every overlap involving a written buffer (inputs may
    overlap each other).
    """
    spans = sorted((a, a + n, i >= first_written)
                   for i, (a, n) in enumerate(zip(addresses, sizes)) if n)
    end_any = end_written = 0
    for start, end, written in spans:
        if start < (end_any if written else end_written):
            return True
        end_any = max(end_any, end)
        if written:
            end_written = max(end_written, end)
    return False


def _nbytes(shape: Sequence[int], dtype: np.dtype[Any]) -> int:
    """Bytes an array of `shape` and `dtype` takes, in Python ints (never wraps)."""
    return math.prod(int(d) for d in shape) * dtype.itemsize


def _why_not(exc: BaseException) -> str:
    """Why numpy refused an allocation: memory ran out, or the size is past what one
    array can hold (numpy's ValueError; its wording changes between versions)."""
    return "not enough memory" if isinstance(exc, MemoryError) else "too large for an array"


def allocate_result(shape: Sequence[int], dtype: np.dtype[Any], where: Where) -> np.ndarray:
    """An uninitialised result array; CallError naming the result when numpy cannot
    allocate it (no memory, or a size beyond what an array can address)."""
    try:
        return np.empty(tuple(shape), dtype)
    except (MemoryError, ValueError, OverflowError) as exc:
        raise where.error(
            f"cannot allocate the result: shape {ctypes_abi.format_shape(shape)} of "
            f"{dtype.name} is {_nbytes(shape, dtype)} bytes ({_why_not(exc)})") from None


def _intersecting_spans(arrays: Sequence[tuple[int, np.ndarray]]) -> dict[int, list[int]]:
    """For each argument index of `arrays`, the others whose byte ranges intersect its own
    (`np.may_share_memory`'s bounds test), by one sweep over the ranges sorted by start:
    a decoder's step passes ~100 arrays, and testing every written one against every
    other pair by pair cost more than a millisecond a call."""
    spans = []
    for i, a in arrays:
        lo, hi = byte_bounds(a)
        if lo < hi:  # an empty array shares nothing
            spans.append((lo, hi, i))
    spans.sort()
    near: dict[int, list[int]] = {}
    open_spans: list[tuple[int, int]] = []  # (end, index) of the ranges not passed yet
    for lo, hi, i in spans:
        open_spans = [(end, j) for end, j in open_spans if end > lo]
        for _, j in open_spans:
            near.setdefault(i, []).append(j)
            near.setdefault(j, []).append(i)
        open_spans.append((hi, i))
    return near


def _contiguous_copy(array: np.ndarray, where: Where) -> np.ndarray:
    """A C-contiguous copy of a strided input; CallError naming it when it cannot be made."""
    try:
        return np.ascontiguousarray(array)
    except (MemoryError, ValueError) as exc:
        raise where.error(
            f"cannot copy the strided array into a contiguous one of "
            f"{_nbytes(array.shape, array.dtype)} bytes ({_why_not(exc)}); pass a contiguous "
            "array") from None


def check_tensor(array: np.ndarray, param: Mapping[str, Any], where: Where) -> np.ndarray:
    """docs/abi.md checks 3-4 on a CPU array (ndim, dtype, shape, contiguity); a symbolic
    shape is left to `bind_dims`, which checks it once the variables are bound."""
    shape = list(param["shape"])
    if array.ndim != len(shape):
        raise where.error(f"expected {_plural(len(shape), 'dimension')}, got {array.ndim}")
    got = ctypes_abi.array_dtype_name(array)
    if got != param["dtype"]:
        raise where.error(f"expected dtype {param['dtype']}, got {got}")
    symbolic = any(isinstance(d, str) for d in shape)
    if not symbolic and list(array.shape) != shape:
        raise where.error(
            f"expected shape {ctypes_abi.format_shape(shape)}, "
            f"got {ctypes_abi.format_shape(array.shape)}")
    if not array.flags.c_contiguous:
        raise where.error("expected a contiguous tensor")
    return array


class NativeFunction(PackedFunction):
    """A packed C entry `{prefix}name` (KilnPackedFunc), called through ctypes.

    The entry checks every argument; a non-zero return raises `CallError` with
    the entry's message from `last_error()`. `owner` (the library) is kept alive;
    `guard` (its CallGuard) makes `close()` wait for calls in flight, and calls
    after it raise CallError.
    """

    copies_strided_inputs = True

    def __init__(
        self, signature: Mapping[str, Any], c_func: Any,
        last_error: Callable[[], str] | None = None, *, owner: Any = None,
        guard: CallGuard | None = None,
    ) -> None:
        super().__init__(signature)
        self.c_func = c_func
        self.last_error = last_error
        self.owner = owner
        self.guard = guard
        # The fast path: a graph function taking only tensors, none of its parameters
        # written.
        self._slot_pool: SlotPool | None = None
        self._sizes: SymbolicSizes | None = None
        # Data-dependent sizes: the (argument, axis) extents the entry writes back into
        # the prebuilt DLTensors, which each call resets to the bound first.
        self._runtime_axes: list[tuple[int, int]] = sorted(
            {(len(self.params) + int(place["result"]), int(place["axis"]))
             for d in self.runtime_dims for place in d.get("places", [])})
        if (self.kind == "graph" and self.results and not self._written - self._results_set
                and all(p.get("kind") == "tensor" for p in self._arguments)):
            # symbolic dimensions: placeholders the call overwrites with its sizes
            self._slot_pool = SlotPool([(tuple(d if isinstance(d, int) else 0
                                               for d in p["shape"]), str(p["dtype"]))
                                        for p in self._arguments])
            if self.symbolic:
                self._sizes = SymbolicSizes(self.params, self.results, self.dims, self.nonzero)

    @functools.cached_property
    def _n_params(self) -> int:
        return len(self.params)

    @functools.cached_property
    def _param_layouts(self) -> tuple[tuple[tuple[int, ...], np.dtype[Any]], ...]:
        """(shape, numpy dtype) of each parameter (all tensors on the fast path)."""
        layouts = self._layouts
        return tuple(layouts[i] for i in range(len(self.params)))

    @functools.cached_property
    def _results_set(self) -> frozenset[int]:
        return frozenset(range(len(self.params), len(self._arguments)))

    def _call(self, args: tuple[Any, ...], out: Any, kwargs: dict[str, Any],
              flag: TerminateFlag | None) -> Any:
        if self._slot_pool is not None and not kwargs:
            result = self._call_fast(args, out, flag)
            if result is not _SLOW:
                return result
        # Anything unusual (keywords, a wrong or strided tensor, a DLPack object):
        # the general path, which checks everything and names what is wrong.
        return super()._call(args, out, kwargs, flag)

    def _call_fast(self, args: tuple[Any, ...], out: Any, flag: TerminateFlag | None) -> Any:
        """Call with prebuilt arguments when every tensor fits the signature exactly
        (numpy array, shape, native dtype, C-contiguous; `out=` also writable and apart
        from the others); `_SLOW` (nothing done) otherwise."""
        if len(args) != self._n_params:
            return _SLOW
        shapes: list[tuple[int, ...]] | None = None
        params: Sequence[tuple[tuple[int, ...], np.dtype[Any]]]
        results: Sequence[tuple[tuple[int, ...], np.dtype[Any]]]
        symbolic = self._sizes
        if symbolic is None:
            params, results = self._param_layouts, self._result_layouts
        else:  # this call's layouts, if its arguments are valid
            shapes = symbolic.shapes(args)
            if shapes is None:
                return _SLOW
            layouts = [(shape, layout[1]) for shape, layout in
                       zip(shapes, (*self._param_layouts, *self._result_layouts))]
            params, results = layouts[:self._n_params], layouts[self._n_params:]
        addresses = []
        for array, layout in zip(args, params):
            if not _fits_exactly(array, layout):
                return _SLOW
            addresses.append(data_address(array))
        if out is None:
            outputs = [allocate_result(shape, dtype, self._wheres[self._n_params + j])
                       for j, (shape, dtype) in enumerate(results)]
            addresses.extend(map(data_address, outputs))
        else:
            outputs = list(out) if isinstance(out, (tuple, list)) else [out]
            if len(outputs) != len(results):
                return _SLOW
            for array, layout in zip(outputs, results):
                if not (_fits_exactly(array, layout) and array.flags.writeable):
                    return _SLOW
                addresses.append(data_address(array))
            sizes = [a.nbytes for a in (*args, *outputs)]
            if self._in_place:
                drop_in_place(self._in_place, addresses, sizes)
            if _any_written_overlap(addresses, sizes, self._n_params):
                return _SLOW  # the general path names the overlap
        pool = self._slot_pool
        assert pool is not None
        slots = pool.take()
        try:
            if symbolic is not None and shapes is not None:
                slots.set_sizes(shapes, symbolic.symbolic_axes)
            if self._runtime_axes:  # the last call wrote its actual extents there
                slots.set_sizes([layout[0] for layout in (*params, *results)],
                                self._runtime_axes)
            slots.set_data(addresses)
            self._run(slots.values, slots.codes, slots.count + slots.set_flag(
                flag.address if flag is not None and self.terminable else None))
            if self._runtime_axes:  # views of the bound-sized buffers, as the general path
                outputs = [o if o.shape == (s := slots.shape_of(self._n_params + j))
                           else trim_result(o, s) for j, o in enumerate(outputs)]
        finally:
            pool.give_back(slots)
        if self._in_place and out is not None:
            check_shapes(self.name, self._in_place, args, outputs, self._result_names)
        if out is not None and not self._runtime_axes:
            return out
        if len(outputs) == 1 and not self.tuple_result:
            return outputs[0]
        return tuple(outputs)

    def output_shapes(self, *args: Any, **kwargs: Any) -> list[tuple[int, ...]]:
        """The shapes of the results for these inputs, without running the function: by
        the fast path's shape evaluation when the inputs fit it (a generation loop asks
        every step, for its `out=` arrays), else checked as the general path checks."""
        if self._sizes is not None and not kwargs and len(args) == self._n_params:
            shapes = self._sizes.shapes(args)
            if shapes is not None and all(
                    _fits_exactly(a, (s, layout[1]))
                    for a, s, layout in zip(args, shapes, self._param_layouts)):
                return shapes[self._n_params:]
        return super().output_shapes(*args, **kwargs)

    def _prepared_run(self, values: list[Any]) -> Callable[[], object]:
        """Arguments packed once, into slots of this prepared call's own: all tensors
        (checked contiguous numpy arrays) as the fast path packs them, else the general
        packing, kept with its owners."""
        if self._slot_pool is None:
            packed, codes, keep = ctypes_abi.pack_arguments(values, self._wheres)
            return functools.partial(_run_packed, self._run, packed, codes, len(values), keep)
        slots = ArgumentSlots([(tuple(a.shape), str(p["dtype"]))
                               for a, p in zip(values, self._arguments)])
        slots.set_data([ctypes_abi.data_address(a) for a in values])
        return functools.partial(_run_packed, self._run, slots.values, slots.codes, slots.count,
                                 slots)

    def _run(self, args: Any, codes: Any, n: int) -> None:
        """Call the C entry on packed arguments; CallError with its message if it fails."""
        guard = self.guard
        if guard is not None:
            guard.enter(self.name)
        try:
            rc = self.c_func(args, codes, n)
            # Read on this thread, before close() may unload the library.
            message = _error_text(self.name, rc, self.last_error) if rc != 0 else ""
        finally:
            if guard is not None:
                guard.exit()
        if rc != 0:
            raise CallError(message)

    def _invoke(self, values: list[Any], wheres: list[Where]) -> list[tuple[int, ...]] | None:
        return self._invoke_flagged(values, wheres, None)

    def _invoke_with_flag(self, values: list[Any], wheres: list[Where],
                          flag: TerminateFlag) -> list[tuple[int, ...]] | None:
        return self._invoke_flagged(values, wheres, flag)

    def _invoke_flagged(self, values: list[Any], wheres: list[Where],
                        flag: TerminateFlag | None) -> list[tuple[int, ...]] | None:
        spare = int(flag is not None)  # the flag rides after the arguments
        args, codes, keep = ctypes_abi.pack_arguments(values, wheres, spare=spare)
        if flag is not None:
            args[len(values)].v_handle = flag.address
            codes[len(values)] = abi.ARG_HANDLE
        self._run(args, codes, len(values) + spare)
        actual = None
        if self.runtime_dims:  # the entry wrote the actual extents into the DLTensors
            n = len(self.params)
            actual = [ctypes_abi.tensor_shape(args[n + j].v_handle)
                      for j in range(len(self.results))]
        del keep  # the tensors' owners had to live through the call
        return actual


class RawKernelFunction(PackedFunction):
    """A raw kernel `int32_t k(T0 *p0, ..., S0 s0, ...)` at `address`, called via ctypes.

    The kernel checks nothing, so this wrapper performs the packed entry's checks
    (docs/abi.md) in Python first, with the same messages. A kernel reports a
    failure only by its return code: `error_message(code)` spells it (else a
    generic message names the code). `keepalive` holds
    whatever owns the code (e.g. an LLVM execution engine); `guard`, if given,
    is its CallGuard: the owner's `close()` waits for running calls and later
    calls raise CallError.
    """

    def __init__(
        self, signature: Mapping[str, Any], address: int,
        error_message: Callable[[int], str] | None = None, *, keepalive: Any = None,
        guard: CallGuard | None = None,
    ) -> None:
        super().__init__(signature)
        self.guard = guard
        if not address:
            raise CallError(f"{self.name}: raw kernel address is NULL")
        self.address = address
        self.error_message = error_message
        self.keepalive = keepalive
        argtypes = [ctypes.c_void_p if p["kind"] == "tensor"
                    else ctypes_abi.CTYPES_BY_DTYPE[p["dtype"]] for p in self._arguments]
        # Then the values of its data-dependent dimensions (an int64 buffer), and its
        # dimension variables last, sorted by name.
        argtypes += [ctypes.c_void_p] * bool(self.runtime_dims)
        argtypes += [ctypes.c_int64] * len(self.dims)
        self._c_func = ctypes.CFUNCTYPE(ctypes.c_int32, *argtypes)(address)

    def _invoke(self, values: list[Any], wheres: list[Where]) -> list[tuple[int, ...]] | None:
        c_args: list[Any] = []
        keep: list[np.ndarray] = []
        arguments = self._arguments
        sizes: dict[str, int] = {}
        if self.symbolic:  # the entry's checks with the shapes these sizes give
            for i in self._tensors:
                checked_tensor(values[i], arguments[i], wheres[i])  # before any shape
            sizes = self.bind_symbolic([ctypes_abi.to_numpy(v, w) if ctypes_abi.is_tensor(v) else v
                                        for v, w in zip(values, wheres)])
            arguments = [dict(p, shape=list(self.concrete_shape(i, sizes)))
                         if p["kind"] == "tensor" else p for i, p in enumerate(arguments)]
        for value, param, where in zip(values, arguments, wheres):
            if param["kind"] == "tensor":
                array = checked_tensor(value, param, where)
                keep.append(array)
                c_args.append(array.__array_interface__["data"][0])
            else:
                c_args.append(checked_scalar(value, param, where))
        runtime = np.zeros(len(self.runtime_dims), np.int64)
        if self.runtime_dims:
            c_args.append(runtime.ctypes.data)
        c_args += [sizes[name] for name in sorted(self.dims)]
        guard = self.guard
        if guard is not None:
            guard.enter(self.name)
        try:
            rc = self._c_func(*c_args)
        finally:
            if guard is not None:
                guard.exit()
        del keep
        if rc != 0:
            message = self.error_message(rc) if self.error_message is not None else ""
            raise CallError(message or f"{self.name}: failed with code {rc} (no error message)")
        if not self.runtime_dims:
            return None
        n = len(self.params)
        bound = [tuple(arguments[n + j]["shape"]) for j in range(len(self.results))]
        return self.actual_shapes(bound, sizes, [int(v) for v in runtime])


def trim_result(array: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    """The first elements of a result buffer allocated at its bound, as an array of its
    actual `shape` (a view: the kernels write the actual result compactly from the start)."""
    count = math.prod(shape)
    if count > array.size:
        raise CallError(f"the call reported shape {tuple(shape)}, larger than its buffer of "
                        f"shape {array.shape}")
    return array.reshape(-1)[:count].reshape(tuple(shape))


def checked_tensor(value: Any, param: Mapping[str, Any], where: Where) -> np.ndarray:
    """All of a packed entry's checks on a tensor argument; its numpy view (no copy)."""
    check_type_code(ctypes_abi.type_code_of(value), param, where, value)
    if value is None:
        raise where.error("expected a tensor, got NULL")
    array = ctypes_abi.to_numpy(value, where)
    ctypes_abi.require_dl_type(array, where)  # what NativeFunction's conversion would reject
    return check_tensor(array, param, where)


def check_type_code(code: int | None, param: Mapping[str, Any], where: Where,
                     value: Any) -> None:
    """Check 2 of docs/abi.md: the value's type code fits the parameter."""
    if code is None:
        raise where.error(
            f"cannot pass {type(value).__name__}; expected a numpy array, a DLPack tensor "
            "or a number")
    if param["kind"] == "tensor":
        if code != abi.ARG_DLTENSOR:
            raise where.error(f"expected a tensor (type code {abi.ARG_DLTENSOR}), "
                              f"got type code {code}")
    elif abi.is_float_dtype(param["dtype"]):
        if code not in (abi.ARG_FLOAT, abi.ARG_INT):
            raise where.error(f"expected a float scalar (type code {abi.ARG_FLOAT}), "
                              f"got type code {code}")
    elif code != abi.ARG_INT:
        raise where.error(f"expected an integer scalar (type code {abi.ARG_INT}), "
                          f"got type code {code}")


def checked_scalar(value: Any, param: Mapping[str, Any], where: Where) -> Any:
    """The C value of a scalar argument (range was checked while binding)."""
    check_type_code(ctypes_abi.type_code_of(value), param, where, value)
    dtype = param["dtype"]
    if dtype == "float16":
        return int(np.array(float(value), np.float16).view(np.uint16))
    if dtype == "bfloat16":
        return _bfloat16_bits(float(value))
    if abi.is_float_dtype(dtype):
        return float(value)
    return ctypes_abi.scalar_int(value)


# Older spellings, kept for callers outside the runtime.
_checked_tensor = checked_tensor
_check_type_code = check_type_code
_checked_scalar = checked_scalar


def _bfloat16_bits(value: float) -> int:
    """Bit pattern of `value` as bfloat16 (round to nearest even; NaN stays NaN)."""
    bits = int(np.array(value, np.float32).view(np.uint32))
    if value != value:
        return 0x7FC0
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF


def _error_text(name: str, rc: int, last_error: Callable[[], str] | None) -> str:
    message = last_error() if last_error is not None else ""
    return message or f"{name}: failed with code {rc} (no error message)"
