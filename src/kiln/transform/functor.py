"""Rewrites the graph passes share: `rewrite_calls`, and `SharedPacking` for the passes
that pack weights at compile time.

The analyses they share (`graph_vars_used`, `var_use_counts`, ...) live in
`kiln.ir.analysis.graph_uses`; the walking itself in `kiln.ir.visitor`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kiln.ir import graph as g
from kiln.kernels.specialisation import naming


def rewrite_calls(fn: g.Function, rewrite: Callable[[g.Call], g.Expr | None]) -> g.Function:
    """`fn` with each binding whose value is an operator call replaced by `rewrite(call)`
    when that is not None (the same object when nothing changed)."""
    bindings: list[g.Binding] = []
    changed = False
    for b in fn.bindings:
        if isinstance(b.value, g.Call):
            with naming(b.var):  # a generic kernel is reported by the value's name
                new = rewrite(b.value)
        else:
            new = None
        if new is None:
            bindings.append(b)
        else:
            bindings.append(g.Binding(b.var, new))
            changed = True
    if not changed:
        return fn
    return g.Function(fn.params, tuple(bindings), fn.result, dict(fn.attrs))


class SharedPacking:
    """A packing pass's `rewrite` (a call -> its kernel's call on weights packed at compile
    time) whose calls of one weight share one packed copy.

    Packing is per call, so calls that read the same weight (the steps of an unrolled
    recurrent op all read its R) would each get their own copy: the library would hold
    one per call, and each call would stream its own from memory instead of finding the
    one the previous call left in cache. So a packed constant equal to one made before at
    the same argument position of the same op is replaced by that one. Equal values are
    the test, not the source constants: the other arguments of such calls (a quantized
    step's scale and bias) may be new constants each time. Candidates are found by a
    sample of their values (`_sample`), then compared whole, bit for bit.
    """

    def __init__(self, rewrite: Callable[[g.Call], g.Expr | None]) -> None:
        self._rewrite = rewrite
        self._made: dict[tuple[object, ...], list[g.Constant]] = {}

    def __call__(self, call: g.Call) -> g.Expr | None:
        new = self._rewrite(call)
        if not isinstance(new, g.Call):
            return new
        args = [self._shared(new.op, i, a) if isinstance(a, g.Constant)
                and not any(a is b for b in call.args) else a for i, a in enumerate(new.args)]
        if all(a is b for a, b in zip(args, new.args, strict=True)):
            return new
        return g.Call(new.op, tuple(args), new.attrs, new.ret_type)

    def _shared(self, op: str, position: int, packed: g.Constant) -> g.Constant:
        data = packed.data
        made = self._made.setdefault((op, position, data.dtype.str, data.shape,
                                      _sample(data)), [])
        for first in made:
            if _same_bits(first.data, data):
                return first
        made.append(packed)
        return packed


# Bytes compared at a time by `_same_bits`: a multi-GiB weight is never copied whole.
_COMPARE_BLOCK = 1 << 24


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit for bit (-0.0 and 0.0, or two NaNs, are not the same), in blocks."""
    x = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    y = np.ascontiguousarray(b).reshape(-1).view(np.uint8)
    return len(x) == len(y) and all(
        x[i:i + _COMPARE_BLOCK].tobytes() == y[i:i + _COMPARE_BLOCK].tobytes()
        for i in range(0, len(x), _COMPARE_BLOCK))


#: Values `SharedPacking` samples from a packed constant to find its equals.
_SAMPLED = 64


def _sample(data: np.ndarray) -> bytes:
    """`_SAMPLED` values of `data`, evenly spaced (all of a smaller one), as bytes."""
    flat = data.reshape(-1)
    step = max(1, flat.size // _SAMPLED)
    return flat[::step][:_SAMPLED].tobytes()
