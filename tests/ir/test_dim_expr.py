"""kiln.dim_expr: the one dimension-expression language, checked as a contract.

- Round trip: every expression prints and parses back to itself; the compiler's
  dimension texts are the ones it always wrote.
- Python and C agree: random expressions at random int64 values (the extremes
  included) give the same value and the same failure bits from `compute` and from
  `to_c` compiled against kiln_dim.c (with UBSan, so the helpers never overflow in C).
- Limits: long, deep or malformed text is a FormatError; a tree of any depth
  evaluates and prints without recursion.
- Fuzz: mutants of valid texts are accepted with the value of an independent
  reference (Python's own integers) and of C, or refused with a KilnError.
"""

from __future__ import annotations

import ast
import random
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kiln import dim_expr
from kiln.dim_expr import (
    INT64_MAX,
    INT64_MIN,
    MAX_DEPTH,
    MAX_DIM_TEXT,
    Binary,
    Const,
    Expr,
    Failure,
    Neg,
    Op,
    Var,
)
from kiln.errors import CallError, FormatError, KilnError
from kiln.escape import int64_literal
from kiln.ir.shape_expr import dim_text, dim_var, from_dim_expr, simplify_dim, to_dim_expr
from kiln.ir.tensor import max_, min_
from kiln.runtime import include_dir
from kiln.runtime.dim_binding import eval_dim_text, is_dim_text

NAMES = ("a", "b", "seq", "batch", "h")
CC = shutil.which("cc")
needs_cc = pytest.mark.skipif(CC is None, reason="needs a C compiler")

EDGES = [0, 1, -1, 2, 3, 7, 64, 1 << 31, (1 << 32) + 1, 3037000499, 3037000500, 1 << 62,
         INT64_MAX, INT64_MIN, INT64_MAX - 1, INT64_MIN + 1, -(1 << 62)]
ints = st.one_of(st.sampled_from(EDGES), st.integers(-1000, 1000),
                 st.integers(INT64_MIN, INT64_MAX))
leaves = st.one_of(ints.map(Const), st.sampled_from(NAMES).map(Var))


def _negate(e: Expr) -> Expr:
    # `-5` is the constant -5 in the text form, so a Neg of a constant >= 0 never parses
    return Const(-e.value) if isinstance(e, Const) and e.value >= 0 else Neg(e)


def _extend(children: st.SearchStrategy[Expr]) -> st.SearchStrategy[Expr]:
    return st.one_of(children.map(_negate),
                     st.builds(Binary, st.sampled_from(list(Op)), children, children))


exprs = st.recursive(leaves, _extend, max_leaves=12)
values = st.fixed_dictionaries({name: ints for name in NAMES})


@settings(max_examples=300, deadline=None)
@given(exprs)
def test_parse_of_print_is_the_expression(e: Expr) -> None:
    text = dim_expr.to_text(e)
    assert dim_expr.parse(text) == e
    assert is_dim_text(text)


@pytest.mark.parametrize("text", [
    "seq", "seq*4", "(h - 1)//2 + 1", "max(seq, 2)%3", "-b", "seq - min(1, seq)", "3 - seq",
    "-(2*seq) - b + 4", "a - (b - c)", "batch*seq*768", "(seq - 1)%4", "x//-2", "--3",
    "-9223372036854775808", "9223372036854775807*a",
])
def test_texts_print_back_byte_identical(text: str) -> None:
    assert dim_expr.to_text(dim_expr.parse(text)) == text


def test_the_compiler_writes_the_texts_it_wrote_before() -> None:
    """Metadata of existing libraries (tests/golden) holds these spellings."""
    b, s, h = dim_var("batch"), dim_var("seq"), dim_var("h")
    assert dim_text((h + 2 - 3) // 2 + 1) == "(h - 1)//2 + 1"
    assert dim_text(min_(1, s) * -1 + s) == "seq - min(1, seq)"
    assert dim_text(b * s * 768) == "batch*seq*768"
    assert dim_text(max_(s, 2) % 3) == "max(seq, 2)%3"
    assert dim_text(-s) == "-seq" and dim_text(3 - s) == "3 - seq"
    for d in ((h - 1) // 2 + 1, b * s * 4 - s, max_(b, s) - min_(b, 3) * 2):
        back = from_dim_expr(dim_expr.parse(dim_text(d)), {"batch": b, "seq": s, "h": h})
        assert dim_text(back) == dim_text(d) and simplify_dim(back - d) == 0
        assert to_dim_expr(simplify_dim(d)) == dim_expr.parse(dim_text(d))


# ---------------------------------------------------------------------- Python vs C


def _c_results(cases: Sequence[tuple[Expr, Mapping[str, int]]], tmp: Path) -> list[tuple[int, int]]:
    """(value, status) of each case, computed by `to_c` and kiln_dim.c in a C program."""
    assert CC is not None
    lines = ["#include <inttypes.h>", "#include <stdio.h>", '#include "kiln/kiln_dim.c"',
             "int main(void) {", "  int32_t status;", "  int64_t value;"]
    for e, vals in cases:
        names = {n: f"v_{n}" for n in NAMES}
        decls = " ".join(f"const int64_t v_{n} = {int64_literal(vals[n])}; (void)v_{n};"
                         for n in NAMES)
        lines += [f"  {{ {decls}", "    status = 0;",
                  f"    value = {dim_expr.to_c(e, names, 'status')};",
                  '    printf("%" PRId64 " %d\\n", value, (int)status); }']
    lines += ["  return 0;", "}"]
    src, exe = tmp / "dims.c", tmp / "dims"
    src.write_text("\n".join(lines) + "\n")
    flags = ["-std=c99", "-O1", "-Wall", "-Wextra", "-Werror", "-pedantic",
             "-fsanitize=undefined", "-fno-sanitize-recover=all"]
    built = subprocess.run([CC, *flags, f"-I{include_dir()}", str(src), "-o", str(exe)],
                           capture_output=True, text=True)
    if built.returncode != 0 and "sanitize" in built.stderr:  # no UBSan runtime here
        flags = flags[:-2]
        built = subprocess.run([CC, *flags, f"-I{include_dir()}", str(src), "-o", str(exe)],
                               capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr  # UBSan aborts on any undefined behaviour
    return [(int(v), int(s)) for v, s in (line.split() for line in run.stdout.splitlines())]


@needs_cc
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.data_too_large])
@given(cases=st.lists(st.tuples(exprs, values), min_size=25, max_size=25))
def test_python_and_c_agree_or_both_refuse(cases: list[tuple[Expr, dict[str, int]]],
                                           tmp_path_factory: pytest.TempPathFactory) -> None:
    got = _c_results(cases, tmp_path_factory.mktemp("dims"))
    for (e, vals), (c_value, c_status) in zip(cases, got, strict=True):
        value, failed = dim_expr.compute(e, vals)
        assert (value, int(failed)) == (c_value, c_status), dim_expr.to_text(e)
        if failed:
            with pytest.raises(CallError, match="overflows int64" if Failure.OVERFLOW in failed
                               else "divides by zero"):
                dim_expr.evaluate(e, vals)


def test_int64_edges() -> None:
    v = {"a": INT64_MAX, "b": INT64_MIN, "seq": -1}
    for text in ("a + 1", "b - 1", "-b", "b//seq", "a*2", "b*seq", "a*a"):
        with pytest.raises(CallError, match=r"dimension '.*' overflows int64"):
            dim_expr.evaluate(dim_expr.parse(text), v)
    assert dim_expr.evaluate(dim_expr.parse("b%seq"), v) == 0
    assert dim_expr.evaluate(dim_expr.parse("a + b"), v) == -1
    assert dim_expr.evaluate(dim_expr.parse("-7//2"), {}) == -4
    assert dim_expr.evaluate(dim_expr.parse("-7%2"), {}) == 1
    with pytest.raises(CallError, match=re.escape("dimension 'a//(seq + 1)' divides by zero")):
        dim_expr.evaluate(dim_expr.parse("a//(seq + 1)"), v)
    with pytest.raises(CallError, match="dimension '3 - a' = -9223372036854775804 is negative"):
        dim_expr.evaluate_size(dim_expr.parse("3 - a"), v)
    for bad in (1 << 63, "7", 1.5, True):  # a variable's value must be an int64 as well
        with pytest.raises(CallError, match=r"'a' = .* is not an int64"):
            dim_expr.evaluate(dim_expr.parse("a*2"), {"a": bad})


def _size_or_error(f: object, vals: Mapping[str, object]) -> object:
    try:
        return f(vals)  # type: ignore[operator]
    except CallError as err:
        return str(err)


@settings(max_examples=300, deadline=None)
@given(e=exprs, vals=values)
def test_compiled_sizes_are_evaluate_sizes(e: Expr, vals: dict[str, int]) -> None:
    """`size_function` (the runtime's per-call sizes) gives `evaluate_size`'s value, or its
    very error, for every expression and value (the int64 extremes included)."""
    small = {n: v % 50 for n, v in vals.items()}  # mostly sizes that compute
    for at in (vals, small):
        want = _size_or_error(lambda v: dim_expr.evaluate_size(e, v), at)
        assert _size_or_error(dim_expr.size_function(e), at) == want, dim_expr.to_text(e)


def test_compiled_sizes_fall_back_on_what_the_walk_decides() -> None:
    """A value that is no plain int (numpy's, a bool), a missing variable, a large tree."""
    seq = dim_expr.size_function(dim_expr.parse("seq"))
    assert seq({"seq": np.int64(7)}) == 7 and seq({"seq": 0}) == 0
    for bad, why in (({"seq": True}, "is not an int64"), ({}, "has no value for 'seq'"),
                     ({"seq": -2}, "= -2 is negative")):
        with pytest.raises(CallError, match=why):
            seq(bad)
    product = dim_expr.size_function(dim_expr.parse("batch*seq*768"))
    assert product({"batch": np.int32(3), "seq": 5}) == 3 * 5 * 768
    with pytest.raises(CallError, match="has no value for 'batch'"):
        product({"seq": 5})
    long_sum = dim_expr.parse(" + ".join(["a"] * (dim_expr.MAX_COMPILED_NODES + 1)))
    assert dim_expr.size_function(long_sum)({"a": 2}) == 2 * (dim_expr.MAX_COMPILED_NODES + 1)


# ---------------------------------------------------------------------- limits


def test_limits_give_clean_errors() -> None:
    fits = "(" * MAX_DEPTH + "seq" + ")" * MAX_DEPTH
    assert dim_expr.parse(fits) == Var("seq")
    for text in ["(" * (MAX_DEPTH + 1) + "seq" + ")" * (MAX_DEPTH + 1),
                 "-" * (MAX_DEPTH + 1) + "seq", "min(" * 70 + "1" + ", 1)" * 70,
                 "seq + " * 200 + "1", "9223372036854775808", "-9223372036854775809",
                 "seq ** 2", "seq +", "1.5", "seq.real", "__import__('os')", "if", "None",
                 "min(seq)", "f(seq, 2)", "007", "seq\x00", "名前", "", "  ", "\u0663", "seq\n*2"]:
        with pytest.raises(FormatError, match="dimension text"):
            dim_expr.parse(text)
        with pytest.raises(CallError):
            eval_dim_text(text, {"seq": 1})
    assert len("seq + " * 200) > MAX_DIM_TEXT


def test_a_tree_of_any_depth_needs_no_recursion() -> None:
    e: Expr = Var("a")
    want = 5
    for k in range(5000):  # what a compiler could build: far past the recursion limit
        e = Binary(Op.ADD, e, Const(k % 3)) if k % 2 else Neg(e)
        want = want + k % 3 if k % 2 else -want
    assert dim_expr.evaluate(e, {"a": 5}) == want
    assert len(dim_expr.to_text(e)) > MAX_DIM_TEXT
    assert dim_expr.to_c(e, {"a": "a"}, "st").count("kiln_dim_") == 5000
    with pytest.raises(FormatError, match="longer than"):
        dim_expr.parse(dim_expr.to_text(e))


# ---------------------------------------------------------------------- fuzz

SEEDS = ["seq", "seq*4", "(h - 1)//2 + 1", "batch*seq*768", "max(seq, 2)%3", "-b",
         "seq - min(1, seq)", "3 - seq", "-(2*seq) - b + 4", "(seq*12)//12 + h",
         "min(batch*seq, 4096) + max(h//3, 1)", "(h + 2*1 - 3)//2 + 1", "batch*(seq + 1) - batch"]
ALPHABET = "0123456789+-*/%(), abhqsx_" + "\x00\n\t.é名)(" + "9" * 5
VALUES = {"seq": 7, "batch": 3, "h": 225, "b": 2, "a": 5, "x": 11}  # x is not in NAMES


def _mutate(rng: random.Random, text: str) -> str:
    kind = rng.randrange(9)
    pos = rng.randrange(len(text) + 1)
    if kind == 0:
        return text[:pos] + rng.choice(ALPHABET) + text[pos:]
    if kind == 1 and text:
        return text[:pos] + text[pos + 1:]
    if kind == 2 and text:
        return text[:pos] + rng.choice(ALPHABET) + text[pos + 1:]
    if kind == 3:
        depth = rng.choice([MAX_DEPTH - 1, MAX_DEPTH, MAX_DEPTH + 1, 500])
        return "(" * depth + text + ")" * depth
    if kind == 4:
        number = str(rng.choice([1 << 62, INT64_MAX, 1 << 63, 10 ** 30, 3037000500, 0]))
        return text[:pos] + number + text[pos:]
    if kind == 5:
        return text + rng.choice([" + ", "*", "//", "%", " - "]) + rng.choice(SEEDS)
    if kind == 6:
        return "-" * rng.choice([1, 2, MAX_DEPTH, MAX_DEPTH + 2]) + text
    if kind == 7:
        return "*".join([f"({text})"] * rng.choice([2, 8, 60]))  # products past int64 / length
    return text[:pos] + text[pos:pos + rng.randrange(1, 20)] * 2 + text[pos:]


def _reference(text: str) -> int | None:
    """Python's own integers on an accepted text (only `+ - * // %`, min, max, names):
    the exact value, or None when Python raises (a zero divisor)."""
    try:
        value = eval(text, {"__builtins__": {}, "min": min, "max": max}, dict(VALUES))
    except ZeroDivisionError:
        return None
    assert isinstance(value, int)
    return value


@needs_cc
def test_fuzz_mutated_texts_are_accepted_alike_or_refused_cleanly(tmp_path: Path) -> None:
    rng = random.Random(22)
    mutants: list[str] = []
    while len(mutants) < 400:
        text = rng.choice(SEEDS)
        for _ in range(rng.randrange(1, 4)):
            text = _mutate(rng, text)
        mutants.append(text)
    accepted: list[tuple[str, Expr]] = []
    refused = {"parse": 0, "evaluate": 0}
    for text in mutants:
        try:
            e = dim_expr.parse(text)
        except KilnError:  # anything else (RecursionError, ValueError) fails the test
            refused["parse"] += 1
            assert not is_dim_text(text)
            continue
        assert is_dim_text(text)
        try:
            value, failed = dim_expr.compute(e, VALUES)
        except CallError:  # a name outside VALUES
            refused["evaluate"] += 1
            assert dim_expr.variables(e) - VALUES.keys()
            continue
        want = _reference(text)
        if not failed:
            assert value == want, text
        elif failed == Failure.ZERO_DIVISOR:
            assert want is None, text
        else:  # an intermediate result left int64: so does Python's exact computation
            assert want is None or any(abs(x) > INT64_MAX for x in _intermediates(e)), text
        accepted.append((text, e))
    cases = [(e, {n: VALUES[n] for n in NAMES}) for _, e in accepted
             if dim_expr.variables(e) <= set(NAMES)]
    got = _c_results(cases, tmp_path)
    assert [dim_expr.compute(e, v) for e, v in cases] == [(v, Failure(s)) for v, s in got]
    print(f"\ndimension-text fuzz: {len(mutants)} mutants, {len(accepted)} accepted "
          f"(same value as Python's integers; {len(cases)} also computed in C), "
          f"{refused['parse']} refused unparsed, {refused['evaluate']} refused unevaluated")
    assert len(mutants) >= 300 and accepted and refused["parse"]


def _intermediates(e: Expr) -> list[int]:
    """Every node's exact (unbounded) value; a zero divisor gives 0."""
    exact = {Op.ADD: lambda x, y: x + y, Op.SUB: lambda x, y: x - y, Op.MUL: lambda x, y: x * y,
             Op.FLOORDIV: lambda x, y: x // y if y else 0,
             Op.FLOORMOD: lambda x, y: x % y if y else 0, Op.MIN: min, Op.MAX: max}
    seen: list[int] = []

    def leaf(n: Const | Var) -> int:
        return n.value if isinstance(n, Const) else VALUES[n.name]

    def node(n: Neg | Binary, args: list[object]) -> int:
        xs = [int(a) for a in args]  # type: ignore[call-overload]
        out = -xs[0] if isinstance(n, Neg) else exact[n.op](xs[0], xs[1])
        seen.append(out)
        return out

    dim_expr.fold(e, leaf, node)
    return seen


def test_the_language_is_a_leaf_the_runtime_may_import() -> None:
    """kiln.dim_expr imports only the standard library, kiln.errors and kiln.escape: the
    runtime (numpy only, no compiler packages) reads metadata texts with it."""
    tree = ast.parse(Path(dim_expr.__file__).read_text(encoding="utf-8"))
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom)}
    kiln_modules = {name for name in imported if name.split(".")[0] == "kiln"}
    assert kiln_modules == {"kiln.errors", "kiln.escape"}
    assert all(name.split(".")[0] in sys.stdlib_module_names or name == "__future__"
               for name in imported - kiln_modules)
