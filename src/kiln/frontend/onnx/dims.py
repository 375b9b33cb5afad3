"""The symbolic dimensions of an ONNX model's inputs, and how `shape_dict` pins or bounds them.

Every `dim_param` becomes one dimension variable (`kiln.ir.shape_expr.dim_var`),
shared by all inputs that name it; a dynamic dimension without a name gets a fresh
variable `<input>_dim<k>`. Names that are not identifiers are rewritten (`batch size`
-> `batch_size`) so that they print, parse and reach C code unchanged.

`shape_dict` entries are keyed by input name or by dimension name:

- `{"x": (1, None, 64)}`: the shape of input `x`; `None` keeps a dimension symbolic
  (an int is the shape of a 1-D input);
- `{"batch": 1}`: pins a dimension to a size everywhere it occurs;
- `{"seq": range(1, 513)}`: bounds a dimension (min 1, max 512), kept symbolic.

A dimension no range bounds takes every size from 0 up, as onnxruntime does (an empty
batch, the empty past of a generation loop's first step); a size the model divides by
(a Reshape's -1) must still be non-zero when called (`nonzero`, kiln.ir.attrs).

A dimension may also be named as kiln names it (`batch_size`, `x_dim1`). An
input's name wins over a dimension of the same name.
"""

from __future__ import annotations

import keyword
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kiln._registry import suggest
from kiln.errors import FrontendError
from kiln.ir.shape_expr import dim_var
from kiln.ir.tensor import Var
from kiln.ir.types import Dim
from kiln.runtime.abi import INT64_MAX

# A declared dimension: a size, a dim_param name, or None (dynamic, unnamed).
Declared = int | str | None


def _is_int(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, np.integer))


def identifier(name: str) -> str:
    """`name` made a valid identifier (other characters become `_`) that is no Python
    keyword, so a size's text in library metadata (`seq*2`) reads back as an
    expression (kiln.runtime.dim_binding) and the DSL prints it as a name."""
    text = re.sub(r"\W", "_", name, flags=re.ASCII)
    text = text if text and not text[0].isdigit() else f"d_{text}"
    return f"{text}_" if keyword.iskeyword(text) or keyword.issoftkeyword(text) else text


@dataclass
class InputDims:
    """Resolves the dimensions of every model input against a `shape_dict`."""

    declared: dict[str, list[Declared] | None]  # input -> its declared dims (None: no shape)
    shape_dict: Mapping[str, Any]
    # dimension name (as written in the model) -> its variable's name
    names: dict[str, str] = field(default_factory=dict)
    pins: dict[str, tuple[int, str]] = field(default_factory=dict)  # var name -> (size, why)
    bounds: dict[str, tuple[int, int | None]] = field(default_factory=dict)
    vars: dict[str, Var] = field(default_factory=dict)
    auto: set[str] = field(default_factory=set)  # names made for unnamed dynamic dims
    # sizes the model divides by (their text -> the node and why), checked at call time
    nonzero: dict[str, str] = field(default_factory=dict)
    # variable name -> the variable it is read as (two names the graph needs equal)
    aliases: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._name_dims()
        by_input = {k: v for k, v in self.shape_dict.items() if k in self.declared}
        by_dim = {k: v for k, v in self.shape_dict.items() if k not in self.declared}
        for key, value in by_dim.items():
            self._dim_entry(key, value)
        for key, value in by_input.items():
            self._input_entry(key, value)
        for name, (size, why) in self.pins.items():
            lo, hi = self.bounds.get(name, (0, None))
            if size < lo or (hi is not None and size > hi):
                raise FrontendError(f"{why} pins dimension {name!r} to {size}, outside its "
                                    f"range {lo}..{'' if hi is None else hi}")

    # ------------------------------------------------------------------ naming

    def _name_dims(self) -> None:
        used: set[str] = set()
        for dims in self.declared.values():
            for d in dims or ():
                if isinstance(d, str) and d not in self.names:
                    self.names[d] = self._fresh(identifier(d), used)
        for inp, dims in self.declared.items():
            for k, d in enumerate(dims or []):
                if d is None and dims is not None:
                    # a key no dim_param spells (the name itself may be taken)
                    dims[k] = key = f"\0{inp}_dim{k}"
                    self.auto.add(key)
                    self.names[key] = self._fresh(identifier(key[1:]), used)
        for key, name in self.names.items():
            self.names[key] = self.aliases.get(name, name)

    @staticmethod
    def _fresh(name: str, used: set[str]) -> str:
        out, k = name, 1
        while out in used:
            k += 1
            out = f"{name}_{k}"
        used.add(out)
        return out

    # ------------------------------------------------------------------ shape_dict

    def _dim_entry(self, key: str, value: Any) -> None:
        by_var = {v: k for k, v in self.names.items()}  # `batch_size`, `x_dim1` as kiln names them
        if key not in self.names and key in by_var:
            key = by_var[key]
        if key not in self.names:
            named = [n for n in self.names if n not in self.auto]
            known = list(self.declared) + named
            raise FrontendError(
                f"shape_dict names {key!r}, which is neither an input nor a dimension of the "
                f"model.{suggest(str(key), known)} Inputs: {', '.join(self.declared) or '(none)'}"
                f"; dimensions: {', '.join(named) or '(none)'}")
        name = self.names[key]
        if isinstance(value, range):
            # stop <= start rather than len(): len() of a range past ssize_t overflows
            if value.step != 1 or value.start < 0 or value.stop <= value.start:
                raise FrontendError(f"shape_dict[{key!r}] = {value!r}: a dimension range must "
                                    "be non-empty, with step 1 and a non-negative start")
            if value.stop - 1 > INT64_MAX:  # sizes cross the C ABI as int64_t
                raise FrontendError(f"shape_dict[{key!r}] = {value!r}: the largest size must "
                                    f"fit int64 (at most {INT64_MAX})")
            low, high = self.bounds.get(name, (value.start, None))  # an alias's range too
            top = value.stop - 1 if high is None else min(high, value.stop - 1)
            if max(low, value.start) > top:
                raise FrontendError(f"shape_dict[{key!r}] = {value!r} and the range of "
                                    f"{name!r}, which the graph needs equal, do not overlap")
            self.bounds[name] = (max(low, value.start), top)
        elif _is_int(value) and value >= 0:
            self._pin(name, int(value), f"shape_dict[{key!r}]")
        else:
            raise FrontendError(f"shape_dict[{key!r}] must be a non-negative int (pins dimension "
                                f"{key!r}) or a range (bounds it), got {value!r}")

    def _input_entry(self, inp: str, shape: Any) -> None:
        if _is_int(shape):  # the size of a 1-D input (`kiln compile --shape x=5`)
            shape = (shape,)
        if isinstance(shape, range):
            raise FrontendError(f"shape_dict[{inp!r}] = {shape!r}: {inp!r} is an input; a "
                                "range bounds a dimension and is keyed by its name")
        if isinstance(shape, (str, bytes)) or not hasattr(shape, "__iter__"):
            raise FrontendError(f"shape_dict[{inp!r}] must be a sequence of ints, got {shape!r}")
        shape = tuple(shape)
        for d in shape:
            if d is not None and (not _is_int(d) or d < 0):
                raise FrontendError(
                    f"shape_dict[{inp!r}] = {shape!r}: every dimension must be a non-negative "
                    f"int or None (keeps it symbolic), got {d!r}")
        declared = self.declared[inp]
        if declared is None:
            if None in shape:
                raise FrontendError(f"shape_dict[{inp!r}] = {shape!r}: input {inp!r} declares "
                                    "no shape, so every dimension must be given")
            self.declared[inp] = [int(d) for d in shape]
            return
        if len(declared) != len(shape) or any(
                isinstance(d, int) and s is not None and d != s for d, s in zip(declared, shape)):
            shown = tuple("?" if d in self.auto else d for d in declared)
            raise FrontendError(f"shape_dict gives input {inp!r} shape {shape}, but the model "
                                f"declares {shown}")
        for k, (d, s) in enumerate(zip(declared, shape)):
            if isinstance(d, str) and s is not None:
                self._pin(self.names[d], int(s), f"shape_dict[{inp!r}][{k}]")

    def _pin(self, name: str, size: int, why: str) -> None:
        if name in self.pins and self.pins[name][0] != size:
            old, before = self.pins[name]
            raise FrontendError(f"{why} pins dimension {name!r} to {size}, but {before} pins it "
                                f"to {old}")
        self.pins.setdefault(name, (size, why))

    # ------------------------------------------------------------------ results

    def shape(self, inp: str) -> tuple[Dim, ...] | None:
        """The shape of input `inp`: ints and dimension variables (None: no shape known)."""
        declared = self.declared[inp]
        if declared is None:
            return None
        out: list[Dim] = []
        for d in declared:
            if isinstance(d, int):
                out.append(d)
                continue
            name = self.names[str(d)]
            if name in self.pins:
                out.append(self.pins[name][0])
            else:
                out.append(self.vars.setdefault(name, dim_var(name)))
        return tuple(out)

    def dim_bounds(self) -> tuple[tuple[str, int, int | None], ...]:
        """`(name, min, max)` of every dimension variable made so far, sorted by name (min 0
        and no max unless `shape_dict` gives a range)."""
        return tuple((name, *self.bounds.get(name, (0, None))) for name in sorted(self.vars))


def declared_dims(tensor_type: Any) -> list[Declared] | None:
    """The dims an ONNX TensorTypeProto declares (None when it declares no shape)."""
    if not tensor_type.HasField("shape"):
        return None
    out: list[Declared] = []
    for d in tensor_type.shape.dim:
        if d.HasField("dim_value"):
            out.append(int(d.dim_value))
        else:
            out.append(d.dim_param or None)
    return out

