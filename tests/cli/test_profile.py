"""Per-kernel profiling: `kiln compile --profile`, `kiln run --profile`, `Module.profile()`.

The CNN is compiled with timers on both native backends and run in fresh
processes; the profile's kernels must be the lowered `main`'s CallFunc callees,
their times must add up to the library-timed whole call, the tables, JSON and
every aggregate must agree, and the trace must satisfy the trace-event format.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from kiln_cli import ROOT, one_line_error, run_kiln

import kiln
from kiln.ir.tensor import CallFunc
from kiln.ir.visitor import iter_stmts

CNN = ROOT / "models" / "tiny_cnn.onnx"
def lowered_callees() -> list[str]:
    """The kernels the lowered graph `main` calls, in call order."""
    ex = kiln.compile(str(CNN), "llvm")
    return [s.func for s in iter_stmts(ex.ir["main"].body) if isinstance(s, CallFunc)]


# The Trace Event Format's "JSON Object Format" as chrome://tracing and Perfetto read it
# (complete events "X" with ts/dur in microseconds, metadata events "M").
COMPLETE_EVENT = {
    "type": "object", "required": ["name", "ph", "ts", "dur", "pid", "tid"],
    "properties": {"name": {"type": "string"}, "cat": {"type": "string"},
                   "ph": {"const": "X"}, "ts": {"type": "number", "minimum": 0},
                   "dur": {"type": "number", "minimum": 0}, "pid": {"type": "integer"},
                   "tid": {"type": "integer"}, "args": {"type": "object"}}}
METADATA_EVENT = {
    "type": "object", "required": ["name", "ph", "pid", "args"],
    "properties": {"name": {"enum": ["process_name", "thread_name", "process_sort_index",
                                     "thread_sort_index"]},
                   "ph": {"const": "M"}, "pid": {"type": "integer"},
                   "tid": {"type": "integer"},
                   "args": {"type": "object", "required": ["name"]}}}
TRACE_SCHEMA = {
    "type": "object", "required": ["traceEvents"],
    "properties": {"traceEvents": {"type": "array",
                                   "items": {"anyOf": [COMPLETE_EVENT, METADATA_EVENT]}},
                   "displayTimeUnit": {"enum": ["ms", "ns"]},
                   "otherData": {"type": "object"}}}
JSON_TYPES: dict[str, Any] = {"object": dict, "array": list, "string": str,
                              "integer": int, "number": (int, float)}


def schema_errors(value: Any, schema: dict[str, Any], where: str = "$") -> list[str]:
    """The subset of JSON Schema TRACE_SCHEMA uses, checked strictly by hand (a host
    without the jsonschema package still checks the trace)."""
    kind = schema.get("type")
    if kind and (not isinstance(value, JSON_TYPES[kind]) or isinstance(value, bool)):
        return [f"{where}: not {kind}"]
    errors = []
    if "const" in schema and value != schema["const"]:
        errors.append(f"{where}: {value!r} != {schema['const']!r}")
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{where}: {value!r} not in {schema['enum']}")
    if "minimum" in schema and value < schema["minimum"]:
        errors.append(f"{where}: {value} < {schema['minimum']}")
    if "anyOf" in schema and all(schema_errors(value, s, where) for s in schema["anyOf"]):
        errors.append(f"{where}: matches none of anyOf")
    errors += [f"{where}: no {key!r}" for key in schema.get("required", ()) if key not in value]
    for key, sub in schema.get("properties", {}).items():
        if isinstance(value, dict) and key in value:
            errors += schema_errors(value[key], sub, f"{where}.{key}")
    for i, item in enumerate(value if "items" in schema else ()):
        errors += schema_errors(item, schema["items"], f"{where}[{i}]")
    return errors


def check_trace(trace: dict[str, Any]) -> None:
    """Valid against TRACE_SCHEMA (with jsonschema when installed, and by hand)."""
    try:
        import jsonschema
    except ImportError:
        pass
    else:
        jsonschema.validate(trace, TRACE_SCHEMA)
    assert schema_errors(trace, TRACE_SCHEMA) == []
    assert schema_errors({"traceEvents": [{"ph": "X", "name": "k", "ts": -1, "dur": 1,
                                           "pid": 1, "tid": 1}]}, TRACE_SCHEMA)


@pytest.mark.parametrize("backend", ["llvm", "c"])
def test_run_profile_aggregates_json_and_trace(tmp_path: Path, backend: str) -> None:
    done = run_kiln("compile", str(CNN), "-t", backend, "--profile", "-o", "cnn.so",
                    cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    ran = run_kiln("run", "cnn.so", "--fill", "random", "--repeat", "30", "--warmup", "3",
                   "--profile", "--profile-by", "kernel,op,group", "--top", "100",
                   "--profile-json", "p.json", "--trace", "t.json", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    callees = lowered_callees()
    prof = json.loads((tmp_path / "p.json").read_text())
    sites = prof["sites"]
    assert [s["kernel"] for s in sites] == callees
    assert prof["calls"] == 30 and all(s["calls"] == 30 for s in sites)
    assert all(s["op"] in kiln.ops.list_ops() for s in sites), sites
    summed = sum(s["total_ns"] for s in sites)
    for key in ("by_kernel", "by_op", "by_group"):
        rows = prof[key]
        assert sum(r["total_ns"] for r in rows) == summed
        assert sum(r["calls"] for r in rows) == 30 * len(callees)
        assert all(r["min_ns"] <= r["mean_ns"] for r in rows)
        assert all(0 <= r["median_ns"] <= r["p90_ns"] for r in rows)
        medians = [r["median_ns"] for r in rows]
        assert medians == sorted(medians, reverse=True)  # the median leads
    assert {r["name"] for r in prof["by_kernel"]} == set(callees)
    whole = prof["whole_call"]["total_ns"]
    assert 0.8 * whole <= summed <= 1.2 * whole, prof
    # the text tables: one row per kernel, op type and group, in the JSON's order
    text = ran.stdout.splitlines()
    for key, heading in (("by_kernel", "by kernel"), ("by_op", "by op type"),
                         ("by_group", "by fused group")):
        start = next(i for i, x in enumerate(text) if x.startswith(heading))
        rows = text[start + 1:start + 1 + len(prof[key])]
        assert text[start].split()[-8:] == ["median", "ms", "p90", "ms", "calls", "min", "ms",
                                            "share"]
        assert [r.split()[0] for r in rows] == [r["name"] for r in prof[key]]
        assert [float(r.split()[1]) for r in rows] == \
            [round(r["median_ns"] / 1e6, 4) for r in prof[key]]
        assert [int(r.split()[3]) for r in rows] == [r["calls"] for r in prof[key]]
    trace = json.loads((tmp_path / "t.json").read_text())
    check_trace(trace)
    calls = [e for e in trace["traceEvents"] if e.get("cat") == "call"]
    kernels = [e for e in trace["traceEvents"] if e.get("cat") == "kernel"]
    assert len(calls) == 30 and len(kernels) == 30 * len(callees)
    for c, call in enumerate(calls):
        mine = kernels[c * len(callees):(c + 1) * len(callees)]
        assert [e["name"] for e in mine] == callees
        assert all(call["ts"] <= e["ts"] and e["ts"] + e["dur"] <= call["ts"] + call["dur"]
                   + 1e-3 for e in mine)
        assert all(a["ts"] + a["dur"] <= b["ts"] + 1e-3 for a, b in pairwise(mine))
        assert all(e["args"]["op"] and e["args"]["outputs"] for e in mine)


def test_top_rows_and_the_other_row(tmp_path: Path) -> None:
    kiln.compile(str(CNN), "llvm", profile=True).export_library(tmp_path / "cnn.so")
    ran = run_kiln("run", "cnn.so", "--fill", "random", "--repeat", "5", "--profile",
                   "--profile-by", "kernel", "--top", "2", "--profile-json", "p.json",
                   cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    prof = json.loads((tmp_path / "p.json").read_text())
    lines = ran.stdout.splitlines()
    start = lines.index(next(x for x in lines if x.startswith("by kernel")))
    assert [x.split()[0] for x in lines[start + 1:start + 3]] == \
        [r["name"] for r in prof["by_kernel"][:2]]
    rest = prof["by_kernel"][2:]
    other = lines[start + 3]
    assert other.startswith(f"other ({len(rest)} kernels)")
    assert int(other.split(")")[1].split()[1]) == sum(r["calls"] for r in rest)
    bad = one_line_error(run_kiln("run", "cnn.so", "--fill", "random", "--profile",
                                  "--profile-by", "layer", cwd=tmp_path))
    assert "--profile-by" in bad and "op, group, kernel" in bad


def test_one_descheduled_call_moves_neither_median_nor_order() -> None:
    """Ten calls, one of them 100 times slower in the conv (the OS took the core away):
    the total and the mean of the conv follow the outlier, its median and the order of
    the table do not."""
    from kiln.cli.profiling import Recording, Site, aggregate, table, to_json

    conv = [1_000_000] * 9 + [100_000_000]
    rec = Recording("main", [Site(0, "conv2d", ns=conv, calls=[1] * 10),
                             Site(1, "fused_matmul_add", ns=[2_000_000] * 10, calls=[1] * 10)],
                    whole_ns=[c + 2_000_000 for c in conv])
    rows = aggregate(rec, "op")
    assert [r.name for r in rows] == ["matmul", "conv2d"]
    assert rows[1].median_ns() == 1_000_000 and rows[1].p90_ns() == 1_000_000
    assert rows[1].mean_ns() > rows[0].mean_ns()  # what a mean-led table would have shown
    lines = table(rec, ["op"]).splitlines()
    assert "median 3.0000 ms per call, p90 3.0000 ms" in lines[0]
    assert lines[2].split()[:3] == ["matmul", "2.0000", "2.0000"]
    assert lines[2].split()[-1] == "66.7%"
    whole = to_json(rec)["whole_call"]
    assert whole["median_ns"] == 3_000_000 and whole["total_ns"] == 9 * 3_000_000 + 102_000_000


def test_kernel_names_give_group_and_op_type() -> None:
    from kiln.cli.kernel_names import fused_group, kernel_ops, op_type

    name = "fused_matmul_packed_add_divide_erf_add_multiply_multiply_3"
    assert fused_group(name) == name[:-2]
    assert kernel_ops(name) == ["matmul_packed", "add", "divide", "erf", "add", "multiply",
                                "multiply"]
    assert op_type("layer_norm_2") == "layer_norm" and op_type("conv2d") == "conv2d"
    assert op_type("fused_not_an_op_x") == "not_an_op_x"


@pytest.mark.parametrize("backend", ["llvm", "c"])
def test_python_profile_in_a_fresh_process(tmp_path: Path, backend: str) -> None:
    """profile() rows from Python; the whole call is timed in ns (a fraction of the wall
    time around the same calls, which adds Python's argument packing; a busy machine may
    stretch the wall time, hence the loose bound); reset zeroes."""
    lib = tmp_path / "cnn.so"
    kiln.compile(str(CNN), backend, profile=True).export_library(lib)
    script = textwrap.dedent(f"""
        import time, numpy as np
        from kiln.runtime import load_module
        lib = load_module({str(lib)!r})
        x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)
        lib["main"](x)
        lib.profile_reset()
        assert all(r.calls == 0 and r.total_ns == 0 for r in lib.profile())
        t0 = time.perf_counter_ns()
        for _ in range(200):
            lib["main"](x)
        wall = time.perf_counter_ns() - t0
        rows = lib.profile()
        whole = [r for r in rows if r.kernel is None]
        assert len(whole) == 1 and whole[0].calls == 200, rows
        # Nanoseconds: inside the wall time, and not 1000 times too small (microseconds).
        assert 0.01 * wall < whole[0].total_ns < wall, (whole, wall)
        print(",".join(r.kernel for r in rows if r.kernel))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().split(",") == lowered_callees()


def test_no_timer_code_without_profile(built: Path) -> None:
    import ctypes

    lib = ctypes.CDLL(str(built / "mlp.so"))
    assert hasattr(lib, "kiln_main") and not hasattr(lib, "kiln__profile_read")
    for backend in ("llvm", "c"):
        ex = kiln.compile(str(CNN), backend)
        assert "profile" not in ex.metadata
        host = next(a for a in ex.artifacts if a.file_name == "host.c")
        assert not re.search(r"^#define KILN_HOST_PROFILE \d", bytes(host.content).decode(),
                             re.M)
        kernels = [a for a in ex.artifacts if a.codegen_id == backend]
        assert all(b"profile_start" not in bytes(a.content) for a in kernels)


def test_profiled_host_c_compiles_warning_free(tmp_path: Path) -> None:
    ex = kiln.compile(str(CNN), "c", profile=True)
    for name in ("host.c", "kernels.c"):
        art = next(a for a in ex.artifacts if a.file_name == name)
        (tmp_path / name).write_bytes(bytes(art.content))
        done = subprocess.run(["cc", "-std=c11", "-Wall", "-Wextra", "-Werror", "-c",
                               name, "-o", name + ".o"], cwd=tmp_path, capture_output=True,
                              text=True)
        assert done.returncode == 0, done.stderr


def test_run_profile_without_timers_is_one_clear_line(built: Path) -> None:
    line = one_line_error(run_kiln("run", "mlp.so", "--fill", "random", "--profile",
                                   cwd=built))
    assert "built without profiling timers" in line and "--profile" in line


DEPLOY_C = r"""
#include <stdio.h>
#include <string.h>
#include "cnn.h"

int main(void) {
  static float image[1 * 3 * 16 * 16];
  static float logits[10];
  int64_t in_shape[4] = {1, 3, 16, 16}, out_shape[2] = {1, 10};
  DLTensor in = kiln_tensor(image, 4, in_shape, KILN_FLOAT32);
  DLTensor out = kiln_tensor(logits, 2, out_shape, KILN_FLOAT32);
  DLTensor *tensors[2] = {&in, &out};
  const char *function, *kernel;
  uint64_t calls, total_ns, kernels_ns = 0, whole_ns = 0;
  int32_t site;
  for (int i = 0; i < 5; ++i) {
    if (kiln_call_tensors(kiln_main, tensors, 2) != 0) {
      printf("error %s\n", kiln__last_error());
      return 1;
    }
  }
  for (site = 0; kiln__profile_read(site, &function, &kernel, &calls, &total_ns) == 0; ++site) {
    printf("%s %s %llu\n", function, kernel[0] ? kernel : "-", (unsigned long long)calls);
    if (kernel[0]) kernels_ns += total_ns; else whole_ns = total_ns;
  }
  kiln__profile_reset();
  kiln__profile_read(0, NULL, NULL, &calls, NULL);
  printf("sites %d kernels<=whole %d after-reset %llu\n", (int)site,
         kernels_ns <= whole_ns && kernels_ns > 0, (unsigned long long)calls);
  return 0;
}
"""


def test_profile_from_c_through_the_static_library_header(tmp_path: Path) -> None:
    """The .a's generated header declares the profiling accessors; a C program reads them."""
    from kiln.runtime import include_dir

    done = run_kiln("compile", str(CNN), "-t", "c", "--profile", "-o", "cnn.a", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (tmp_path / "deploy.c").write_text(DEPLOY_C)
    header = (tmp_path / "cnn.h").read_text()
    link = re.search(r"Link with: (.*)", header)
    assert link and "kiln__profile_read(" in header
    built = subprocess.run(["cc", "-std=c11", "-Wall", "-Werror", f"-I{include_dir()}",
                            "deploy.c", *link.group(1).split(), "-o", "deploy"],
                           cwd=tmp_path, capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    ran = subprocess.run(["./deploy"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    lines = ran.stdout.splitlines()
    callees = lowered_callees()
    assert lines[:-1] == [f"main {c} 5" for c in callees] + ["main - 5"]
    assert lines[-1] == f"sites {len(callees) + 1} kernels<=whole 1 after-reset 0"


def test_bert_profile_fits_a_screen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A BERT encoder (two post-norm layers, small hidden size): `kiln run --profile` with
    its defaults prints at most 30 lines, and the rows shown before each "other" row hold
    at least 95% of the kernel time."""
    monkeypatch.syspath_prepend(str(ROOT / "tests" / "models"))
    import zoo

    model = zoo.bert(seq=8, batch=1, layers=2, dim=32, heads=2, ffn=64, vocab=100)
    kiln.compile(model, "llvm", profile=True).export_library(tmp_path / "bert.so")
    ran = run_kiln("run", "bert.so", "--fill", "zeros", "--repeat", "10", "--profile",
                   cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    assert len(lines) <= 30, ran.stdout
    for heading in ("by op type", "by fused group"):
        start = next(i for i, x in enumerate(lines) if x.startswith(heading))
        rows = []
        for line in lines[start + 1:]:
            if line.startswith("by "):
                break
            rows.append(line)
        ms = [float(r.split(")")[1].split()[0] if r.startswith("other (") else r.split()[1])
              for r in rows]
        shown = sum(ms[:-1]) if rows[-1].startswith("other (") else sum(ms)
        assert shown >= 0.95 * sum(ms), ran.stdout
