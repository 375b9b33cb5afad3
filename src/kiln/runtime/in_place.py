"""A result written over a parameter's own buffer: the one overlap a call may have.

A compiled function whose result is marked `"in_place_of": i` (docs/abi.md, "A result
in place of a parameter"; a GroupQueryAttention's present over its past, the cache
written in place) may be given, as that result's `out=`, parameter i's own array: the
same first byte, the same dtype, at least the parameter's bytes. Its kernel then writes
only what changes (the cache's new rows). Any other overlap of a written buffer stays an
error, as is a call whose result comes back at another shape than the parameter's (the
kernel writes in place only at the parameter's shape, onnxruntime's shared buffer).
Numpy only, as the rest of the runtime.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from kiln.errors import CallError, FormatError
from kiln.runtime.ctypes_abi import data_address


def in_place_pairs(name: str, params: Sequence[Mapping[str, Any]],
                   results: Sequence[Mapping[str, Any]]) -> dict[int, int]:
    """{argument index of a result: its parameter's index} from the signature's
    `in_place_of` marks; FormatError unless each names a tensor parameter of the
    result's dtype and rank."""
    pairs: dict[int, int] = {}
    for j, r in enumerate(results):
        i = r.get("in_place_of")
        if i is None:
            continue
        p = params[i] if isinstance(i, int) and 0 <= i < len(params) else None
        if (p is None or p.get("kind") != "tensor" or r.get("kind") != "tensor"
                or p.get("dtype") != r.get("dtype")
                or len(p.get("shape", ())) != len(r.get("shape", ()))):
            raise FormatError(
                f"function {name}: result {r.get('name')!r} is marked in place of parameter "
                f"{i!r}, which is not a tensor parameter of its dtype and rank")
        pairs[len(params) + j] = i
    return pairs


def exact_overlap(written: np.ndarray, param: np.ndarray) -> bool:
    """Whether `written` is `param`'s own buffer as a result in its place may be: the
    same first byte and dtype, and room for all of the parameter."""
    return (data_address(written) == data_address(param) and written.dtype == param.dtype
            and written.nbytes >= param.nbytes)


def drop_in_place(pairs: Mapping[int, int], addresses: Sequence[int],
                  sizes: list[int]) -> None:
    """Leave out of an overlap sweep each parameter whose in-place result starts at its
    address and covers it (the result's range then stands for both)."""
    for k, i in pairs.items():
        if addresses[k] == addresses[i] and sizes[i] <= sizes[k]:
            sizes[i] = 0


def check_shapes(name: str, pairs: Mapping[int, int], values: Sequence[Any],
                 outputs: Sequence[np.ndarray], result_names: Sequence[str]) -> None:
    """After a call: CallError if a result written in its parameter's buffer came back
    at another shape than the parameter's (the parameter's contents are then lost)."""
    n = len(values)
    for k, i in pairs.items():
        out, param = outputs[k - n], values[i]
        if (isinstance(param, np.ndarray) and param.size
                and data_address(out) == data_address(param)
                and out.shape != param.shape):
            raise CallError(
                f"{name}: argument {k} '{result_names[k - n]}': the result was written in "
                f"the buffer of argument {i} at shape {tuple(out.shape)}, not the argument's "
                f"{tuple(param.shape)}: a result is written in place of its parameter only "
                "at the parameter's shape (a key/value cache of its full length, the mask "
                "no longer than it); that buffer's contents are lost")


__all__ = ["check_shapes", "drop_in_place", "exact_overlap", "in_place_pairs"]
