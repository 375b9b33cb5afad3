"""Where a constant came from: its replay program over the model's named weights.

`Module.swap_weights` (docs/runtime.md, "Swapping weights") installs new weights into a
compiled library without the compiler, so the library must say, for every constant it
holds, how to rebuild it from the model's named weights (the ONNX initializers). The
passes that make a constant out of others (folding a transpose, packing a GEMM's B into
register-tile panels) record here what they did, as a small program of exact steps over
the initializers; the constant pool writes those programs into the library
(docs/format.md, "The replay record") and the runtime runs them with numpy.

The record is kept beside the arrays, not in the IR: an array is keyed by identity (a
weak reference guards against a reused id), since `Constant` and `AllocConst` hold the
very array the pool stores. An array with no record is *unknown*, and a library holding
one refuses to swap (never a silent wrong answer); a constant that depends on no weight
(a literal the compiler made) is recorded as `LITERAL`.

The steps (the runtime's evaluator, kiln.runtime.swap, implements the same names):
`transpose` (`perm`), `reshape` (`shape`), `astype` (`dtype`: a numpy dtype name),
`pad` (`widths`: zeros before and after, per axis), `broadcast_to` (`shape`) and
`slice` (`bounds`: numpy's start, stop and step per axis): index maps or exact
conversions.
`Apply` is numpy arithmetic (`APPLY_FUNCTIONS`) on several operands, as the operators'
numpy references compute it (16-bit floats widened to float32, the result cast to
`dtype`), e.g. batch-norm statistics folded into a scale and a shift, or a Winograd
filter transform; its literal operands travel as values (`Value`, `Full`). The same
numpy on the same operands gives the same bits; a product (`dot`) may sum in another
order on another host's BLAS, within float rounding.
"""

from __future__ import annotations

import hashlib
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.errors import IRError

STEPS = ("transpose", "reshape", "astype", "pad", "broadcast_to", "slice")
# The numpy functions `Apply` may name.
APPLY_FUNCTIONS = ("add", "subtract", "multiply", "divide", "sqrt", "dot", "take")
# A literal operand of `Apply` larger than this many elements is not written out: the
# constant it makes is opaque.
VALUE_LIMIT = 1 << 16
# The module attribute where the ONNX importer lists the model's named weights
# (`table_row` each), for the replay record.
ATTR_WEIGHTS = "kiln.weights"
# A named weight the library does not rebuild is checked against its SHA-256 when a swap
# gives it: recorded up to this size, and for every weight read into the code (a larger
# one that no constant uses has none: a swap must leave it out).
HASHED_BYTES = 1 << 20


@dataclass(frozen=True)
class Weight:
    """A named weight of the model (an ONNX initializer) as the importer read it."""

    name: str
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Step:
    """One exact step (`STEPS`) applied to `source`, with its parameters."""

    op: str
    source: Origin
    params: tuple[tuple[str, Any], ...]


@dataclass(frozen=True)
class Apply:
    """numpy's `fn` (`APPLY_FUNCTIONS`) on `args`, the result cast to `dtype`."""

    fn: str
    args: tuple[Origin, ...]
    dtype: str
    params: tuple[tuple[str, Any], ...] = ()  # keyword arguments (take: axis)


@dataclass(frozen=True)
class Value:
    """A literal operand written out: its values (C order), dtype and shape."""

    values: tuple[Any, ...]
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Full:
    """A literal operand of one value everywhere."""

    fill: float
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Literal:
    """A constant that depends on no weight: kept as compiled."""


@dataclass(frozen=True)
class Opaque:
    """A constant made from weights by a transform that cannot be replayed (`why`)."""

    why: str


Origin = Weight | Step | Apply | Value | Full | Literal | Opaque
LITERAL = Literal()

_TABLE: dict[int, tuple[weakref.ref[np.ndarray], Origin]] = {}
_LOCK = threading.Lock()
# Keys of arrays that died, dropped from _TABLE by the next caller holding _LOCK. A
# weakref callback runs wherever the collector frees the array, which may be inside
# `record` on this thread with _LOCK held (the tuple it builds starts a collection):
# taking the lock there would deadlock.
_DEAD: list[int] = []


def _forget(key: int) -> Any:
    def drop(_ref: object) -> None:
        _DEAD.append(key)  # atomic; no lock (above)
    return drop


def _purge() -> None:
    """Drop the entries of dead arrays (`_DEAD`); the caller holds _LOCK."""
    while _DEAD:
        key = _DEAD.pop()
        entry = _TABLE.get(key)
        if entry is not None and entry[0]() is None:
            del _TABLE[key]


def record(data: np.ndarray, origin: Origin | None) -> np.ndarray:
    """Note that the array `data` (the one a Constant holds) is `origin`; returns `data`.

    A literal never replaces a known origin: a converter that wraps a weight's own
    array as a new constant keeps the weight's. None (unknown) records nothing."""
    if origin is None:
        return data
    if not isinstance(origin, Opaque) and not leaves(origin):
        origin = LITERAL  # depends on no weight: kept as compiled
    key = id(data)
    with _LOCK:
        _purge()
        old = _TABLE.get(key)
        if isinstance(origin, Literal) and old is not None and old[0]() is data:
            return data
        _TABLE[key] = (weakref.ref(data, _forget(key)), origin)
    return data


def origin_of(data: object) -> Origin | None:
    """The recorded origin of this very array object, or None (unknown)."""
    with _LOCK:
        entry = _TABLE.get(id(data))
    if entry is None or entry[0]() is not data:
        return None
    return entry[1]


def weight(name: str, data: np.ndarray) -> Weight:
    """The origin of initializer `name` read as `data`."""
    return Weight(name, data.dtype.name, tuple(int(d) for d in data.shape))


def step(op: str, source: Origin | None, **params: Any) -> Origin | None:
    """`op` applied to `source`: literal, opaque or unknown (None) in, the same out."""
    if op not in STEPS:
        raise IRError(f"unknown replay step {op!r}; known: {', '.join(STEPS)}")
    if source is None or isinstance(source, (Literal, Opaque)):
        return source
    return Step(op, source, tuple(sorted(params.items())))


def operand(data: np.ndarray) -> Origin | None:
    """The origin of `data` as an operand of `Apply`: its record, a literal's values
    written out (`Value`; opaque above `VALUE_LIMIT` elements), None if unknown."""
    origin = origin_of(data)
    if not isinstance(origin, Literal):
        return origin
    if data.size > VALUE_LIMIT:
        return Opaque(f"a literal of {data.size} elements combined with weights")
    return value(data)


def value(data: Any) -> Value:
    """`data` written out as a literal operand."""
    arr = np.asarray(data)
    return Value(tuple(arr.reshape(-1).tolist()), arr.dtype.name,
                 tuple(int(d) for d in arr.shape))


def apply(fn: str, sources: Sequence[Origin | None], dtype: Any, **params: Any
          ) -> Origin | None:
    """numpy's `fn` on `sources` (and keywords `params`), cast to `dtype`: None if any is
    unknown, the first opaque one if any is opaque."""
    if fn not in APPLY_FUNCTIONS:
        raise IRError(f"unknown replay function {fn!r}; known: {', '.join(APPLY_FUNCTIONS)}")
    for s in sources:
        if s is None or isinstance(s, Opaque):
            return s
    assert not any(isinstance(s, Literal) for s in sources), "operands must be operand()s"
    return Apply(fn, tuple(s for s in sources if s is not None), np.dtype(dtype).name,
                 tuple(sorted(params.items())))


def padded(source: Origin | None, shape: Sequence[int], axis: int, size: int
           ) -> Origin | None:
    """`source` (of `shape`) zero-padded at the end of `axis` to `size`."""
    widths = [(0, 0)] * len(shape)
    widths[axis] = (0, size - int(shape[axis]))
    return step("pad", source, widths=tuple(widths))


def first(source: Origin | None, counts: Sequence[int]) -> Origin | None:
    """The first `counts[k]` elements of `source` along each axis k."""
    return step("slice", source, bounds=tuple((0, int(n), 1) for n in counts))


def pack_panels(source: Origin | None, shape: Sequence[int], nr: int) -> Origin | None:
    """`kiln.ops.gemm.pack_b` as steps: B `[K, N]` -> `[ceil(N / nr)][K][nr]`, zero padded."""
    k, n = (int(d) for d in shape)
    panels = -(-n // nr)
    blocks = step("reshape", padded(source, (k, n), 1, panels * nr), shape=(k, panels, nr))
    return step("transpose", blocks, perm=(1, 0, 2))


def combine(sources: Sequence[Origin | None], why: str) -> Origin | None:
    """The origin of a value computed from `sources` by a step that has no replay: LITERAL
    when every source is one, None when any is unknown, else Opaque(`why`)."""
    if any(s is None for s in sources):
        return None
    if all(isinstance(s, Literal) for s in sources):
        return LITERAL
    return Opaque(why)


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    return value


def to_json(origin: Origin | None) -> dict[str, Any]:
    """The replay record of one constant (docs/format.md, "The replay record")."""
    if origin is None:
        return {"unknown": "made by a transform that records no replay"}
    if isinstance(origin, Literal):
        return {"literal": True}
    if isinstance(origin, Opaque):
        return {"unknown": origin.why}
    if isinstance(origin, Weight):
        return {"weight": origin.name}
    if isinstance(origin, Value):
        return {"value": list(origin.values), "dtype": origin.dtype, "shape": list(origin.shape)}
    if isinstance(origin, Full):
        return {"full": origin.fill, "dtype": origin.dtype, "shape": list(origin.shape)}
    if isinstance(origin, Apply):
        return {"op": "apply", "fn": origin.fn, "dtype": origin.dtype,
                "args": [to_json(a) for a in origin.args],
                **{k: _jsonable(v) for k, v in origin.params}}
    out: dict[str, Any] = {"op": origin.op, "x": to_json(origin.source)}
    out.update({k: _jsonable(v) for k, v in origin.params})
    return out


def table_row(name: str, data: np.ndarray, baked: bool) -> tuple[Any, ...]:
    """One named weight for `ATTR_WEIGHTS`: (name, dtype, shape, baked, sha256 or None).

    `baked`: the import read its value into the graph's structure (an axis, a shape), so
    a swap must give it unchanged."""
    digest = None
    if data.nbytes <= HASHED_BYTES or baked:
        digest = hashlib.sha256(np.ascontiguousarray(data).tobytes()).hexdigest()
    return (name, data.dtype.name, tuple(int(d) for d in data.shape), baked, digest)


def leaves(origin: Origin | None) -> list[Weight]:
    """The weights `origin` reads."""
    out: list[Weight] = []
    todo = [origin]
    while todo:
        o = todo.pop()
        if isinstance(o, Step):
            todo.append(o.source)
        elif isinstance(o, Apply):
            todo.extend(o.args)
        elif isinstance(o, Weight):
            out.append(o)
    return out


__all__ = ["APPLY_FUNCTIONS", "ATTR_WEIGHTS", "HASHED_BYTES", "LITERAL", "STEPS",
           "VALUE_LIMIT", "Apply", "Full", "Literal", "Opaque", "Origin", "Step", "Value",
           "Weight", "apply", "combine", "first", "leaves", "operand", "origin_of",
           "pack_panels", "padded",
           "record", "step", "table_row", "to_json", "value", "weight"]
