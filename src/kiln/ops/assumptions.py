"""Sizes an import may assume equal: two dimension variables an operator needs equal.

Exporters may name one size twice (torch's `Dim.AUTO` names the past keys' length
`s20` and the past values' `s8`). Shape inference cannot prove `s20 == s8`, and
refuses (`UnprovenEqualError`). Inside `assuming_equal`, an operator that needs two
sizes equal that differ exactly by two variables (`kiln.ir.shape_expr.equated_variables`)
records the pair and goes on as if they were equal, so one pass over a model finds every
such pair; the importer then makes each pair one variable and imports again, checked
(kiln.frontend.onnx.importer).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from kiln.errors import UnprovenEqualError
from kiln.ir.pin_hint import unproven_equal
from kiln.ir.shape_expr import equated_variables
from kiln.ir.types import Dim

_ASSUMED: ContextVar[list[tuple[str, str]] | None] = ContextVar("kiln_assumed_equal",
                                                                default=None)


@contextmanager
def assuming_equal() -> Iterator[list[tuple[str, str]]]:
    """Operators inside record (into the list yielded) the variable pairs they assume
    equal instead of refusing them."""
    found: list[tuple[str, str]] = []
    token = _ASSUMED.set(found)
    try:
        yield found
    finally:
        _ASSUMED.reset(token)


def unproven(text: str, a: Dim, b: Dim) -> None:
    """`a == b` is needed and not provable: raise UnprovenEqualError (`text` and how to
    pin), unless inside `assuming_equal` they differ by two variables (recorded)."""
    found = _ASSUMED.get()
    pair = equated_variables(a, b) if found is not None else None
    if found is None or pair is None:
        raise UnprovenEqualError(f"{text}: {unproven_equal(a, b)}", (a, b))
    if pair not in found:
        found.append(pair)
