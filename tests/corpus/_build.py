"""Small builder helpers shared by the corpus case files."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager

from kiln.ir import IRBuilder
from kiln.ir import tensor as t

LOOP_NAMES = "ijklmn"


@contextmanager
def loop_nest(ib: IRBuilder, shape: Sequence[int], *, names: str = LOOP_NAMES,
              kind: str = "serial") -> Iterator[list[t.Var]]:
    """Nested serial loops over `shape`; yields the loop variables (outermost first)."""
    with ExitStack() as stack:
        yield [stack.enter_context(ib.for_range(n, name=names[k], kind=kind))
               for k, n in enumerate(shape)]


def elementwise(ib: IRBuilder, name: str, shape: Sequence[int], dtypes: Sequence[str],
                out_dtype: str, fn: Callable[..., t.ExprLike]) -> None:
    """A PrimFunc `name(X0, X1, ..., Y)` with `Y[idx] = fn(X0[idx], X1[idx], ...)`."""
    with ib.prim_func(name):
        ins = [ib.arg(f"X{k}", shape, d) for k, d in enumerate(dtypes)]
        out = ib.arg("Y", shape, out_dtype)
        with loop_nest(ib, shape) as idx:
            ib.store(out, idx, fn(*(x[tuple(idx)] for x in ins)))


def f32(value: float) -> t.Const:
    return t.Const(value, "float32")
