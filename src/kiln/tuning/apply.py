"""Tuning at compile time: the blocking passes read the current session (`current()`)
once and pack each kernel call through `kiln.kernels.search.pack`, which asks that
session for the call's params (`Session.params_for`): None is the rule's variant, else
a dict such as `{"tile": [6, 32]}`, `{"tile": [8, 32], "split": "inner"}` or
`{"family": "conv_gemm", "tile": [8, 32]}` (kiln.kernels.search); the `use-cblas`
pass asks it the same way whether a product calls CBLAS (`{"library": "own"}`: not;
kiln.ops.cblas.LIBRARY_CHOICE). Inside
`using(session)`:

- `FromDatabase`: for a model the database has verdicts for (`model`, its
  fingerprint), the params they accepted in the model (`TuningDatabase.checked`);
  otherwise the params the database chose for the call's (kernel, signature, target),
  else None; it counts what it applied (the library metadata says so);
- `Chosen`: given params per (kernel, signature) (a model check's builds);
- `Recorder`: None, remembering every tunable call (what `kiln tune` measures);
- `Forced`: given params for every call of one family (a candidate's build).

A choice that is not a kernel family's (kiln.kernels.search.KernelChoice: CBLAS
or kiln's own GEMM) is asked the same way; `Recorder` and `Forced` answer it with the
choice that leaves the call to kiln's kernel families (`kernel_params`), so the
families' variants of those calls are recorded and built too.

A kernel's signature is its source call's: the op, the operand types (a constant as
`const` plus its shape) and the attributes, so equal calls in one model or in two
models share a record.

Model-level knobs (measured in the whole model, kiln.distributed.tune) are asked with
`Session.knob(kernel, signature, isa)`: a pseudo-kernel name (`NCHWC_REGION`: a blocked
region's layout, signed by its convolutions; `PARALLEL_THRESHOLD`: the work threshold of
parallel loops, signed by the model's fingerprint, `signature` None) and the same
database records and verdicts as kernels.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from kiln.errors import shown
from kiln.ir import graph as g
from kiln.ir.types import TensorType
from kiln.target.isa import ISA
from kiln.tuning.database import TuningDatabase, target_key

#: The attribute the packed call's tile lives in (kiln.ops.packed_attrs.TILE).
TILE_ATTR = "tile"
#: Model-level knobs: a region of the blocked layout (kiln.transform.nchwc_layout),
#: params `{"layout": "NCHWc"}` or `{"layout": "NCHW"}`; the parallel work threshold of
#: the whole compile (kiln.kernels.parallel_work), params `{"min_ns": N}`.
NCHWC_REGION = "nchwc_region"
PARALLEL_THRESHOLD = "parallel_threshold"
MODEL_KNOBS = (NCHWC_REGION, PARALLEL_THRESHOLD)


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
    """Whether `family` has a search space: a kiln.kernels.registry.TunableFamily
    (its tiles) or a kiln.kernels.search.KernelChoice (e.g. CBLAS or kiln's own
    GEMM); asked by their methods, since the tuning layer sits below the ops."""
    return callable(getattr(family, "other_params", None)) or (
        callable(getattr(family, "candidates", None)) and callable(
            getattr(family, "pack_tile", None)))


class Session:
    """What a tuning session does with one call (the base: the rule's variant)."""

    def params_for(self, family: Any, call: g.Call, isa: ISA) -> dict[str, Any] | None:
        """The params `call` is packed with by `family` (None: the rule's)."""
        return None

    def knob(self, kernel: str, sig: str | None, isa: ISA,
             default: dict[str, Any]) -> dict[str, Any] | None:
        """The params of the model-level knob `kernel` (MODEL_KNOBS) signed `sig` (None:
        the compiled model's fingerprint, where the session knows it), `default` being
        the rule's; None: the rule's."""
        return None

    def describe(self, kernel: str, sig: str) -> str:
        """Where the params of (kernel, sig) come from, for an error about them."""
        return f"the tuning params of {kernel} {shown(sig)}"


@dataclass
class FromDatabase(Session):
    """Params from a database for the records of this target, only those its verdicts
    accepted when it has verdicts for `model` (the fingerprint of the model compiled);
    `applied` counts them, `unchecked` says whether they come from records no model
    check judged."""

    db: TuningDatabase
    model: str | None = None
    applied: dict[str, dict[str, Any]] = field(default_factory=dict)
    unchecked: bool = False
    # the verdicts' accepted params per target key (None: no verdict there)
    _checked: dict[str, dict[tuple[str, str], Any] | None] = field(default_factory=dict)

    def checked(self, target: str) -> dict[tuple[str, str], Any] | None:
        """The params the model's verdicts on `target` accepted (None: no verdict)."""
        if target not in self._checked:
            self._checked[target] = None if self.model is None else \
                self.db.checked(self.model, target)
        return self._checked[target]

    def params_for(self, family: Any, call: g.Call, isa: ISA) -> dict[str, Any] | None:
        return self._lookup(family.name, signature(call), isa) if tunable(family) else None

    def describe(self, kernel: str, sig: str) -> str:
        """The database and the record (its kernel and signature, the key a compile
        looks up)."""
        return f"{self.db.source}: the record of kernel {kernel!r}, signature {shown(sig)}"

    def knob(self, kernel: str, sig: str | None, isa: ISA,
             default: dict[str, Any]) -> dict[str, Any] | None:
        sig = self.model if sig is None else sig
        return None if sig is None else self._lookup(kernel, sig, isa)

    def _lookup(self, kernel: str, sig: str, isa: ISA) -> dict[str, Any] | None:
        """The params applied to (kernel, sig) on `isa`'s target, counted in `applied`."""
        key = target_key(isa)
        accepted = self.checked(key)
        params = self.db.lookup(kernel, sig, key) if accepted is None \
            else accepted.get((kernel, sig))
        if not params:
            return None
        self.unchecked = self.unchecked or accepted is None
        self.applied[f"{kernel} {sig}"] = dict(params)
        return dict(params)


@dataclass
class Chosen(Session):
    """`params[(kernel, signature)]` for the calls and knobs it names, the rule's for the
    others; `model`: the fingerprint a knob signed None stands for."""

    params: dict[tuple[str, str], Any]
    model: str | None = None

    def params_for(self, family: Any, call: g.Call, isa: ISA) -> dict[str, Any] | None:
        return self._get(family.name, signature(call)) if tunable(family) else None

    def knob(self, kernel: str, sig: str | None, isa: ISA,
             default: dict[str, Any]) -> dict[str, Any] | None:
        return self._get(kernel, self.model if sig is None else sig)

    def _get(self, kernel: str, sig: str | None) -> dict[str, Any] | None:
        found = None if sig is None else self.params.get((kernel, sig))
        return None if found is None else dict(found)


def _kernel_params(family: Any, call: g.Call, isa: ISA) -> dict[str, Any] | None:
    """A choice's params that leave `call` to kiln's kernel families (a
    kiln.kernels.search.KernelChoice, e.g. CBLAS: kiln's GEMM), None for a family."""
    route = getattr(family, "kernel_params", None)
    return dict(route(call, isa)) if callable(route) else None


@dataclass
class Recorder(Session):
    """The rule's variants; every tunable call seen, by (family, signature), and every
    model-level knob asked, by (kernel, signature) with the rule's params. A choice
    (`KernelChoice`) is recorded and then leaves the call to kiln's kernel families, so
    their calls are recorded too (the module built is only looked at, never run)."""

    calls: dict[tuple[str, str], tuple[Any, g.Call, ISA]] = field(default_factory=dict)
    counts: dict[tuple[str, str], int] = field(default_factory=dict)
    knobs: dict[tuple[str, str | None], dict[str, Any]] = field(default_factory=dict)

    def knob(self, kernel: str, sig: str | None, isa: ISA,
             default: dict[str, Any]) -> dict[str, Any] | None:
        self.knobs.setdefault((kernel, sig), dict(default))
        return None

    def params_for(self, family: Any, call: g.Call, isa: ISA) -> dict[str, Any] | None:
        if tunable(family):
            key = (family.name, signature(call))
            self.calls.setdefault(key, (family, call, isa))
            self.counts[key] = self.counts.get(key, 0) + 1
        return _kernel_params(family, call, isa)


@dataclass
class Forced(Session):
    """`params` for every call of the family named `family` (None: the rule's); a choice
    other than `family` (`KernelChoice`) leaves its calls to the kernel families, so the
    family gets the call it was recorded for (see `Recorder`)."""

    family: str
    params: dict[str, Any] | None
    seen: int = 0

    def params_for(self, family: Any, call: g.Call, isa: ISA) -> dict[str, Any] | None:
        if family.name != self.family:
            return _kernel_params(family, call, isa)
        if self.params is None:
            return None
        self.seen += 1
        return self.params


_SESSION: ContextVar[Session | None] = ContextVar("kiln_tuning_session", default=None)


@contextlib.contextmanager
def using(session: Session | None) -> Iterator[Session | None]:
    """Make `session` the one the blocking passes ask (None: no tuning)."""
    token = _SESSION.set(session)
    try:
        yield session
    finally:
        _SESSION.reset(token)


def current() -> Session | None:
    """The active session (None: no tuning)."""
    return _SESSION.get()
