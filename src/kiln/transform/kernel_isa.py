"""The ISA the passes hand to the kernels: the pipeline's target's, with the tuning
session's model-level choices for the model compiled.

Kernels read nothing ambient (docs/README.md): every pass that builds, packs or sizes
kernels reads the target and the tuning session here, once per run, and passes the
result down as the `isa` argument.
"""

from __future__ import annotations

from dataclasses import replace

from kiln.errors import UsageError
from kiln.kernels.parallel_work import PARALLEL_MIN_NS
from kiln.target.isa import ISA, isa_for
from kiln.tuning.apply import PARALLEL_THRESHOLD, Session, current


def kernel_isa() -> ISA:
    """The current target's ISA (kiln.target.isa) with the current tuning session's
    `parallel_threshold` for the model compiled, where it has one."""
    isa = isa_for(None)
    return with_session(isa, current())


def with_session(isa: ISA, session: Session | None) -> ISA:
    """`isa` with `session`'s parallel threshold (None, or no choice: `isa`)."""
    if session is None:
        return isa
    params = session.knob(PARALLEL_THRESHOLD, None, isa, {"min_ns": PARALLEL_MIN_NS})
    if params is None:
        return isa
    ns = params.get("min_ns")
    if isinstance(ns, bool) or not isinstance(ns, int) or ns <= 0:
        raise UsageError(f"parallel_threshold: min_ns must be a positive integer, got {ns!r}")
    return replace(isa, parallel_min_ns=ns)
