"""The CPU kinds' `precision` attribute (kiln.target.precision): refusals, canonical form."""

from __future__ import annotations

import pytest

from kiln.errors import TargetError
from kiln.target import Target
from kiln.target.isa import isa_for

SPR = "llvm -mtriple=x86_64-linux-gnu -mcpu=sapphirerapids"


def test_bf16_is_part_of_the_canonical_target() -> None:
    t = Target(f"{SPR} -precision=bf16")
    assert t.export()["precision"] == "bf16" and '"precision":"bf16"' in str(t)
    assert Target(t.export()) == t and t.fingerprint() != Target(SPR).fingerprint()
    assert isa_for(t).precision == "bf16" and isa_for(Target(SPR)).precision == "f32"


def test_f32_is_the_default() -> None:
    assert Target(f"{SPR} -precision=f32") == Target(SPR)
    assert "precision" not in Target(SPR).export()


def test_a_cpu_without_avx512bf16_refuses_bf16() -> None:
    with pytest.raises(TargetError, match=r"'znver3'.*lacks 'avx512bf16'.*-mcpu=znver4"):
        Target("llvm -mtriple=x86_64-linux-gnu -mcpu=znver3 -precision=bf16")
    with pytest.raises(TargetError, match="lacks 'avx512bf16'"):
        Target(f"{SPR} -mattr=-avx512bf16 -precision=bf16")


def test_f16_needs_f16c_not_avx512() -> None:
    """float16 weights widen with F16C's vcvtph2ps: an AVX2 CPU takes `f16`, one
    without F16C (x86-64-v2) refuses it, naming the feature."""
    t = Target("llvm -mtriple=x86_64-linux-gnu -mcpu=znver3 -precision=f16")
    assert isa_for(t).precision == "f16" and t.export()["precision"] == "f16"
    with pytest.raises(TargetError, match=r"'x86-64-v2'.*lacks 'f16c'.*-mcpu=x86-64-v3"):
        Target("llvm -mtriple=x86_64-linux-gnu -mcpu=x86-64-v2 -precision=f16")


@pytest.mark.parametrize(("spec", "message"), [
    ("c -mtriple=x86_64-linux-gnu -mcpu=sapphirerapids -precision=bf16",
     "'c' code generator does not emit the bfloat16"),
    ("c -mtriple=x86_64-linux-gnu -mcpu=znver3 -precision=f16",
     "'c' code generator does not emit the float16 weight loads"),
    ("llvm -mtriple=aarch64-linux-gnu -mcpu=neoverse-v1 -precision=bf16", "x86 .* only"),
    ("llvm -mtriple=aarch64-linux-gnu -mcpu=neoverse-v1 -precision=f16", "x86 .* only"),
    (f"{SPR} -precision=fp8", "precision"),
])
def test_refusals_name_the_reason(spec: str, message: str) -> None:
    with pytest.raises(TargetError, match=message):
        Target(spec)
