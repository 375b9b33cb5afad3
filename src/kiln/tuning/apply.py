"""Tuning at compile time: the blocking passes pack each kernel call through `pack`.

Without a tuning session `pack(family, call, isa)` is the family's own `pack` (the
rule's tile). Inside `using(session)` the session decides:

- `FromDatabase`: the tile a database chose for the call's (kernel, signature,
  target), else the rule's; it counts what it applied (the library metadata says so);
- `Recorder`: the rule's tile, remembering every tunable call (what `kiln tune`
  measures);
- `Forced`: one given tile for every call of one family (a candidate's build).

A kernel's signature is its source call's: the op, the operand types (a constant as
`const` plus its shape) and the attributes, so equal calls in one model or in two
models share a record.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from kiln.ir import graph as g
from kiln.ir.types import TensorType
from kiln.target.isa import ISA
from kiln.tuning.database import TuningDatabase, target_key

#: The attribute the packed call's tile lives in (kiln.ops.kernels.registry.TILE).
TILE_ATTR = "tile"


def signature(call: g.Call) -> str:
    """`op(operand types){attributes}` of a source call, e.g.
    `conv2d(float32[1,64,56,56];const float32[64,64,3,3]){"pads":[1,1,1,1]}`."""
    def operand(a: g.Expr) -> str:
        if isinstance(a, g.Constant):
            return f"const {a.data.dtype}[{','.join(str(d) for d in a.data.shape)}]"
        t = a.type
        if isinstance(t, TensorType):
            return f"{t.dtype}[{','.join(str(d) for d in t.shape)}]"
        return str(t)

    attrs = {k: v for k, v in dict(call.attrs).items() if k != TILE_ATTR}
    text = json.dumps(attrs, sort_keys=True, separators=(",", ":"), default=str) \
        if attrs else ""
    return f"{call.op}({';'.join(operand(a) for a in call.args)}){text}"


def tunable(family: Any) -> bool:
    """Whether `family` has a search space (kiln.ops.kernels.registry.TunableFamily; asked
    by its methods, since the tuning layer sits below the ops)."""
    return callable(getattr(family, "candidates", None)) and callable(
        getattr(family, "pack_tile", None))


class Session:
    """What a tuning session does with one call (the base: the rule's tile)."""

    def pack(self, family: Any, call: g.Call, isa: ISA) -> g.Call:
        """`call` packed by `family`."""
        return family.pack(call, isa)


@dataclass
class FromDatabase(Session):
    """Tiles from a database for the records of this target; `applied` counts them."""

    db: TuningDatabase
    applied: dict[str, list[int]] = field(default_factory=dict)

    def pack(self, family: Any, call: g.Call, isa: ISA) -> g.Call:
        params = self.db.lookup(family.name, signature(call), target_key(isa)) \
            if tunable(family) else None
        tile = params.get("tile") if params else None
        if tile is None:
            return family.pack(call, isa)
        self.applied[f"{family.name} {signature(call)}"] = list(tile)
        return family.pack_tile(call, isa, tuple(tile))


@dataclass
class Recorder(Session):
    """The rule's tiles; every tunable call seen, by (family, signature)."""

    calls: dict[tuple[str, str], tuple[Any, g.Call, ISA]] = field(default_factory=dict)
    counts: dict[tuple[str, str], int] = field(default_factory=dict)

    def pack(self, family: Any, call: g.Call, isa: ISA) -> g.Call:
        if tunable(family):
            key = (family.name, signature(call))
            self.calls.setdefault(key, (family, call, isa))
            self.counts[key] = self.counts.get(key, 0) + 1
        return family.pack(call, isa)


@dataclass
class Forced(Session):
    """`tile` for every call of the family named `family` (None: the rule's)."""

    family: str
    tile: tuple[int, ...] | None
    seen: int = 0

    def pack(self, family: Any, call: g.Call, isa: ISA) -> g.Call:
        if family.name != self.family or self.tile is None:
            return family.pack(call, isa)
        self.seen += 1
        return family.pack_tile(call, isa, self.tile)


_SESSION: ContextVar[Session | None] = ContextVar("kiln_tuning_session", default=None)


@contextlib.contextmanager
def using(session: Session | None) -> Iterator[Session | None]:
    """Make `session` the one the blocking passes ask (None: no tuning)."""
    token = _SESSION.set(session)
    try:
        yield session
    finally:
        _SESSION.reset(token)


def pack(family: Any, call: g.Call, isa: ISA) -> g.Call:
    """`call` packed by `family`, with the current session's tile when one is active."""
    session = _SESSION.get()
    return family.pack(call, isa) if session is None else session.pack(family, call, isa)
