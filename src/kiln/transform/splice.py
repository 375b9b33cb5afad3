"""Rebuilding a function's bindings after a graph rewrite chose what to drop and replace."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from kiln.ir import graph as g


def splice(bindings: Iterable[g.Binding], dropped: set[int],
           replaced: Mapping[int, Sequence[g.Binding]],
           after: Mapping[int, g.Binding] | None = None) -> list[g.Binding]:
    """`bindings` in order without those whose variable's id is in `dropped`, each binding
    whose variable's id is a key of `replaced` given as that sequence instead (the
    rewritten value and the bindings it needs, in order), and each binding of `after`
    right after the one whose variable's id keys it."""
    out: list[g.Binding] = []
    for b in bindings:
        if id(b.var) not in dropped:
            out.extend(replaced.get(id(b.var), (b,)))
            if after and id(b.var) in after:
                out.append(after[id(b.var)])
    return out
