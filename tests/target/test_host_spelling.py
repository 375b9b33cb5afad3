"""`"host"` is a target spelling wherever a target is taken: this machine's llvm target."""

from __future__ import annotations

from pathlib import Path

import pytest

import kiln
from kiln.target import Target, describe
from kiln.target.describe import summarize


def test_host_is_from_host() -> None:
    host = Target("host")
    assert host == Target.from_host()
    assert host.kind.name == "llvm" and host.get("mcpu") == Target.from_host().get("mcpu")
    # options refine it, as after a kind
    trimmed = Target("host -mattr=-avx512f")
    assert trimmed.get("mtriple") == host.get("mtriple") and trimmed.get("mattr") == ("-avx512f",)
    assert Target({"kind": "cuda", "host": "host"}).host == host
    assert describe("host").startswith(f"'host' is this machine's target: {summarize(host)}")


def test_summaries_name_what_is_built() -> None:
    assert summarize(Target("raspberry-pi/4b-aarch64")) == "raspberry-pi/4b-aarch64"
    assert summarize(Target("llvm -mtriple=aarch64-linux-gnu")) == \
        "llvm aarch64-linux-gnu (generic)"
    assert summarize(Target("c")) == "c"


def test_compile_without_a_target_is_for_host() -> None:
    model = Path(__file__).resolve().parents[2] / "models" / "mlp.onnx"
    assert kiln.compile(str(model)).target == Target.from_host()


def test_dir_kiln_is_the_public_api() -> None:
    names = dir(kiln)
    assert names == sorted(kiln.__all__)
    for public in ("compile", "InferenceSession", "SessionOptions", "Target", "runtime"):
        assert public in names
    for private in ("Any", "importlib", "annotations", "_LAZY"):
        assert private not in names
    for name in kiln.__all__:
        assert getattr(kiln, name) is not None


def test_unknown_spellings_still_fail() -> None:
    with pytest.raises(kiln.TargetError, match="unknown target kind 'hots'"):
        Target("hots")
