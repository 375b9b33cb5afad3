"""Regenerate the conformance section of docs/onnx.md from a run of the ONNX node suite.

    .venv/bin/python tests/frontend/onnx_report.py [--docs docs/onnx.md]

Runs the same paths as test_onnx_node_suite.py (the interpreter on every
runnable case, `llvm` and `c` + jit on the compiled samples, onnxruntime on every
case) and rewrites the text between the BEGIN/END markers of docs/onnx.md with
per-op counts and, for every case onnxruntime passes and kiln does not, the
reason recorded in node_suite (XFAIL, MISSING_OP_REASONS).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import node_suite as ns

BEGIN = "<!-- BEGIN GENERATED: tests/frontend/onnx_report.py -->"
END = "<!-- END GENERATED -->"
# The table's columns; the first four after the op type follow from the collection
# alone (collection_counts), which is what the cheap staleness test compares.
COLUMNS = ("op type", "cases", "onnxruntime pass", "kiln pass", "kiln expected failures",
           "kiln not run", "`llvm` (pass/compiled)", "`c` (pass/compiled)", "imported as")


@dataclass
class SuiteResults:
    interp: list[ns.Outcome]       # the interpreter on every runnable case (but COMPILED_ONLY)
    llvm: list[ns.Outcome]         # compiled_sample on llvm
    c: list[ns.Outcome]            # c_sample on c
    unsupported: list[ns.Outcome]  # the cases kiln does not run
    ort: list[ns.Outcome]          # onnxruntime on every case
    total: int                     # cases in the suite

    def kiln_final(self) -> dict[str, ns.Outcome]:
        """Each case's kiln outcome: the interpreter's, the compiled one for COMPILED_ONLY
        cases, "unsupported" for the cases not run."""
        final = {o.name: o for o in self.interp}
        for o in self.llvm:
            final.setdefault(o.name, o)
        for o in self.unsupported:
            final.setdefault(o.name, o)
        return final


def collect() -> SuiteResults:
    cases, unsupported = ns.all_cases()
    interp = [ns.run_case(c, ns.execute_interpreter) for c in cases
              if not ns.compiled_only(c.name)]
    return SuiteResults(interp, ns.run_compiled(ns.compiled_sample(cases), "llvm"),
                        ns.run_compiled(ns.c_sample(cases), "c"), unsupported,
                        ns.run_onnxruntime(), len(ns.raw_cases()))


def gap(results: SuiteResults) -> list[tuple[ns.Outcome, ns.Outcome]]:
    """(onnxruntime outcome, kiln outcome) of every case onnxruntime passes and kiln
    does not, by name."""
    final = results.kiln_final()
    return [(o, final[o.name]) for o in sorted(results.ort, key=lambda o: o.name)
            if o.status == "pass" and final[o.name].status != "pass"]


def collection_counts(cases: list[ns.Case], unsupported: list[ns.Outcome]
                      ) -> dict[str, tuple[int, int, int, int]]:
    """Op type -> (cases, kiln pass, kiln expected failures, kiln not run) as the
    collection alone decides them (every run case that is not an XFAIL passes: the
    node-suite tests fail otherwise)."""
    rows: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for c in cases:
        for op in c.op_types:
            rows[op][0] += 1
            rows[op][2 if ns.xfail_reason(c.name) else 1] += 1
    for o in unsupported:
        for op in o.op_types:
            rows[op][0] += 1
            rows[op][3] += 1
    return {op: (r[0], r[1], r[2], r[3]) for op, r in sorted(rows.items())}


def table_counts(section: str) -> dict[str, tuple[int, int, int, int]]:
    """The collection_counts columns of the table in a generated section."""
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != len(COLUMNS) or not line.startswith("| ") or \
                cells[0] == COLUMNS[0] or set(cells[0]) <= {"-", ":"}:
            continue
        nums = [int(cells[k]) if cells[k] else 0 for k in (1, 3, 4, 5)]
        rows[cells[0]] = (nums[0], nums[1], nums[2], nums[3])
    return rows


def render(results: SuiteResults) -> str:
    final = results.kiln_final()
    kiln = Counter(o.status for o in final.values())
    ort = Counter(o.status for o in results.ort)
    rows: dict[str, Counter[str]] = defaultdict(Counter)
    for o in final.values():
        for op in o.op_types:
            rows[op]["cases"] += 1
            rows[op][o.status] += 1
    for o in results.ort:
        for op in o.op_types:
            rows[op]["ort_pass"] += o.status == "pass"
    for target, outcomes in (("llvm", results.llvm), ("c", results.c)):
        for o in outcomes:
            for op in o.op_types:
                rows[op][target] += 1
                rows[op][target + "_pass"] += o.status == "pass"
    missed = gap(results)
    imported_as = _imported_as(results)
    lines = [
        BEGIN,
        "",
        f"Generated by `tests/frontend/onnx_report.py` (onnx {_version('onnx')}, "
        f"onnxruntime {_version('onnxruntime')}, {time.strftime('%Y-%m-%d')}).",
        "",
        f"- test cases in the suite: **{results.total}**",
        f"- onnxruntime (CPU, an InferenceSession on the case's own model, checked with "
        f"kiln's tolerances): pass **{ort['pass']}**; fails **{ort['fail']}**; refuses "
        f"(cannot load the model) **{ort['refused']}**",
        f"- kiln: run **{len(final) - kiln['unsupported']}** (every op type imported), "
        f"pass **{kiln['pass']}**; expected failures: **{kiln['xfail']}**; "
        f"unexpected failures: **{kiln['fail'] + kiln['xpass']}**; not run (an op type "
        f"or value kind kiln does not import): **{kiln['unsupported']}**",
        f"- cases onnxruntime passes and kiln does not: **{len(missed)}**, each with its "
        "reason below",
        f"- compiled and run through `jit()`: `llvm` **{len(results.llvm)}** "
        f"(pass: {sum(o.status == 'pass' for o in results.llvm)}), `c` **{len(results.c)}** "
        f"(pass: {sum(o.status == 'pass' for o in results.c)}); every op type kiln runs "
        "has a compiled case on each",
        "",
        "How the cases run: every input's shape is bound from its test data and graph "
        "inputs feeding a static operand (`STATIC_OPERANDS` in tests/frontend/node_suite.py) "
        "become initializers holding the test value; every runnable case runs through the "
        "reference interpreter after legalization (`COMPILED_ONLY` cases run compiled "
        "only); `compiled_sample` (the first case of every op-types/dtypes group of graphs "
        "of at most 10 nodes, plus a case of every op type) is compiled for `llvm`, and "
        "`c_sample` (a case of every op type) for `c`, in batches of 40 cases per module, "
        "and run through `jit()`; onnxruntime runs every case's own model in a child "
        "process. Outputs match with rtol 1e-4 / atol 1e-5 for float32/64, 1e-3 for "
        "float16, 8e-3 for bfloat16, exactly for integers and bools (`TOLERANCE` lists the "
        "exceptions), for kiln and onnxruntime alike.",
        "",
        "Per ONNX op type (a case counts for every op type of its graph; `_expanded` "
        "cases exercise the ops of a function's body). *Imported as*: `converter` (kiln's "
        "ONNX mapping), `function body` (no converter: ONNX defines the op by a function, "
        "which kiln imports, kiln/frontend/onnx/functions.py), `-` (not imported):",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|---|" + "---:|" * (len(COLUMNS) - 1),
    ]
    for op in sorted(rows):
        r = rows[op]
        compiled = [f"{r[t + '_pass']}/{r[t]}" if r[t] else "-" for t in ("llvm", "c")]
        lines.append(f"| {op} | {r['cases']} | {r['ort_pass']} | {r['pass']} | "
                     f"{r['xfail'] or ''} | {r['unsupported'] or ''} | {compiled[0]} | "
                     f"{compiled[1]} | {imported_as.get(op, '-')} |")
    lines += ["", "Cases onnxruntime passes and kiln does not, by reason (from the XFAIL "
              "and MISSING_OP_REASONS tables of tests/frontend/node_suite.py):", ""]
    by_reason: dict[str, list[str]] = defaultdict(list)
    for _, k in missed:
        by_reason[k.reason].append(k.name)
    for reason, names in sorted(by_reason.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        lines.append(f"- {reason} ({len(names)}): {', '.join(f'`{n}`' for n in names)}")
    lines += ["", "Expected failures (the XFAIL table of tests/frontend/node_suite.py):", ""]
    for pattern, reason in ns.XFAIL.items():
        count = sum(1 for o in final.values() if o.status == "xfail" and re.search(pattern,
                                                                                  o.name))
        lines.append(f"- `{pattern}` ({count} cases): {reason}")
    missing: Counter[str] = Counter()
    for o in results.unsupported:
        missing.update(ns.missing_by_case()[o.name] or ["(values)"])
    lines += ["", "Op types of the suite kiln does not import (cases needing each): why", ""]
    for op, n in sorted(missing.items()):
        why = ns.NON_TENSOR_REASON if op == "(values)" else ns.missing_op_reason(op)
        shown = "sequence or optional graph inputs/outputs" if op == "(values)" else op
        lines.append(f"- {shown} ({n}): {why}")
    lines += ["", END]
    return "\n".join(lines)


def _imported_as(results: SuiteResults) -> dict[str, str]:
    """Op type -> how kiln imports it (converter / function body), for the op types of
    the cases kiln runs."""
    from kiln.ops.onnx_map import converters

    table = converters()
    out = {}
    for o in results.kiln_final().values():
        if o.status == "unsupported":
            continue
        for op in o.op_types:
            known = op in table or any(key.endswith("." + op) for key in table)
            out[op] = "converter" if known else "function body"
    return out


def generated_section(path: Path) -> str:
    """The generated part of `path` (between the markers), for comparisons."""
    text = path.read_text()
    if BEGIN not in text or END not in text:
        raise ValueError(f"{path} lacks the markers {BEGIN!r} ... {END!r}")
    return BEGIN + text.split(BEGIN, 1)[1].split(END, 1)[0] + END


def _version(module: str) -> str:
    import importlib

    return str(importlib.import_module(module).__version__)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", default=str(Path(__file__).parents[2] / "docs" / "onnx.md"))
    args = parser.parse_args()
    results = collect()
    section = render(results)
    path = Path(args.docs)
    text = path.read_text() if path.exists() else f"# ONNX frontend\n\n{BEGIN}\n{END}\n"
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{path} lacks the markers {BEGIN!r} ... {END!r}")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    path.write_text(head + section + tail)
    bad = [o for o in results.interp + results.llvm + results.c
           if o.status in ("fail", "xpass")]
    for o in bad:
        print(f"{o.status.upper()} {o.name}: {o.reason}", file=sys.stderr)
    print(f"wrote {path}: {sum(o.status == 'pass' for o in results.interp)} interpreter "
          f"passes, {len(bad)} unexpected outcomes")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
