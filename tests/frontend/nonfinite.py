"""The non-finite fuzz: the ONNX node suite's cases on inputs holding NaN, infinities,
signed zeros, subnormals and values near the float limits, kiln against onnxruntime.

A case of the node suite (node_suite.py: prepared with its static operands frozen,
compiled by node_suite.run_compiled) is run again on *variants* of its inputs: in each
float graph input that is not an index-like operand (SKIP_INPUTS), a deterministic
subset of positions (seeded by the case's name, the first and the last element always
among them) is replaced by the values of a PATTERNS entry. onnxruntime runs the same
prepared model on the same variants in one child process (run_onnxruntime); the outputs
are compared NaN-aware (`difference`). tests/frontend/test_nonfinite_fuzz.py runs it in
the suite (the node suite's compiled samples) and bench/fuzz_nonfinite.py by hand
(every case, more variants, both backends); docs/onnx.md, *Non-finite values*.

A case whose result onnx leaves undefined on such inputs *and* that onnxruntime does
not compute deterministically is skipped (SKIP_CASES, with the reason); the known
differences are in ALLOW (op type or case pattern -> reason).
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import time
import warnings
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import node_suite as ns
import numpy as np

NAN, INF = float("nan"), float("inf")

# Pattern name -> (the special values, as functions of the dtype's limits `finfo`;
# where they go). "share": about SHARE of the positions, the first and the last
# element among them, each taking one of the values at random; "one": one random
# position; "pair": the values in order at the first and the last element (the first
# draw) or at two random positions. float32 gets 1e-40, 3.4e38 and 1e20.
# The values near the limit come one of each, of one sign (pattern "huge" and
# "-huge"), in one input per variant (`variants`), never with infinities: a sum of
# products that holds two of them overflows or not by the order of its terms and by
# FMA contraction (fma(3.4e38, -2, inf) is inf, -inf + inf is NaN), which onnx leaves
# open and onnxruntime's kernels and kiln's do differently; one overflows alike in any
# order.
PATTERNS: dict[str, tuple[Callable[[Any], list[float]], str]] = {
    "nan": (lambda f: [NAN], "share"),
    "inf": (lambda f: [INF, -INF], "share"),
    "zero": (lambda f: [0.0, -0.0, tiny(f), -tiny(f)], "share"),
    "mixed": (lambda f: [NAN, INF, -INF, 0.0, -0.0, tiny(f)], "share"),
    "huge": (lambda f: [near_max(f), large(f)], "pair"),
    "-huge": (lambda f: [-near_max(f), -large(f)], "pair"),
    "one_nan": (lambda f: [NAN], "one"),
}
# Share of the positions a "share" pattern replaces (besides the first and the last).
SHARE = 0.2


def tiny(f: Any) -> float:
    """A subnormal of the dtype: 1e-40 for float32, smallest normal / 100 elsewhere."""
    return 1e-40 if f.dtype == np.float32 else float(f.smallest_normal) / 100


def near_max(f: Any) -> float:
    """A value near the dtype's largest: 3.4e38 for float32."""
    return 3.4e38 if f.dtype == np.float32 else float(f.max) * 0.999


def large(f: Any) -> float:
    """A value whose square overflows: 1e20 for float32, sqrt(max) * 5.4 elsewhere."""
    return 1e20 if f.dtype == np.float32 else float(np.sqrt(float(f.max))) * 5.4


# Op type -> {input position: why it is not fuzzed}: float operands that place, index
# or bound rather than carry data. (Operands the node suite freezes, STATIC_OPERANDS in
# node_suite.py, are initializers already.)
COORDINATES = "sampling coordinates: a non-finite coordinate addresses no pixel"
SCALE = ("a quantization scale: a constant one of 0, infinity or NaN is refused, since "
         "no result would be the right one (docs/quantization.md, *What is refused, and "
         "why*)")
THRESHOLD = "a threshold bounds the selection: a parameter, not data"
SKIP_INPUTS: dict[str, dict[int, str]] = {
    "GridSample": {1: COORDINATES},
    "DeformConv": {2: COORDINATES + " (the offsets move the kernel's taps)"},
    "OneHot": {0: "the indices select the hot position (float indices are truncated)"},
    "NonMaxSuppression": {3: THRESHOLD, 4: THRESHOLD},
    "QuantizeLinear": {1: SCALE},
    "QLinearConv": {1: SCALE, 4: SCALE, 6: SCALE},
    "QLinearMatMul": {1: SCALE, 4: SCALE, 6: SCALE},
}

# Case-name pattern -> why the case is not fuzzed: onnx leaves its result on these
# inputs undefined *and* onnxruntime does not compute it deterministically. None so
# far: two onnxruntime runs of every eligible case's variants agree exactly
# (bench/fuzz_nonfinite.py --check-onnxruntime).
SKIP_CASES: dict[str, str] = {}

# Op type, or a pattern searched in "case:variant@target" -> why kiln differs from
# onnxruntime there. test_nonfinite_fuzz.py asserts that each entry still covers a
# difference of its run (remove an entry once its difference is gone). Kept on
# purpose: the first group (onnxruntime's behaviour is the odd one, or onnx leaves the
# value open and the two compute it differently). The rest are known differences that
# their owners are fixing, each named by its class; remove them as the fixes land.
BEING_FIXED = "known difference, being fixed: "
ALLOW: dict[str, str] = {
    r"^test_ai_onnx_ml_binarizer:(nan|mixed|one_nan)":
        "onnxruntime's Binarizer raises on a NaN input ('Input data with index: 0 is "
        "NaN'); onnx defines it elementwise (x > threshold), and kiln gives NaN > "
        "threshold, 0, rather than fail the whole call (docs/onnx.md, *Non-finite values*)",
    r"^test_det_": "a determinant of a matrix with infinite entries meets inf - inf in "
        "any elimination order; kiln's formula and onnxruntime's LU factorization give "
        "different non-finite values (docs/onnx.md, *Non-finite values*)",
    r"^test_(globalmaxpool|maxpool_(2d_(?!dilations|strides)|3d_default))[^:]*:"
    r"(nan|inf|mixed|one_nan)": "MaxPool (strides of 1 and 2) and GlobalMaxPool: "
        "onnxruntime's MLAS vector kernels fold a window with maxps, which drops the "
        "maximum so far at a NaN and keeps the NaN only when it comes last in their order, "
        "and a window of -inf without a padding column is -inf; kiln skips NaN from "
        "-3.4028235e38, as onnxruntime's generic kernels (docs/onnx.md, *Non-finite values*)",
    r"^test_(group_normalization|instancenorm)_.*:-?huge":
        "GroupNormalization and InstanceNormalization of a group whose squares overflow: "
        "onnxruntime's E[x^2] - E[x]^2 gives NaN, kiln's two-pass statistics normalize "
        "it as LayerNormalization does (docs/onnx.md, *Numerics at the edges*)",
    r"^test_reduce_log_sum_exp_.*:-?huge": "ReduceLogSumExp-28 (the node suite's opset): "
        "onnxruntime has no kernel for it and runs onnx's function body, log(sum(exp(x))) "
        "in float64 without subtracting the maximum, inf above x = 709.78; its own kernel "
        "(opsets 18 to 27) subtracts it and gives kiln's exact 1.796e308",
    r"^test_(basic_)?deform_conv": "onnxruntime's DeformConv reads the channel's first "
        "pixel, times 0, for a sample's neighbour outside the image: an infinite or NaN "
        "pixel at (0, 0) makes the outputs whose samples reach the border NaN; kiln reads "
        "0 there, as onnx defines (docs/onnx.md, *Non-finite values*)",
}


def float_dtype(dtype: np.dtype) -> bool:
    """Whether `dtype` is one of the float types the fuzz feeds (not the 8-bit ones)."""
    return dtype.kind == "f" or dtype.name == "bfloat16"


def fuzz_inputs(case: ns.Case) -> list[str]:
    """The graph inputs of `case` the fuzz replaces values of: float data operands."""
    skipped = {node.input[pos] for node in case.model.graph.node
               for pos in SKIP_INPUTS.get(node.op_type, {}) if pos < len(node.input)}
    return [name for name, value in case.inputs.items()
            if float_dtype(value.dtype) and value.size and name not in skipped]


def skip_reason(case: ns.Case) -> str | None:
    """Why `case` is not fuzzed, or None."""
    for pattern, reason in SKIP_CASES.items():
        if re.search(pattern, case.name):
            return reason
    return None if fuzz_inputs(case) else "no float data input"


@dataclass(frozen=True)
class Variant:
    """One input set of a case: its pattern, seed and every graph input's value."""

    pattern: str
    seed: int
    inputs: dict[str, np.ndarray]

    @property
    def label(self) -> str:
        return self.pattern if self.seed == 0 else f"{self.pattern}#{self.seed}"


def finfo(dtype: np.dtype) -> Any:
    """numpy's finfo, or ml_dtypes' for bfloat16."""
    if dtype.name == "bfloat16":
        import ml_dtypes

        return ml_dtypes.finfo(dtype)
    return np.finfo(dtype)


def replaced(value: np.ndarray, pattern: str, seed: int, rng: np.random.Generator
             ) -> np.ndarray:
    """`value` with the positions `pattern` picks (PATTERNS) set to its special values."""
    values, placement = PATTERNS[pattern]
    specials = np.asarray(values(finfo(value.dtype)), np.float64)
    out = value.copy().reshape(-1)
    if placement == "one":
        picks = rng.integers(out.size, size=1)
    elif placement == "pair":
        picks = np.asarray([0, out.size - 1]) if seed == 0 else \
            rng.choice(out.size, size=min(2, out.size), replace=False)
        specials = specials[:len(picks)]
    else:
        mask = rng.random(out.size) < SHARE
        mask[[0, -1]] = True  # the ends of the first and the last row
        picks = np.flatnonzero(mask)
        specials = specials[rng.integers(len(specials), size=len(picks))]
    out[picks] = specials.astype(out.dtype)
    return out.reshape(value.shape)


def variants(case: ns.Case, patterns: Sequence[str] = tuple(PATTERNS), seeds: int = 1
             ) -> list[Variant]:
    """The variants of `case`'s inputs: each pattern with each seed, drawn from a
    generator seeded by the case's name, the pattern and the seed. A "pair" pattern
    fills one input, the seed's turn (a product of two inputs' values near the limit
    would overflow by the order of its sum, as PATTERNS says); the others fill every
    fuzzed input."""
    names = fuzz_inputs(case)
    out = []
    for seed in range(seeds):
        for pattern in patterns:
            rng = np.random.default_rng(zlib.crc32(f"{case.name}:{pattern}:{seed}".encode()))
            filled = [names[seed % len(names)]] if PATTERNS[pattern][1] == "pair" else names
            inputs = {n: replaced(v, pattern, seed, rng) if n in filled else v
                      for n, v in case.inputs.items()}
            out.append(Variant(pattern, seed, inputs))
    return out


def eligible(cases: Sequence[ns.Case]) -> list[ns.Case]:
    """The cases the fuzz may take: not an expected failure of the node suite, not
    skipped (skip_reason)."""
    return [c for c in cases if not ns.xfail_reason(c.name) and not skip_reason(c)]


def suite_selection(cases: Sequence[ns.Case], target: str) -> list[ns.Case]:
    """The cases the node suite compiles for `target` (compiled_sample for llvm,
    c_sample for c) that the fuzz may take: their modules are compiled once for both."""
    sample = ns.compiled_sample(cases) if target == "llvm" else ns.c_sample(cases)
    names = {c.name for c in eligible(sample)}
    return [c for c in sample if c.name in names]


# --------------------------------------------------------------------------- comparison

def differing(got: np.ndarray, want: np.ndarray, rtol: float, atol: float) -> np.ndarray:
    """The mask of elements that differ NaN-aware: a NaN equals a NaN, an infinity only
    the same infinity, finite floats within rtol/atol (+0 equals -0), 8-bit floats and
    other types exactly."""
    if not (float_dtype(want.dtype) or want.dtype.name.startswith("float8")):
        return np.asarray(got != want)
    g, w = got.astype(np.float64), want.astype(np.float64)
    nan_g, nan_w = np.isnan(g), np.isnan(w)
    finite = np.isfinite(g) & np.isfinite(w)
    exact = want.dtype.name.startswith("float8")
    with np.errstate(all="ignore"):
        close = np.abs(g - w) <= (0 if exact else atol + rtol * np.abs(w))
        same = np.where(finite, close, g == w) | (nan_g & nan_w)
    return np.asarray(~same)


def difference(case_name: str, got: Sequence[np.ndarray], want: Sequence[np.ndarray],
               inputs: dict[str, np.ndarray], examples: int = 3) -> str | None:
    """None when kiln's outputs `got` equal onnxruntime's `want` NaN-aware, else a
    description: the output, how many elements differ, and a few of them with the
    inputs' values there (inputs of the output's shape)."""
    if len(got) != len(want):
        return f"{len(got)} outputs, onnxruntime {len(want)}"
    for k, (g, w) in enumerate(zip(got, want)):
        g, w = np.asarray(g), np.asarray(w)
        if g.dtype != w.dtype or g.shape != w.shape:
            return f"output {k}: {g.dtype}{list(g.shape)}, onnxruntime {w.dtype}{list(w.shape)}"
        bad = differing(g, w, *(ns.TOLERANCE.get(case_name) or ns.float_tolerance(w.dtype)))
        if not bad.any():
            continue
        where = [tuple(int(i) for i in ix) for ix in np.argwhere(bad)[:examples]]
        shown = "; ".join(_example(ix, g, w, inputs) for ix in where)
        return f"output {k}: {int(bad.sum())}/{bad.size} differ: {shown}"
    return None


def _example(ix: tuple[int, ...], got: np.ndarray, want: np.ndarray,
             inputs: dict[str, np.ndarray]) -> str:
    """One differing element: its index, kiln's and onnxruntime's values, and the
    values of the inputs of the same shape there."""
    at = ", ".join(f"{n}={_num(v[ix])}" for n, v in inputs.items() if v.shape == got.shape)
    return f"{list(ix)} kiln {_num(got[ix])} ort {_num(want[ix])}" + (f" ({at})" if at else "")


def _num(value: Any) -> str:
    return f"{float(value):.4g}" if np.asarray(value).dtype.kind not in "biu" else str(value)


# --------------------------------------------------------------------------- onnxruntime

@dataclass(frozen=True)
class Job:
    """What onnxruntime runs for one case: the prepared model and a list of feeds (the
    case's own inputs first), with the expected outputs giving the output types."""

    name: str
    model: bytes
    want: tuple[np.ndarray, ...]
    feeds: list[dict[str, np.ndarray]]


def run_jobs_in_process(jobs: Sequence[Job]) -> dict[str, str | list[Any]]:
    """Case name -> onnxruntime's outputs per feed (an error text for a feed it
    refused), or an error text where it cannot load the model. One intra-op thread:
    onnxruntime's reductions then sum in one order on every host."""
    import onnx
    import onnxruntime as ort

    from support.reference import ort_session

    options = ort.SessionOptions()
    options.log_severity_level = 4
    options.intra_op_num_threads = 1
    results: dict[str, str | list[Any]] = {}
    for job in jobs:
        try:
            session = ort_session(onnx.load_from_string(job.model), options)
        except Exception as exc:  # onnxruntime raises its own types
            results[job.name] = _text(exc)
            continue
        runs: list[Any] = []
        for feeds in job.feeds:
            try:
                runs.append(ns.session_outputs(session, feeds, job.want))
            except Exception as exc:  # a refused feed is an outcome
                runs.append(_text(exc))
        results[job.name] = runs
    return results


def _text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"


def run_onnxruntime(jobs: Sequence[Job]) -> dict[str, str | list[Any]]:
    """run_jobs_in_process in a child process (onnxruntime is native code that could
    crash on a value); RuntimeError naming the exit status if the child dies."""
    import pickle

    from support.processes import child_env

    with tempfile.TemporaryDirectory(prefix="kiln-nonfinite-") as tmp:
        given, back = Path(tmp) / "jobs.pickle", Path(tmp) / "results.pickle"
        given.write_bytes(pickle.dumps(list(jobs), protocol=pickle.HIGHEST_PROTOCOL))
        child = subprocess.run([sys.executable, __file__, str(given), str(back)],
                               capture_output=True, text=True, check=False,
                               env=child_env(Path(__file__).parent))
        if child.returncode != 0:
            raise RuntimeError(f"the onnxruntime run exited with status "
                               f"{child.returncode}: {child.stderr[-2000:]}")
        result: dict[str, str | list[Any]] = pickle.loads(back.read_bytes())
    return result


# --------------------------------------------------------------------------- the fuzz

@dataclass(frozen=True)
class Result:
    """One variant of one case on one target: "same", "differ" (kiln's outputs differ,
    or only one side raised) with the detail, and the case's op types."""

    case: str
    variant: str
    target: str
    status: str
    detail: str
    op_types: frozenset[str]

    @property
    def key(self) -> str:
        """What ALLOW's case patterns search: "case:variant@target"."""
        return f"{self.case}:{self.variant}@{self.target}"


@dataclass
class Report:
    """A fuzz run: every variant's Result, and the cases left out with the reason."""

    target: str
    results: list[Result] = field(default_factory=list)
    left_out: dict[str, str] = field(default_factory=dict)
    # wall seconds spent compiling, in onnxruntime's child, running and comparing kiln
    seconds: dict[str, float] = field(
        default_factory=lambda: dict.fromkeys(("compile", "onnxruntime", "kiln"), 0.0))

    def cases(self) -> set[str]:
        return {r.case for r in self.results}

    def op_types(self) -> set[str]:
        return {op for r in self.results for op in r.op_types}

    def differences(self) -> list[Result]:
        return [r for r in self.results if r.status != "same"]

    def summary(self) -> str:
        """One line: what was fuzzed, what differs, where the time went."""
        times = ", ".join(f"{k} {v:.1f} s" for k, v in self.seconds.items())
        return (f"non-finite fuzz ({self.target}): {len(self.op_types())} op types, "
                f"{len(self.cases())} cases, {len(self.results)} variants, "
                f"{len(self.differences())} differing; {len(self.left_out)} cases left "
                f"out; {times}")


def allowed_by(result: Result) -> list[str]:
    """The ALLOW entries that cover `result`: an op type (a capitalized name) of its
    graph, or a pattern searched in its key ("case:variant@target")."""
    return [k for k in ALLOW
            if (k in result.op_types if OP_TYPE.fullmatch(k) else re.search(k, result.key))]


# An ALLOW key naming an op type rather than a case pattern.
OP_TYPE = re.compile(r"[A-Z][A-Za-z0-9]*")


def fuzz(cases: Sequence[ns.Case], target: str = "llvm",
         patterns: Sequence[str] = tuple(PATTERNS), seeds: int = 1,
         pool: Sequence[ns.Case] = ()) -> Report:
    """Fuzz `cases` on `target`, then the op types of the `pool` cases that no fuzzed
    case has: the pool's cases with them go to onnxruntime, and of those it passes the
    smallest with each op type (node_suite.op_cover) is fuzzed. A round runs every
    variant through onnxruntime (one child process), compiles the cases onnxruntime
    passes (node_suite.run_compiled, which reuses what this process compiled), runs
    them through kiln and compares. A case is left out where skip_reason gives a
    reason, onnxruntime does not pass it on the prepared model or kiln fails it."""
    report = Report(target)
    done = _fuzz_round(cases, target, patterns, seeds, report, list)
    tried = {c.name for c in cases}
    missing = {op for c in pool for op in c.op_types} - report.op_types()
    more = [c for c in pool if c.name not in tried and c.op_types & missing]
    if more:
        _fuzz_round(more, target, patterns, seeds, report,
                    lambda passing: ns.op_cover(passing, done))
    return report


def _fuzz_round(cases: Sequence[ns.Case], target: str, patterns: Sequence[str],
                seeds: int, report: Report,
                pick: Callable[[list[ns.Case]], list[ns.Case]]) -> list[ns.Case]:
    """Fuzz the cases `pick` takes of those of `cases` onnxruntime passes into
    `report`; the cases fuzzed."""
    chosen = []
    for case in cases:
        why = skip_reason(case)
        if why:
            report.left_out[case.name] = why
        else:
            chosen.append(case)
    plans = {c.name: variants(c, patterns, seeds) for c in chosen}
    start = time.perf_counter()
    ort = _onnxruntime_runs(chosen, plans, (tuple(patterns), seeds))
    report.seconds["onnxruntime"] += time.perf_counter() - start
    chosen = pick([c for c in chosen if _onnxruntime_passes(c, ort[c.name], report)])
    start = time.perf_counter()
    outcomes = ns.run_compiled(chosen, target)
    report.seconds["compile"] += time.perf_counter() - start
    start = time.perf_counter()
    fuzzed = []
    for case, outcome in zip(chosen, outcomes):
        if outcome.status != "pass":
            report.left_out[case.name] = f"kiln: {outcome.status} {outcome.reason}"
            continue
        runs = ort[case.name]
        assert not isinstance(runs, str)
        report.results += _compare_case(case, plans[case.name], runs[1:], target)
        fuzzed.append(case)
    report.seconds["kiln"] += time.perf_counter() - start
    return fuzzed


# (case_key, (patterns, seeds)) -> onnxruntime's runs of the case's own inputs and its
# variants: neither depends on the target (`variants` draws from the case's name), so
# the second target's fuzz in a process reuses the first's child process's results.
_ORT_RUNS: dict[tuple[str, Any], str | list[Any]] = {}


def _onnxruntime_runs(cases: Sequence[ns.Case], plans: dict[str, list[Variant]], draw: Any
                      ) -> dict[str, str | list[Any]]:
    """Case name -> run_onnxruntime's result for `cases`, run in one child process for
    the cases this process has not run with the same patterns and seeds (`draw`)."""
    todo = [c for c in cases if (ns.case_key(c), draw) not in _ORT_RUNS]
    if todo:
        ran = run_onnxruntime([Job(c.name, c.model.SerializeToString(), c.outputs,
                                   [c.inputs] + [v.inputs for v in plans[c.name]])
                               for c in todo])
        _ORT_RUNS.update({(ns.case_key(c), draw): ran[c.name] for c in todo})
    return {c.name: _ORT_RUNS[(ns.case_key(c), draw)] for c in cases}


def _onnxruntime_passes(case: ns.Case, runs: str | list[Any], report: Report) -> bool:
    """Whether onnxruntime passes the case's own inputs (runs[0]) on the prepared
    model; if not, the case is left out in `report` with the reason."""
    if isinstance(runs, str) or isinstance(runs[0], str):
        report.left_out[case.name] = f"onnxruntime: {runs if isinstance(runs, str) else runs[0]}"
        return False
    try:
        ns.check_outputs(runs[0], case.outputs, ns.TOLERANCE.get(case.name))
    except AssertionError:
        report.left_out[case.name] = "onnxruntime fails the prepared case"
        return False
    return True


def _compare_case(case: ns.Case, plan: list[Variant], ort: list[Any], target: str
                  ) -> list[Result]:
    """The Results of `case`'s variants: kiln's outputs against onnxruntime's (`ort`,
    one list of outputs or one error text per variant)."""
    function = ns.compiled_case(case, target)
    assert function is not None
    results = []
    for variant, want in zip(plan, ort):
        try:
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                got: Any = function(variant.inputs)
        except Exception as exc:  # a raising kernel is a difference
            got = _text(exc)
        detail = _detail(case.name, got, want, variant.inputs)
        results.append(Result(case.name, variant.label, target,
                              "differ" if detail else "same", detail or "", case.op_types))
    return results


def _detail(name: str, got: str | Sequence[np.ndarray], want: str | Sequence[np.ndarray],
            inputs: dict[str, np.ndarray]) -> str | None:
    """How kiln's outputs (or error text) `got` differ from onnxruntime's `want`; None
    when they agree (both raised, or `difference` finds none)."""
    if isinstance(got, str) or isinstance(want, str):
        if isinstance(got, str) and isinstance(want, str):
            return None
        return (f"kiln {got if isinstance(got, str) else 'ran'}; onnxruntime "
                f"{want if isinstance(want, str) else 'ran'}")
    return difference(name, got, want, inputs)


if __name__ == "__main__":
    import pickle

    if len(sys.argv) != 3:
        raise SystemExit("usage: nonfinite.py JOBS.pickle RESULTS.pickle  (onnxruntime's "
                         "outputs for the jobs run_onnxruntime pickled)")
    Path(sys.argv[2]).write_bytes(pickle.dumps(
        run_jobs_in_process(pickle.loads(Path(sys.argv[1]).read_bytes())),
        protocol=pickle.HIGHEST_PROTOCOL))
