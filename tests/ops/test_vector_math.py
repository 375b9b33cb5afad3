"""The vectorizable float32 exp/tanh/sigmoid/erf (kiln.kernels.math) against numpy.

One kernel computes every intrinsic over a sweep of float32 inputs (both signs,
magnitudes from subnormal to overflow, NaN, +-inf) on c (generic target: no FMA)
and on this host's llvm (FMA where it has it), the `expand-math` pass replacing
the intrinsics; each result is
compared with the float64 reference in units in the last place of the
float32-rounded reference (a subnormal's spacing below float32's normal range).
NaN must give NaN, an overflow `inf`, like libm. On a `precision=bf16` host the
softmax's exp kernel also checks the short erf of those targets against its bounds.
Then the assembly: the softmax,
GELU (both forms), tanh and sigmoid kernels of a small model, compiled for an
AVX-512 CPU, are zmm vector code with no call to a math library.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import numpy as np
import pytest

import kiln
from kiln.codegen.constants import ConstantPool
from kiln.codegen.llvm.codegen import compile_module
from kiln.frontend import from_onnx
from kiln.ir.tensor import Buffer, Const, For, PrimFunc, Store, Var, intrin, seq
from kiln.transform.pipeline import get_pipeline
from support.graphs import GraphBuilder

RNG = np.random.default_rng(5)
_erf = np.vectorize(math.erf, otypes=[np.float64])

# intrinsic -> (float64 reference, max error in ulp)
FUNCTIONS: dict[str, tuple[Callable[[np.ndarray], np.ndarray], float]] = {
    "exp": (np.exp, 1.5),
    "tanh": (np.tanh, 1.5),
    "sigmoid": (lambda v: 1 / (1 + np.exp(-v)), 2.5),
    "erf": (_erf, 2.0),
}


SPECIAL = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1e-38, 88.72, 88.73, 89.0,
           -87.3, -103.9, -104.0, -110.0, 3.4e38, -3.4e38, 0.625, -0.625, 0.921875, 3.92, 4.0]
INPUTS = np.concatenate([
    np.linspace(-110, 110, 20001), RNG.uniform(-6, 6, 20000),
    np.sign(RNG.standard_normal(8000)) * np.logspace(-45, 2, 8000), SPECIAL,
]).astype(np.float32)


@pytest.fixture(scope="module", params=["c", "host"])
def results(request: pytest.FixtureRequest) -> dict[str, np.ndarray]:
    """Every intrinsic of FUNCTIONS over INPUTS, one kernel for all, on the target."""
    n = INPUTS.size
    x = Buffer("x", (n,), "float32")
    outs = {name: Buffer(f"y_{name}", (n,), "float32") for name in FUNCTIONS}
    i = Var("i", "int64")
    body = For(i, Const(0, "int64"), Const(n, "int64"), "serial",
               seq(*(Store(outs[name], intrin(name, x[i]), (i,)) for name in FUNCTIONS)))
    target = kiln.target.Target.from_host() if request.param == "host" else request.param
    fn = kiln.compile(PrimFunc((x, *outs.values()), body, {}), target)["main"]
    got = {name: np.empty_like(INPUTS) for name in FUNCTIONS}
    fn(INPUTS, *got.values())
    return got


def ulp_error(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    spacing = np.spacing(np.abs(want.astype(np.float32))).astype(np.float64)
    return np.abs(got.astype(np.float64) - want) / np.maximum(spacing, 2.0 ** -149)


@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_within_ulps_of_float64_and_libm_at_special_values(results: dict[str, np.ndarray],
                                                           name: str) -> None:
    reference, bound = FUNCTIONS[name]
    got = results[name]
    with np.errstate(all="ignore"):
        want = reference(INPUTS.astype(np.float64))
        want32 = want.astype(np.float32)
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    inf = np.isinf(want32)  # overflow: inf of the right sign
    np.testing.assert_array_equal(got[inf], want32[inf])
    finite = ~nan & ~inf
    err = ulp_error(got[finite], want[finite])
    worst = int(np.argmax(err))
    assert err[worst] <= bound, (
        f"{name}({INPUTS[finite][worst]!r}) = {got[finite][worst]!r}, want {want[finite][worst]!r}"
        f" ({err[worst]:.2f} ulp)")
    # signed zeros: odd functions keep -0.0
    if name in ("tanh", "erf"):
        assert np.signbit(got[INPUTS == 0.0]).tolist() == np.signbit(INPUTS[INPUTS == 0.0]).tolist()


def _assert_short_erf(got: np.ndarray) -> None:
    want = _erf(INPUTS.astype(np.float64))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = ~np.isnan(want)
    err = np.abs(got[finite] - want[finite])
    assert 1e-7 < err.max() <= 2e-6  # the short form: off by more than erf_f32's 2 ulp
    normal = np.abs(want[finite]) >= np.finfo(np.float32).tiny
    assert (err[normal] / np.abs(want[finite][normal])).max() <= 3e-5
    assert np.signbit(got[INPUTS == 0.0]).tolist() == np.signbit(INPUTS[INPUTS == 0.0]).tolist()


AVX512 = {"kind": "llvm", "mtriple": "x86_64-unknown-linux-gnu", "mcpu": "znver4"}


def test_kernels_are_vector_code_without_libm_calls() -> None:
    b = GraphBuilder()
    b.input("x", [4, 256])
    b.node("Softmax", ["x"], ["softmax"], axis=-1)
    b.node("Gelu", ["x"], ["gelu"])
    b.node("Gelu", ["x"], ["gelu_tanh"], approximate="tanh")
    b.node("Tanh", ["x"], ["tanh"])
    b.node("Sigmoid", ["x"], ["sigmoid"])
    for name in ("softmax", "gelu", "gelu_tanh", "tanh", "sigmoid"):
        b.output(name, [4, 256])
    model = b.model(opset=20, ir_version=9)
    target = kiln.target.Target(AVX512)
    with target:
        mod = get_pipeline("default", "graph", target=target)(from_onnx(model))
        mod = get_pipeline("default", "tensor", target=target)(mod)
    compiled = compile_module(mod, target, prefix="kiln_", pool=ConstantPool.from_module(mod))
    asm = str(compiled.target_machine.emit_assembly(compiled.module))
    calls = set(re.findall(r"call[q]?\s+(\w+)", asm))
    assert not {c for c in calls if re.fullmatch(r"_*(exp|tanh|erf)f?", c)}, calls
    # every kernel (a function per output; parallel bodies are their own) is vector code
    bodies = re.split(r"\n(?=kiln__kernel_\w+(?:\.run)?:)", asm)[1:]
    for name in ("softmax", "gelu", "tanh", "sigmoid"):
        body = "".join(b for b in bodies if name in b.split(":", 1)[0])
        assert re.search(r"\bvfmadd\w*\s+[^\n]*zmm", body), f"{name}: no zmm multiply-add"
        # 2^n put into the exponent field: a vector shift (no float-to-int conversion)
        assert re.search(r"\bvpslld\s+\$23, [^\n]*zmm", body), f"{name}: no 2^n in vectors"
        assert not re.search(r"\bvcvt\w*2\w*qq?\b", body), f"{name}: a 64-bit conversion"


def _host_bf16_or_host() -> kiln.target.Target:
    try:
        return kiln.target.Target("host -precision=bf16")
    except kiln.errors.TargetError:
        return kiln.target.Target.from_host()


@pytest.mark.parametrize("target", ["c", "host"])
def test_softmax_exp_is_mlas_sum_exp_and_bf16_erf_is_short(target: str) -> None:
    # softmax's `x - max` (<= 0): within 1.5 ulp of exp down to -87.3; with FMA (MLAS's
    # form) 0 below its clamp at -88.38 (n = -127: a 0 exponent field), as onnxruntime's
    # softmax gives; without FMA, exp_f32 knowing x <= 0 (subnormals as libm's). The
    # same kernel on a `precision=bf16` host (its softmax_exp_f32 is built here, not
    # expanded) takes erf, which expand-math makes kiln.kernels.math.erf_short_f32 there:
    # within 2e-6 of erf and 3e-5 of it relatively (where |erf| is normal)
    from kiln.kernels.math import softmax_exp_f32
    from kiln.target.isa import isa_for

    tgt = _host_bf16_or_host() if target == "host" else kiln.target.Target(target)
    fused = isa_for(tgt).fma
    xs = np.concatenate([-np.abs(INPUTS[np.isfinite(INPUTS)]), [-0.0, -np.inf, np.nan]]
                        ).astype(np.float32)
    x, y = Buffer("x", (xs.size,), "float32"), Buffer("y", (xs.size,), "float32")
    e_in, e_out = Buffer("e_in", INPUTS.shape, "float32"), Buffer("e", INPUTS.shape, "float32")
    i = Var("i", "int64")
    body = seq(For(i, Const(0, "int64"), Const(xs.size, "int64"), "serial",
                   Store(y, softmax_exp_f32(x[i], fused=fused), (i,))),
               For(i, Const(0, "int64"), Const(INPUTS.size, "int64"), "serial",
                   Store(e_out, intrin("erf", e_in[i]), (i,))))
    got, erf = np.empty_like(xs), np.empty_like(INPUTS)
    kiln.compile(PrimFunc((x, e_in, y, e_out), body, {}), tgt)["main"](xs, INPUTS, got, erf)
    if isa_for(tgt).precision == "bf16":
        _assert_short_erf(erf)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(xs))
    normal = xs >= -87.3
    want = np.exp(xs[normal].astype(np.float64))
    assert ulp_error(got[normal], want).max() <= 1.5
    if fused:
        assert not got[xs < -88.38].any()
    else:
        tiny = ~normal & ~np.isnan(xs)
        assert ulp_error(got[tiny], np.exp(xs[tiny].astype(np.float64))).max() <= 1.5
