"""Rebuilding a function's bindings after a graph rewrite chose what to drop and replace."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from kiln.ir import graph as g


def splice(bindings: Iterable[g.Binding], dropped: set[int],
           replaced: Mapping[int, Sequence[g.Binding]]) -> list[g.Binding]:
    """`bindings` in order without those whose variable's id is in `dropped`, each binding
    whose variable's id is a key of `replaced` given as that sequence instead (the
    rewritten value and the bindings it needs, in order)."""
    out: list[g.Binding] = []
    for b in bindings:
        if id(b.var) not in dropped:
            out.extend(replaced.get(id(b.var), (b,)))
    return out
