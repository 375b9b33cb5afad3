"""Integer div/mod/floordiv/floormod: the `c` and `llvm` backends agree on every input.

Zero divisors and `INT_MIN / -1` trap (SIGFPE) with C's `/` and `%`; the IR
defines them (docs/codegen-llvm.md: by zero 0, INT_MIN / -1 wraps to INT_MIN).
Both backends run in a subprocess, so a trap shows as a signal, not a dead
test process.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from c_helpers import have_cc

INT_DTYPES = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
OPS = ["div", "mod", "floordiv", "floormod"]

pytestmark = pytest.mark.skipif(not have_cc(), reason="needs a C compiler")

# Builds one module (a variable divisor and the constant divisors 0 and -1 for
# every op and dtype), compiles it with each backend, prints every result.
_SCRIPT = textwrap.dedent("""
    import itertools, json, sys
    import numpy as np
    import kiln
    from kiln.ir import IRBuilder
    from kiln.ir import dtype as dt
    from kiln.ir.tensor import BinaryOp, const

    cases = json.loads(sys.argv[2])
    ib = IRBuilder()
    for d, op in itertools.product(cases, OPS):
        n = len(cases[d][0])
        minus_one = -1 if dt.kind(d) == "int" else (1 << dt.bits(d)) - 1
        with ib.prim_func(f"{op}_{d}"):
            x = ib.arg("X", (n,), d)
            y = ib.arg("Y", (n,), d)
            z = ib.arg("Z", (n, 3), d)
            with ib.for_range(n, name="i") as i:
                ib.store(z, [i, 0], BinaryOp(op, x[i], y[i]))
                ib.store(z, [i, 1], BinaryOp(op, x[i], const(0, d)))
                ib.store(z, [i, 2], BinaryOp(op, x[i], const(minus_one, d)))
    exe = kiln.compile(ib.get(), sys.argv[1])
    out = {}
    for d, op in itertools.product(cases, OPS):
        a, b = (np.array(v, dt.to_numpy(d)) for v in cases[d])
        z = np.zeros((len(a), 3), dt.to_numpy(d))
        exe[f"{op}_{d}"](a, b, z)
        out[f"{op}_{d}"] = z.tolist()
    print(json.dumps(out))
""").replace("OPS", repr(OPS))


def operands(d: str) -> tuple[list[int], list[int]]:
    """Dividends and divisors with every edge case: 0, -1, MIN, MAX, mixed signs."""
    info = np.iinfo(d)
    lo, hi = int(info.min), int(info.max)
    pairs = [(lo, -1), (lo, 0), (hi, 0), (0, 0), (7, 0), (lo, 1), (hi, -1), (lo, lo), (hi, lo),
             (-7, 2), (7, -2), (-7, -2), (7, 2), (lo, 3), (hi, 3), (5, hi), (-5, hi)]
    if lo == 0:
        pairs = [(a % (hi + 1), b % (hi + 1)) for a, b in pairs]
    return [a for a, _ in pairs], [b for _, b in pairs]


def reference(op: str, a: int, b: int, d: str) -> int:
    """The IR's definition on Python ints, wrapped to `d` (docs/codegen-llvm.md)."""
    info = np.iinfo(d)
    if b == 0:
        return 0
    q = abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1)  # truncated
    r = a - b * q
    value = {"div": q, "mod": r, "floordiv": a // b, "floormod": a % b}[op]
    span = int(info.max) - int(info.min) + 1
    return (value - int(info.min)) % span + int(info.min)


def run_backend(target: str, cases: dict[str, tuple[list[int], list[int]]]) -> dict[str, list]:
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, target, json.dumps(cases)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (
        f"{target}: exit {proc.returncode} (a negative code is a signal)\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout)


def test_c_and_llvm_agree_on_zero_divisors_and_int_min_by_minus_one() -> None:
    cases = {d: operands(d) for d in INT_DTYPES}
    results = {target: run_backend(target, cases) for target in ("c", "llvm")}
    assert results["c"] == results["llvm"]
    for d, (xs, ys) in cases.items():
        minus_one = -1 % (1 << np.iinfo(d).bits)
        for op in OPS:
            got = results["c"][f"{op}_{d}"]
            want = [[reference(op, a, b, d), reference(op, a, 0, d),
                     reference(op, a, minus_one if np.iinfo(d).min == 0 else -1, d)]
                    for a, b in zip(xs, ys)]
            assert got == want, f"{op} {d}"


def test_constant_divisors_stay_plain_c_operators() -> None:
    """Only a divisor that may be 0 or -1 costs a guarded helper call."""
    from kiln.codegen.c.codegen import emit_kernels
    from kiln.codegen.constants import ConstantPool
    from kiln.ir import IRBuilder
    from kiln.ir.tensor import BinaryOp, const

    ib = IRBuilder()
    with ib.prim_func("f"):
        x = ib.arg("X", (8,), "int32")
        y = ib.arg("Y", (8,), "int32")
        with ib.for_range(8, name="i") as i:
            ib.store(y, [i], BinaryOp("div", x[i], const(4, "int32"))
                     + BinaryOp("mod", x[i], x[i]))
    mod = ib.get()
    text, _ = emit_kernels(mod, prefix="kiln_", pool=ConstantPool.from_module(mod))
    assert " / 4" in text
    assert "kiln_mod_i32(" in text
    assert "kiln_div_i32(" not in text
