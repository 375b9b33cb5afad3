"""Target objects: accessors, immutability, equality, scopes."""

from __future__ import annotations

import copy
import threading

import pytest

from kiln.target import Target, TargetError


def test_accessors() -> None:
    target = Target("nvidia/jetson-agx-orin")
    assert target.kind.name == "cuda"
    assert target.tag == "nvidia/jetson-agx-orin"
    assert target.keys == ("cuda", "gpu")
    assert target.libs == ()
    assert target.host is not None and target.host.get("mcpu") == "cortex-a78ae"
    assert target.get("arch") == "sm_87"
    assert target.get("kind") == "cuda"
    assert target.get("l2_cache_size_bytes") == 4 * 1024 * 1024
    assert Target("cuda").get("arch", "sm_50") == "sm_50"
    assert target.attrs["arch"] == "sm_87"
    assert "kind" not in target.attrs
    with pytest.raises(TypeError):
        target.attrs["arch"] = "sm_90"  # type: ignore[index]


def test_get_rejects_names_the_kind_does_not_have() -> None:
    with pytest.raises(TargetError, match="did you mean 'arch'"):
        Target("cuda").get("archh")


def test_immutable() -> None:
    target = Target("llvm")
    with pytest.raises(AttributeError, match="immutable"):
        target.tag = "x"  # type: ignore[misc]
    with pytest.raises(AttributeError, match="immutable"):
        del target.tag
    assert copy.copy(target) is target
    assert copy.deepcopy(target) is target


def test_equality_and_hash_are_by_content() -> None:
    a = Target("llvm -mtriple=x86_64-linux-gnu -mcpu=znver4")
    b = Target({"mcpu": "znver4", "mtriple": "x86_64-linux-gnu", "kind": "llvm"})
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a != Target("llvm -mtriple=x86_64-linux-gnu -mcpu=znver3")
    assert a != "llvm"
    assert len(a.fingerprint()) == 64 and a.fingerprint() == b.fingerprint()
    assert repr(a).startswith("Target('{")


def test_derived_targets() -> None:
    base = Target("raspberry-pi/4b-aarch64")
    faster = base.with_attrs({"opt-level": 2}, model="bcm2711")
    assert faster.get("opt-level") == 2 and faster.tag == base.tag
    assert base.get("opt-level") == 3
    gpu = Target("nvidia/a100").with_host("aws/c5")
    assert gpu.host == Target("aws/c5")
    detached = Target("aws/p4d").with_host(None)
    assert detached.host is None
    assert detached.tag is None  # the tag sets a host, so the result is no longer the tag
    assert detached.get("arch") == "sm_80"
    assert Target("cuda", host="llvm").with_host(None) == Target("cuda")
    assert base.with_attrs(model=None).get("model") is None


def test_current_scope() -> None:
    assert Target.current() is None
    with pytest.raises(TargetError, match="no target is in scope"):
        Target.current(allow_none=False)
    outer, inner = Target("llvm"), Target("cuda")
    with outer as entered:
        assert entered is outer
        assert Target.current() is outer
        with inner:
            assert Target.current(allow_none=False) is inner
        assert Target.current() is outer
    assert Target.current() is None


def test_current_is_per_thread() -> None:
    seen: list[Target | None] = []
    with Target("llvm"):
        worker = threading.Thread(target=lambda: seen.append(Target.current()))
        worker.start()
        worker.join()
    assert seen == [None]
