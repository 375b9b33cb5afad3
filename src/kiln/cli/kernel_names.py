"""What a lowered kernel's name says: its fused group and the op type it computes.

Graph fusion (kiln.transform.fuse_ops) names a kernel `fused_` + its ops joined by
`_` (cut at 60 characters), a lone op keeps the op's name, and a second kernel of
the same name (other shapes or attributes) gets `_1`, `_2`, ... The *fused group*
is the name without that suffix; the *op type* is the group's first op (the one
fusion anchored the group on), found by matching registered op names.
"""

from __future__ import annotations

import re
from functools import cache

_COPY = re.compile(r"_\d+$")


def fused_group(kernel: str) -> str:
    """`kernel` without the `_N` that tells same-named kernels apart."""
    return _COPY.sub("", kernel)


@cache
def _op_names() -> tuple[str, ...]:
    from kiln.ops import list_ops  # heavy: kept off the cli's startup (kiln --help)

    return tuple(sorted(list_ops(), key=len, reverse=True))


def kernel_ops(kernel: str) -> list[str]:
    """The ops a kernel's name lists, in order (the name itself when no op matches)."""
    return list(_kernel_ops(kernel))


@cache
def _kernel_ops(kernel: str) -> tuple[str, ...]:
    rest = fused_group(kernel)
    rest = rest.removeprefix("fused_") if rest.startswith("fused_") else rest
    ops: list[str] = []
    while rest:
        op = next((o for o in _op_names() if rest == o or rest.startswith(o + "_")), None)
        if op is None:  # a name fusion cut short, or not an op's
            ops.append(rest)
            break
        ops.append(op)
        rest = rest[len(op) + 1:]
    return tuple(ops) or (kernel,)


def op_type(kernel: str) -> str:
    """The op type of `kernel`: the first op its name lists."""
    return _kernel_ops(kernel)[0]
