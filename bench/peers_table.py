"""The tables of bench/peers.py from its measurements: no runtime, no kiln.

Kept apart from bench/peers.py so that a test can load this file alone (bench/ is
scripts, not a package) and check the rows, the absent columns and the geometric mean
without starting any runtime.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

#: The runtimes in table order; "ort" is the reference every ratio divides by.
RUNTIMES = ("kiln", "ort", "ov_f32", "ov_default", "torch", "torch_compile")
LABELS = {
    "kiln": "kiln", "ort": "onnxruntime", "ov_f32": "OpenVINO fp32",
    "ov_default": "OpenVINO default", "torch": "torch eager",
    "torch_compile": "torch.compile",
}
#: What each runtime's compile-time column measures.
COMPILE_LABELS = {
    "kiln": "kiln cold compile", "ort": "ort session", "ov_f32": "OV fp32 compile_model",
    "ov_default": "OV default compile_model", "torch": "torch eager",
    "torch_compile": "torch.compile 1st call",
}
REFERENCE = "ort"


@dataclass
class PeerResult:
    """One model's measurements: per runtime, its paired latency ratio to onnxruntime,
    its relative L2 error against onnxruntime's output and its compile (or session
    creation) seconds; `missing` says why a runtime has no figures (absent, no torch
    module, failed)."""

    model: str
    int8: bool = False
    ort_ms: float = math.nan
    ratio: dict[str, float] = field(default_factory=dict)
    rel_l2: dict[str, float] = field(default_factory=dict)
    compile_s: dict[str, float] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)
    # The share of kiln's parallel loops its pool ran on the caller alone in the timed
    # blocks: its probe found the two threads sharing a core (docs/performance.md,
    # "Two threads on one core"), a state this VM's vCPUs are in for seconds at a time.
    kiln_alone: float = math.nan


def geomean(values: Iterable[float]) -> float:
    """The geometric mean of positive `values`; NaN when there are none."""
    logs = [math.log(v) for v in values]
    return math.exp(sum(logs) / len(logs)) if logs else math.nan


def ms_text(ms: float) -> str:
    """Milliseconds in three significant digits, without an exponent."""
    return f"{ms:.0f}" if ms >= 100 else f"{ms:.3g}"


def l2_text(value: float) -> str:
    """A relative L2 error in one significant digit; "0" when the outputs are equal."""
    return "0" if value == 0 else f"{value:.0e}"


def _missing(result: PeerResult, runtime: str) -> str:
    return result.missing.get(runtime, "—")


def latency_row(result: PeerResult, runtimes: Sequence[str]) -> list[str]:
    """Model, onnxruntime's milliseconds, then per other runtime 'ratio (rel L2)'."""
    label = f"{result.model} (int8)" if result.int8 else result.model
    cells = [label, ms_text(result.ort_ms) if REFERENCE not in result.missing
             else _missing(result, REFERENCE)]
    for r in runtimes:
        if r == REFERENCE:
            continue
        if r in result.ratio:
            cells.append(f"{result.ratio[r]:.2f}x ({l2_text(result.rel_l2[r])})")
        else:
            cells.append(_missing(result, r))
    return cells


def geomean_row(results: Sequence[PeerResult], runtimes: Sequence[str]) -> list[str]:
    """The geometric mean of each column's ratios over the float models (int8 models
    compare other files); a column with fewer models than the row says how many."""
    floats = [r for r in results if not r.int8 and REFERENCE not in r.missing]
    cells = [f"geomean, {len(floats)} float models", ""]
    for runtime in runtimes:
        if runtime == REFERENCE:
            continue
        ratios = [r.ratio[runtime] for r in floats if runtime in r.ratio]
        if not ratios:
            cells.append("absent" if any(r.missing.get(runtime) == "absent" for r in floats)
                         else "—")
            continue
        count = "" if len(ratios) == len(floats) else f" ({len(ratios)} of {len(floats)})"
        cells.append(f"**{geomean(ratios):.2f}x**{count}")
    return cells


def compile_row(result: PeerResult, runtimes: Sequence[str]) -> list[str]:
    """Model, then per runtime the seconds to compile (or create a session)."""
    label = f"{result.model} (int8)" if result.int8 else result.model
    return [label, *(f"{result.compile_s[r]:.2f}" if r in result.compile_s
                     else _missing(result, r) for r in runtimes if r != "torch")]


def latency_header(runtimes: Sequence[str]) -> list[str]:
    """The latency table's columns."""
    return ["model", "ort ms", *(f"{LABELS[r]} / ort (rel L2)" for r in runtimes
                                 if r != REFERENCE)]


def compile_header(runtimes: Sequence[str]) -> list[str]:
    """The compile table's columns (torch eager compiles nothing)."""
    return ["model", *(f"{COMPILE_LABELS[r]} s" for r in runtimes if r != "torch")]
