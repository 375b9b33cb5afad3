"""The ISA object: what LLVM's subtarget enables, turned into kernel-builder facts."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest

from kiln.errors import TargetError
from kiln.target import Target
from kiln.target.host import machine_config
from kiln.target.isa import GENERIC, ISA, isa_for
from support.processes import child_env

pytest.importorskip("llvmlite")


@pytest.mark.parametrize(
    ("spec", "bits", "regs", "fma", "dot"),
    [
        ("llvm -mtriple=x86_64-linux-gnu", 128, 16, False, None),
        ("llvm -mtriple=x86_64-linux-gnu -mcpu=haswell", 256, 16, True, "avx2"),
        ("llvm -mtriple=x86_64-linux-gnu -mcpu=znver4", 512, 32, True, "avx512vnni"),
        ("llvm -mtriple=x86_64-linux-gnu -mcpu=znver4 -mattr=-avx512f", 256, 16, True, "avx2"),
        ("llvm -mtriple=x86_64-linux-gnu -mcpu=alderlake", 256, 16, True, "avxvnni"),
        ("llvm -mtriple=aarch64-linux-gnu -mcpu=neoverse-n1", 128, 32, True, "sdot"),
        ("llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a53", 128, 32, True, None),
        ("c -mtriple=thumbv7em-none-eabihf -mcpu=cortex-m4", 0, 0, False, "dsp"),
    ],
)
def test_isa_follows_llvm_subtarget(spec: str, bits: int, regs: int, fma: bool,
                                    dot: str | None) -> None:
    isa = isa_for(Target(spec))
    assert (isa.vector_bits, isa.vector_registers, isa.fma, isa.int8_dot) == (
        bits, regs, fma, dot)
    assert isa.lanes("float32") == max(1, bits // 32)
    assert isa.lanes("int8") == max(1, bits // 8)


def test_amx_is_listed_but_not_the_vector_dot() -> None:
    isa = isa_for(Target("llvm -mtriple=x86_64-linux-gnu -mcpu=sapphirerapids"))
    assert isa.amx_tiles == 8 and "amx" in isa.int8_dots
    assert isa.int8_dot == "avx512vnni" and isa.mask_registers == 8
    assert isa_for(Target("llvm -mtriple=x86_64-linux-gnu -mcpu=sapphirerapids "
                          "-mattr=-amx-tile")).amx_tiles == 0


@pytest.mark.parametrize(("spec", "sve"), [
    ("llvm -mtriple=aarch64-linux-gnu -mcpu=neoverse-n1", False),
    ("llvm -mtriple=aarch64-linux-gnu -mcpu=neoverse-v1", True),
    ("llvm -mtriple=aarch64-linux-gnu -mattr=+sve", True),
])
def test_aarch64_sve_is_flagged(spec: str, sve: bool) -> None:
    # SVE's predicate registers are counted; the kernels' vectors stay NEON's 128 bits
    isa = isa_for(Target(spec))
    assert isa.has("sve") is sve and isa.has("neon")
    assert (isa.mask_registers, isa.vector_bits) == (16 if sve else 0, 128)


def cpu_facts(isa: ISA) -> ISA:
    """`isa` without what the target's kind and attributes choose (kind, int8-pairs,
    winograd, the tuning session's parallel threshold): the CPU's facts alone."""
    return replace(isa, kind="", int8_pairs="exact", winograd=False, parallel_min_ns=0)


def test_targets_without_a_cpu_are_generic() -> None:
    cuda = isa_for(Target("cuda -arch=sm_80"))
    assert cpu_facts(cuda) == GENERIC and cuda.kind == "cuda"
    assert isa_for(None) is GENERIC
    with Target("llvm -mtriple=x86_64-linux-gnu -mcpu=haswell"):
        assert isa_for(None).vector_bits == 256


def test_unknown_dtype_is_refused() -> None:
    with pytest.raises(TargetError, match="float128"):
        GENERIC.lanes("float128")


CHILD = """
from kiln.errors import TargetError
from kiln.target import Target
from kiln.target.isa import isa_for
try:
    isa_for(Target({spec!r}))
except TargetError as exc:
    print("TargetError:", exc)
"""


@pytest.mark.parametrize("spec", [
    "c -mcpu=cortex-m4",                                # an Arm CPU for the system C compiler
    "c -mtriple=x86_64-linux-gnu -mcpu=cortex-a53",
    "c -mtriple=aarch64-linux-gnu -mcpu=native",        # native is this machine, not the device
])
def test_a_cpu_of_another_architecture_is_a_target_error(spec: str) -> None:
    # LLVM aborts the whole process on some of these ("64-bit code requested on a
    # subtarget that doesn't support it"): the child must exit normally with the error
    proc = subprocess.run([sys.executable, "-c", CHILD.format(spec=spec)],
                          capture_output=True, text=True, timeout=120, env=child_env())
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("TargetError: attribute 'mcpu'"), proc.stdout + proc.stderr


def test_c_native_is_this_machines_cpu() -> None:
    # `native` is the machine itself, even where $KILN_HOST_CPU stands in for `host`
    assert cpu_facts(isa_for(Target("c -mcpu=native"))) == \
        cpu_facts(isa_for(Target(machine_config())))
