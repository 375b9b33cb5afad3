"""The native targets the backend tests run on: this host with LLVM, the same host
with its 512-bit vector units switched off (the AVX2 code paths, run on an AVX-512
machine), and the C backend."""

from __future__ import annotations

import pytest

from kiln.target import Target

# The params of a `native` fixture.
NATIVE_TARGETS = ["llvm", "llvm-avx2", "c"]
# LLVM features that need AVX-512 state; "-" on all of them leaves AVX2 (docs/targets.md).
_WIDE = ("avx512", "amx", "avx10", "evex512")


def native_target(kind: str) -> Target:
    """The target of a NATIVE_TARGETS name; skips "llvm-avx2" where it would add
    nothing (no AVX-512 here: "llvm" is the AVX2 path) or cannot run."""
    if kind == "c":
        return Target("c")
    host = Target.from_host()
    if kind == "llvm":
        return host
    config = host.export()
    mattr = [str(f) for f in config.get("mattr", ())]
    if "+avx512f" not in mattr:
        pytest.skip("this host has no AVX-512: the 'llvm' target already runs the AVX2 path")
    if "+avx2" not in mattr or "+fma" not in mattr:
        pytest.skip("this host has no AVX2+FMA")
    config["mattr"] = ["-" + f[1:] if f[1:].startswith(_WIDE) else f for f in mattr]
    return Target(config)
