"""The full non-finite fuzz, run by hand: every case of the ONNX node suite that kiln
runs and onnxruntime passes, with more variants than the suite's test, on llvm and c
(docs/onnx.md, *Non-finite values*; the machinery is tests/frontend/nonfinite.py).

    python bench/fuzz_nonfinite.py [--target llvm|c|both] [--seeds 3] [--filter REGEX]
                                   [--sample] [--verbose]
    python bench/fuzz_nonfinite.py --check-onnxruntime

Prints, per target, a table of the differences from onnxruntime by family (the case's
op type, or the op a function body expands) and pattern, then the first difference of
each (every one with `--verbose`) with the allow-list entry that covers it
(nonfinite.ALLOW) or NEW, the cases left out and the counts; last, the allow-list
entries no difference matched. `--sample` fuzzes the cases the
suite's test fuzzes (the node suite's compiled samples) instead of every case: the
full run compiles ~1,300 cases per target, minutes on two cores.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "frontend")]

import node_suite as ns  # noqa: E402
import nonfinite as nf  # noqa: E402


def run(target: str, seeds: int, name_filter: str | None, sample: bool) -> nf.Report:
    """The fuzz of one target: every eligible case (or the suite's selection)."""
    cases, _ = ns.all_cases(name_filter)
    pool = nf.eligible(cases)
    first = nf.suite_selection(cases, target) if sample else pool
    return nf.fuzz(first, target, seeds=seeds, pool=pool)


def family(result: nf.Result, single: dict[str, str]) -> str:
    """What a difference is about: the case's one op type (Constant aside), else that of
    the case it expands (`single`: case name -> its one op type), else its op types."""
    ops = sorted(result.op_types - {"Constant"})
    if len(ops) == 1:
        return ops[0]
    base = re.sub(r"_expanded(_ver\d+)?(\[\d+\])?$", "", result.case)
    return f"{single[base]} (expanded)" if base in single else ", ".join(ops)


def print_report(report: nf.Report, single: dict[str, str], verbose: bool) -> set[str]:
    """Print `report`'s differences: per family and pattern, their count and the first
    one (every one with `verbose`); the ALLOW entries that matched."""
    groups: dict[str, dict[str, list[nf.Result]]] = defaultdict(lambda: defaultdict(list))
    for r in report.differences():
        groups[family(r, single)][r.variant.split("#")[0]].append(r)
    used = {k for r in report.differences() for k in nf.allowed_by(r)}
    print(f"\n## {report.target}\n")
    print(f"| family | {' | '.join(nf.PATTERNS)} |")
    print(f"|---|{'---:|' * len(nf.PATTERNS)}")
    for name in sorted(groups):
        counts = [str(len(groups[name].get(p, []))) for p in nf.PATTERNS]
        print(f"| {name} | {' | '.join(counts)} |")
    for name in sorted(groups):
        print(f"\n### {name}")
        for pattern, results in groups[name].items():
            for r in results if verbose else results[:1]:
                allowed = nf.allowed_by(r)
                tag = f"allowed: {allowed[0]}" if allowed else "NEW"
                print(f"  {r.case} [{r.variant}] ({tag}) {r.detail}")
            if not verbose and len(results) > 1:
                print(f"  ... {len(results) - 1} more [{pattern}]")
    print("\nleft out:")
    for name, why in sorted(report.left_out.items()):
        print(f"  {name}: {why[:160]}")
    print("\n" + report.summary())
    return used


def check_onnxruntime(seeds: int, name_filter: str | None) -> None:
    """Run onnxruntime twice on every eligible case's variants (two child processes)
    and print the cases whose outputs differ between the runs (nonfinite.SKIP_CASES
    takes those onnx leaves undefined)."""
    cases, _ = ns.all_cases(name_filter)
    pool = nf.eligible(cases)
    jobs = [nf.Job(c.name, c.model.SerializeToString(), c.outputs,
                   [v.inputs for v in nf.variants(c, seeds=seeds)]) for c in pool]
    first, second = nf.run_onnxruntime(jobs), nf.run_onnxruntime(jobs)
    unstable = [c.name for c in pool if not _same_runs(first[c.name], second[c.name])]
    print(f"onnxruntime twice on {len(pool)} cases: {len(unstable)} differ between runs")
    for name in unstable:
        print(f"  {name}")


def _same_runs(a: str | list, b: str | list) -> bool:
    """Whether two onnxruntime results of one job agree exactly, NaN-aware."""
    if isinstance(a, str) or isinstance(b, str):
        return a == b
    for x, y in zip(a, b):
        if isinstance(x, str) or isinstance(y, str):
            if x != y:
                return False
            continue
        for g, w in zip(x, y):
            g, w = np.asarray(g), np.asarray(w)
            if g.shape != w.shape or nf.differing(g, w, 0.0, 0.0).any():
                return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", choices=("llvm", "c", "both"), default="both")
    parser.add_argument("--seeds", type=int, default=3,
                        help="position draws per pattern (the suite's test: 1)")
    parser.add_argument("--filter", help="only cases whose name matches this regex")
    parser.add_argument("--sample", action="store_true",
                        help="the suite's selection instead of every case")
    parser.add_argument("--verbose", action="store_true", help="print every difference")
    parser.add_argument("--check-onnxruntime", action="store_true",
                        help="only run onnxruntime twice and print what differs")
    args = parser.parse_args()
    if args.check_onnxruntime:
        check_onnxruntime(args.seeds, args.filter)
        return
    cases, _ = ns.all_cases(args.filter)
    single = {c.name: next(iter(c.op_types - {"Constant"})) for c in cases
              if len(c.op_types - {"Constant"}) == 1}
    used: set[str] = set()
    for target in ("llvm", "c") if args.target == "both" else (args.target,):
        report = run(target, args.seeds, args.filter, args.sample)
        used |= print_report(report, single, args.verbose)
    unused = sorted(set(nf.ALLOW) - used)
    print(f"\nallow-list entries without a difference in this run: {unused or 'none'}")


if __name__ == "__main__":
    main()
