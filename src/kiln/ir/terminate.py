"""The terminate flag of a lowered graph function, as `terminate-checks` leaves it.

The pass (kiln.transform.terminate, `TerminateChecks`) gives a lowered graph
function one more parameter, `terminate`: a 0-d int32 buffer, the caller's flag. It
comes after the results and the buffer of run-time dimensions, before the dimension
scalars (`kiln.ir.shape_expr.graph_dims`), and the function carries the attribute
`kiln.terminate_flag` (docs/abi.md, "Stopping a call"). The backends read it here:
host.c's packed entry passes the caller's flag, and the library metadata marks the
function `"terminate": true`.
"""

from __future__ import annotations

from kiln.ir import tensor as t
from kiln.ir.attrs import ATTR_TERMINATE_FLAG
from kiln.ir.shape_expr import graph_dims


def terminate_flag(fn: t.PrimFunc) -> t.Buffer | None:
    """The terminate flag parameter of a function TerminateChecks rewrote, else None."""
    if not fn.attrs.get(ATTR_TERMINATE_FLAG):
        return None
    param = fn.params[len(fn.params) - len(graph_dims(fn)) - 1]
    assert isinstance(param, t.Buffer)
    return param


__all__ = ["terminate_flag"]
