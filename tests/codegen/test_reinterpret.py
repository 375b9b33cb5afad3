"""The bit cast `Reinterpret` (kiln.ir.tensor.reinterpret) on the interpreter, llvm and c,
in kiln.script text, and its refusals: the bits of float32/float64 values (signed zeros,
infinities, NaN, a subnormal) read as int32/uint32/int64/uint64 and back, against
numpy's `.view`; the round trip adds one to the integer, so a lowering that converted
values instead of moving bits cannot pass."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import kiln
from kiln.errors import IRError
from kiln.ir import IRModule, evaluate, verify
from kiln.ir import tensor as t
from kiln.ir.structural import assert_structural_equal
from kiln.script import from_source, print_module
from kiln.script.diagnostics import ScriptError
from kiln.target import Target

N = 8
PAIRS = [("float32", "int32"), ("float32", "uint32"), ("float64", "int64"),
         ("float64", "uint64")]


def bits_func(fdt: str, idt: str) -> t.PrimFunc:
    """(x, bits, back): bits = x's bits, back = the float whose bits are x's plus one."""
    x, bits, back = t.Buffer("x", (N,), fdt), t.Buffer("bits", (N,), idt), t.Buffer(
        "back", (N,), fdt)
    i = t.Var("i", "int64")
    as_int = t.reinterpret(x[i], idt)
    body = t.For(i, t.Const(0, "int64"), t.Const(N, "int64"), "serial", t.seq(
        t.Store(bits, as_int, (i,)),
        t.Store(back, t.reinterpret(as_int + t.Const(1, idt), fdt), (i,))))
    return t.PrimFunc((x, bits, back), body)


def bits_module(pairs: list[tuple[str, str]]) -> IRModule:
    return IRModule({f"k_{idt}": bits_func(fdt, idt) for fdt, idt in pairs})


def inputs(fdt: str) -> np.ndarray:
    tiny = np.finfo(fdt).smallest_subnormal
    return np.array([1.0, -2.5, 0.0, -0.0, np.inf, -np.inf, np.nan, tiny], fdt)


@pytest.fixture(scope="module", params=["interpreter", "llvm", "c"])
def call(request: pytest.FixtureRequest) -> Callable[..., None]:
    """Runs function `name` of the module of every pair (compiled once per target)."""
    mod = bits_module(PAIRS)
    if request.param == "interpreter":
        return lambda name, *args: evaluate(mod, name, *args)
    ex = kiln.compile(mod, request.param)
    return lambda name, *args: ex[name](*args)


@pytest.mark.parametrize("fdt,idt", PAIRS)
def test_bits_match_numpy_view(call: Callable[..., None], fdt: str, idt: str) -> None:
    x = inputs(fdt)
    bits, back = np.zeros(N, idt), np.zeros(N, fdt)
    call(f"k_{idt}", x, bits, back)
    np.testing.assert_array_equal(bits, x.view(idt))
    # compared as bits: NaN payloads and signed zeros count
    np.testing.assert_array_equal(back.view(idt), x.view(idt) + np.array(1, idt))


@pytest.mark.parametrize("fdt,idt", PAIRS[:1] + PAIRS[3:])
def test_script_round_trip_and_verify(fdt: str, idt: str) -> None:
    mod = bits_module([(fdt, idt)])
    verify(mod)
    text = print_module(mod)
    assert f'T.reinterpret(x[i], "{idt}")' in text
    assert_structural_equal(from_source(text), mod)


def test_widths_must_match() -> None:
    x = t.Var("x", "float32")
    with pytest.raises(IRError, match=r"cannot reinterpret float32 \(32 bits\) as int64"):
        t.reinterpret(x, "int64")
    with pytest.raises(IRError, match="bool has no bit layout"):
        t.reinterpret(t.Var("b", "bool"), "int8")
    with pytest.raises(IRError, match="float16/bfloat16"):
        t.reinterpret(t.Var("h", "float16"), "int16")
    assert t.reinterpret(x, "float32") is x
    # a node built directly is the verifier's to refuse
    out = t.Buffer("out", (1,), "int64")
    bad = t.Store(out, t.Reinterpret("int64", t.Const(1.0, "float32")), (t.Const(0, "int64"),))
    with pytest.raises(IRError, match=r"cannot reinterpret float32 \(32 bits\) as int64"):
        verify(IRModule({"f": t.PrimFunc((out,), bad)}))


def test_parser_refuses_unequal_widths() -> None:
    src = '''
from kiln.script import T

@T.prim_func
def f(x: T.Buffer((4,), "float32"), y: T.Buffer((4,), "int64")):
    for i in T.serial(4):
        y[i] = T.reinterpret(x[i], "int64")
'''
    with pytest.raises(ScriptError, match="widths must be equal"):
        from_source(src)


def test_cuda_device_code_uses_the_memcpy_helpers() -> None:
    """The cuda printer shares the C emitter: the helpers become `__device__` functions."""
    f = bits_func("float32", "int32")
    assert isinstance(f.body, t.For)
    threads = t.For(f.body.var, f.body.start, f.body.extent, "thread_x", f.body.body)
    target = Target({"kind": "cuda", "arch": "sm_90", "host": {"kind": "llvm"}})
    ex = kiln.compile(IRModule({"k": t.PrimFunc(f.params, threads)}), target)
    (source,) = [bytes(a.content).decode() for a in ex.artifacts
                 if a.file_name.endswith("kernels.cu")]
    assert "__device__ inline uint32_t kiln_f32_bits(float x)" in source
    assert "kiln_f32_from_bits((uint32_t)" in source
