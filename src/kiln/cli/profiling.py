"""`kiln run --profile / --profile-json / --trace`: the library's kernel timers, per call.

The counters of a library built with profiling (kiln.runtime.profile) sum over
calls; `record` resets them before each call and reads them after, so every
kernel call gets its own duration. From those samples: tables aggregated by
kernel, op type and fused group (kiln.cli.kernel_names), the same as JSON, and
a Chrome trace-event file (the "JSON Object Format" of the Trace Event Format
that chrome://tracing and ui.perfetto.dev open). The counters measure durations,
not start times: in the trace a call's kernels follow each other from the
call's start in call order, the time the graph function spends between them
spread evenly over the gaps.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kiln.cli.kernel_names import fused_group, op_type
from kiln.errors import UsageError

AGGREGATES = ("op", "group", "kernel")
# Without --top: the fewest rows that hold this share of the kernel time, at most
# AUTO_ROWS per table on average (a transformer's profile then fits 30 lines).
AUTO_SHARE, AUTO_ROWS = 0.95, 9
HEADINGS = {"op": "op type", "group": "fused group", "kernel": "kernel"}


@dataclass
class Site:
    """One kernel call of the function (a timer site) and its duration in each call."""

    index: int  # the position of this call among the function's kernel calls
    kernel: str
    outputs: list[str] = field(default_factory=list)  # shapes, from the graph summary
    ns: list[int] = field(default_factory=list)  # per recorded call
    calls: list[int] = field(default_factory=list)  # times it ran in each call (loops)

    def key(self, by: str) -> str:
        """The name this site is aggregated under."""
        return {"op": op_type, "group": fused_group}.get(by, str)(self.kernel)


@dataclass
class Recording:
    """The samples of `function` over the recorded calls."""

    function: str
    sites: list[Site]
    whole_ns: list[int] = field(default_factory=list)  # the library-timed whole call
    starts_us: list[float] = field(default_factory=list)  # wall clock at each call
    walls_us: list[float] = field(default_factory=list)  # wall time around each call

    @property
    def calls(self) -> int:
        """How many calls were recorded."""
        return len(self.whole_ns)


def _shape(t: dict[str, Any]) -> str:
    return "x".join(str(d) for d in t.get("shape", [])) + f" {t.get('dtype', '?')}"


def recording_for(lib: Any, function: str) -> tuple[Recording, list[int]]:
    """An empty Recording of `function`, and the counter index of each of its sites
    (the whole-call site last)."""
    rows = lib.profile()
    mine = [k for k, r in enumerate(rows) if r.function == function]
    whole = [k for k in mine if rows[k].kernel is None]
    kernels = [k for k in mine if rows[k].kernel is not None]
    if not whole or not kernels:
        raise UsageError(f"function {function!r} calls no profiled kernels; the profiled "
                         f"functions are: {', '.join(sorted({r.function for r in rows}))}")
    graph = ((lib.metadata or {}).get("graphs") or {}).get(function) or {}
    calls = graph.get("kernels") or []
    tensors = graph.get("tensors") or []
    names = [c.get("name") for c in calls]
    sites = []
    for i, k in enumerate(kernels):
        kernel = str(rows[k].kernel)
        outputs = ([_shape(tensors[t]) for t in calls[i]["outputs"] if t < len(tensors)]
                   if names == [rows[j].kernel for j in kernels] else [])
        sites.append(Site(i, kernel, outputs))
    return Recording(function, sites), kernels + whole[:1]


def record(lib: Any, function: str, call: Callable[[], Any], times: int) -> Recording:
    """Call `call` `times` times (at least once), reading the counters around each."""
    rec, index = recording_for(lib, function)
    epoch = time.perf_counter()
    for _ in range(max(times, 1)):
        lib.profile_reset()
        t0 = time.perf_counter()
        call()
        t1 = time.perf_counter()
        rows = lib.profile()
        for site, k in zip(rec.sites, index):
            site.ns.append(rows[k].total_ns)
            site.calls.append(rows[k].calls)
        rec.whole_ns.append(rows[index[-1]].total_ns)
        rec.starts_us.append((t0 - epoch) * 1e6)
        rec.walls_us.append((t1 - t0) * 1e6)
    return rec


def median(samples: Sequence[float]) -> float:
    """The median of `samples` (0 for none): robust to a call the OS descheduled, where a
    total or a mean takes the outlier in whole."""
    return statistics.median(samples) if samples else 0.0


def p90(samples: Sequence[float]) -> float:
    """The 90th percentile of `samples` by nearest rank (0 for none)."""
    ordered = sorted(samples)
    return ordered[max(math.ceil(0.9 * len(ordered)) - 1, 0)] if ordered else 0.0


@dataclass(frozen=True)
class Aggregate:
    """The kernel calls that share a name (a kernel, an op type or a fused group)."""

    name: str
    calls: int
    total_ns: int
    min_ns: int  # the shortest single call (a site that ran in a loop counts its mean)
    kernels: int  # distinct timer sites
    per_call_ns: tuple[int, ...] = ()  # its time in each recorded call of the function

    def mean_ns(self) -> float:
        """Mean time of one call."""
        return self.total_ns / self.calls if self.calls else 0.0

    def median_ns(self) -> float:
        """Median over the function's recorded calls of this row's time in one of them."""
        return median(self.per_call_ns)

    def p90_ns(self) -> float:
        """The 90th percentile of the same."""
        return p90(self.per_call_ns)


def aggregate(rec: Recording, by: str) -> list[Aggregate]:
    """Rows by `by` ("op", "group" or "kernel"), longest median per call first."""
    groups: dict[str, list[Site]] = {}
    for site in rec.sites:
        groups.setdefault(site.key(by), []).append(site)
    rows = []
    for name, sites in groups.items():
        calls = sum(sum(s.calls) for s in sites)
        total = sum(sum(s.ns) for s in sites)
        each = [ns // n for s in sites for ns, n in zip(s.ns, s.calls) if n]
        per_call = tuple(sum(c) for c in zip(*(s.ns for s in sites), strict=True))
        rows.append(Aggregate(name, calls, total, min(each, default=0), len(sites), per_call))
    return sorted(rows, key=lambda r: (-r.median_ns(), -r.total_ns, r.name))


def _ms(ns: float) -> str:
    return f"{ns / 1e6:10.4f}"


def row_counts(tables: Sequence[Sequence[Aggregate]], top: int | None) -> list[int]:
    """How many rows (longest first) each table shows before its "other" row: `top`,
    else the fewest holding AUTO_SHARE of that table's time, all tables together at most
    AUTO_ROWS per table (rows a table does not need go to the next ones)."""
    if top is not None:
        return [top] * len(tables)
    wanted = [_rows_holding_the_share(rows) for rows in tables]
    counts = [min(w, AUTO_ROWS) for w in wanted]
    spare = AUTO_ROWS * len(tables) - sum(counts)
    for k, w in enumerate(wanted):
        extra = min(w - counts[k], spare)
        counts[k] += extra
        spare -= extra
    return counts


def _rows_holding_the_share(rows: Sequence[Aggregate]) -> int:
    total, running = sum(r.median_ns() for r in rows), 0.0
    for k, r in enumerate(rows):
        running += r.median_ns()
        if running >= AUTO_SHARE * total:
            return k + 1
    return len(rows)


def table(rec: Recording, by: Sequence[str], top: int | None = None) -> str:
    """The text tables, one per aggregate in `by`: the longest rows (kiln.cli.profiling.
    row_counts), then one "other" row for the rest. The leading columns are the median
    and the 90th percentile over the recorded calls of a row's time in one call (a call
    the OS descheduled moves neither, where it would move a total or a mean); shares
    are of the median library-timed whole call."""
    whole = median(rec.whole_ns) or 1
    kernels = median([sum(s.ns[c] for s in rec.sites) for c in range(rec.calls)])
    lines = [f"profile of {rec.function} over {rec.calls} calls: median "
             f"{_ms(whole).strip()} ms per call, p90 {_ms(p90(rec.whole_ns)).strip()} ms (the "
             f"library's monotonic clock), kernels {100 * kernels / whole:.1f}% of it"]
    tables = [aggregate(rec, key) for key in by]
    for key, rows, n in zip(by, tables, row_counts(tables, top), strict=True):
        shown, rest = rows[:n], rows[n:]
        width = max([len(r.name) for r in shown] + [len(HEADINGS[key]), 24])
        lines.append(f"{'by ' + HEADINGS[key]:<{width}}  {'median ms':>10}  {'p90 ms':>10}  "
                     f"{'calls':>7}  {'min ms':>10}  {'share':>6}")
        for r in shown:
            lines.append(f"{r.name:<{width}}  {_ms(r.median_ns())}  {_ms(r.p90_ns())}  "
                         f"{r.calls:>7}  {_ms(r.min_ns)}  {100 * r.median_ns() / whole:5.1f}%")
        if rest:  # the sum of its rows' medians, so that the column adds up
            ns = sum(r.median_ns() for r in rest)
            label = f"other ({len(rest)} {HEADINGS[key]}{'s' if len(rest) > 1 else ''})"
            lines.append(f"{label:<{width}}  {_ms(ns)}  {'':>10}  "
                         f"{sum(r.calls for r in rest):>7}  {'':>10}  {100 * ns / whole:5.1f}%")
    return "\n".join(lines)


def _row_json(r: Aggregate, whole: float) -> dict[str, Any]:
    return {"name": r.name, "median_ns": r.median_ns(), "p90_ns": r.p90_ns(),
            "calls": r.calls, "kernels": r.kernels, "total_ns": r.total_ns,
            "mean_ns": r.mean_ns(), "min_ns": r.min_ns, "share": r.median_ns() / whole}


def to_json(rec: Recording) -> dict[str, Any]:
    """Every aggregate in full and every site, for `--profile-json` (docs/profiling.md)."""
    whole = median(rec.whole_ns) or 1
    return {
        "function": rec.function, "calls": rec.calls,
        "whole_call": {"median_ns": median(rec.whole_ns), "p90_ns": p90(rec.whole_ns),
                       "total_ns": sum(rec.whole_ns),
                       "mean_ns": sum(rec.whole_ns) / max(rec.calls, 1),
                       "min_ns": min(rec.whole_ns, default=0)},
        **{f"by_{key}": [_row_json(r, whole) for r in aggregate(rec, key)]
           for key in AGGREGATES},
        "sites": [{"call": s.index, "kernel": s.kernel, "op": op_type(s.kernel),
                   "group": fused_group(s.kernel), "outputs": s.outputs,
                   "calls": sum(s.calls), "median_ns": median(s.ns), "p90_ns": p90(s.ns),
                   "total_ns": sum(s.ns),
                   "min_ns": min((ns // n for ns, n in zip(s.ns, s.calls) if n), default=0)}
                  for s in rec.sites],
    }


def trace(rec: Recording) -> dict[str, Any]:
    """The Chrome trace-event JSON of the recorded calls (timestamps in microseconds)."""
    pid, tid = os.getpid(), 1
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": pid, "tid": tid,
         "args": {"name": f"kiln {rec.function}"}},
        {"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
         "args": {"name": "caller"}}]
    for c, (start, wall) in enumerate(zip(rec.starts_us, rec.walls_us)):
        whole = rec.whole_ns[c] / 1e3
        events.append({"name": f"{rec.function} (call {c})", "cat": "call", "ph": "X",
                       "ts": round(start, 3), "dur": round(max(wall, whole), 3),
                       "pid": pid, "tid": tid, "args": {"library_us": round(whole, 3)}})
        durs = [s.ns[c] / 1e3 for s in rec.sites]
        busy = sum(durs)
        scale = whole / busy if busy > whole else 1.0  # clock granularity: keep them inside
        gap = (whole - busy * scale) / (len(durs) + 1)
        ts = start + gap
        for site, dur in zip(rec.sites, durs):
            events.append({"name": site.kernel, "cat": "kernel", "ph": "X",
                           "ts": round(ts, 3), "dur": round(dur * scale, 3),
                           "pid": pid, "tid": tid,
                           "args": {"op": op_type(site.kernel),
                                    "group": fused_group(site.kernel),
                                    "call": site.index, "outputs": site.outputs,
                                    "runs": site.calls[c]}})
            ts += dur * scale + gap
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"source": "kiln run --trace", "function": rec.function}}


def write_json(path: str, data: dict[str, Any], option: str, indent: int | None = 1) -> None:
    """Write `data` to `path`; a UsageError naming `option` when that fails."""
    try:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=indent, separators=None if indent else (",", ":"))
    except OSError as exc:
        raise UsageError(f"{option} {path}: cannot write it: {exc.strerror or exc}") from None


def parse_by(text: str) -> list[str]:
    """`--profile-by op,group`: the aggregates to print, in order."""
    keys = [k.strip() for k in text.split(",") if k.strip()]
    bad = [k for k in keys if k not in AGGREGATES]
    if bad or not keys:
        raise UsageError(f"--profile-by takes a comma-separated list of {', '.join(AGGREGATES)}"
                         f", got {text!r}")
    return keys
