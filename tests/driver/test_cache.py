"""The on-disk compile cache and the structural fingerprint it is keyed by."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import kiln
import kiln.codegen.registry as reg
from kiln.artifact import Artifact, InMemoryArtifact
from kiln.driver import CACHE_STATS
from kiln.driver.cache import CacheWarning, cache_dir, entry_path
from kiln.driver.fingerprint import module_fingerprint
from kiln.ir import IRBuilder, IRModule
from kiln.ir import graph as g
from kiln.ir import tensor as t
from kiln.target import TargetKind, register_kind, unregister_kind
from kiln.transform import PassContext
from support import ir_samples

CALLS: list[str] = []


def _counting_codegen(mod: IRModule, target: Any, *, prefix: str, pool: Any) -> list[Any]:
    CALLS.append(prefix)
    return [Artifact("count", "none", "names.txt", ",".join(mod).encode()),
            Artifact("count", "none", "consts.bin", pool.to_bytes())]


def _in_memory_codegen(mod: IRModule, target: Any, *, prefix: str, pool: Any) -> list[Any]:
    CALLS.append("mem")
    return [InMemoryArtifact("mem", "python", "m.kir", value=mod)]


@pytest.fixture
def counting() -> Iterator[None]:
    kind = register_kind(TargetKind("cachetest", {}, ("cpu",)))
    kind.set_attr("codegen", _counting_codegen)
    mem = register_kind(TargetKind("cachemem", {}, ("cpu",)))
    mem.set_attr("codegen", _in_memory_codegen)
    CALLS.clear()
    CACHE_STATS.reset()
    yield
    unregister_kind("cachetest")
    unregister_kind("cachemem")


def test_second_compile_is_a_cache_hit(counting: None, _private_cache: Path) -> None:
    ex1 = kiln.compile(ir_samples.chain_module(), "cachetest")
    assert not ex1.cache_hit and CALLS == ["kiln_"]
    assert (CACHE_STATS.hits, CACHE_STATS.misses, CACHE_STATS.stores) == (0, 1, 1)
    assert cache_dir() == _private_cache
    assert ex1.cache_key is not None and entry_path(ex1.cache_key).is_file()
    ex2 = kiln.compile(ir_samples.chain_module(), "cachetest")  # rebuilt from scratch
    assert ex2.cache_hit and CALLS == ["kiln_"]
    assert CACHE_STATS.hits == 1
    assert ex2.artifacts == ex1.artifacts
    assert "(from the compile cache)" in ex2.inspect()


def test_anything_that_changes_the_output_misses(counting: None) -> None:
    kiln.compile(ir_samples.chain_module(), "cachetest")
    kiln.compile(ir_samples.chain_module(), "cachetest", system_lib_prefix="other_")
    # Same passes minus simplify: nothing to simplify here, so the lowered IR and the key agree.
    assert kiln.compile(ir_samples.chain_module(), "cachetest", tensor_pipeline=None).cache_hit
    kiln.compile(ir_samples.chain_module(), "cachetest",
                 graph_pipeline="lower-graph-to-tensor{alignment=128}")
    changed = ir_samples.chain_module()
    kiln.compile(changed.with_attrs(note=1), "cachetest")
    assert len(CALLS) == 4 and CACHE_STATS.hits == 1


def test_in_memory_artifacts_are_never_cached(counting: None) -> None:
    kiln.compile(ir_samples.chain_module(), "cachemem")
    kiln.compile(ir_samples.chain_module(), "cachemem")
    assert CALLS == ["mem", "mem"] and CACHE_STATS.stores == 0


def test_cache_can_be_disabled(counting: None, monkeypatch: pytest.MonkeyPatch) -> None:
    with PassContext(config={"kiln.cache": False}):
        kiln.compile(ir_samples.chain_module(), "cachetest")
        ex = kiln.compile(ir_samples.chain_module(), "cachetest")
    assert ex.cache_key is None and len(CALLS) == 2
    monkeypatch.setenv("KILN_CACHE", "off")
    kiln.compile(ir_samples.chain_module(), "cachetest")
    assert len(CALLS) == 3 and CACHE_STATS.stores == 0


def test_damaged_entry_is_a_miss_and_is_replaced(counting: None) -> None:
    ex = kiln.compile(ir_samples.chain_module(), "cachetest")
    assert ex.cache_key is not None
    path = entry_path(ex.cache_key)
    path.write_bytes(path.read_bytes()[:100])
    ex2 = kiln.compile(ir_samples.chain_module(), "cachetest")
    assert not ex2.cache_hit and CACHE_STATS.errors == 1 and len(CALLS) == 2
    assert kiln.compile(ir_samples.chain_module(), "cachetest").cache_hit


def test_unwritable_cache_never_fails_a_build(counting: None, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("KILN_CACHE_DIR", str(blocker))
    with pytest.warns(CacheWarning, match=r"cannot write to the compile cache at .*file: "
                                          "not a directory"):
        ex = kiln.compile(ir_samples.chain_module(), "cachetest")
    assert not ex.cache_hit and CACHE_STATS.errors >= 1


def test_native_build_hits_the_cache_and_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = reg.get_codegen("c")

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(reg, "get_codegen", lambda name: spy if name == "c" else real)
    ex1 = kiln.compile(ir_samples.chain_module(), "c")
    ex2 = kiln.compile(ir_samples.chain_module(), "c")
    assert calls == [1] and ex2.cache_hit and not ex1.cache_hit
    x = np.linspace(-1, 1, ir_samples.N, dtype=np.float32)
    np.testing.assert_allclose(ex2["main"](x, x), ir_samples.chain_reference(x, x), rtol=1e-6)


# ----------------------------------------------------------------- fingerprint

def test_fingerprint_is_structural() -> None:
    a, b = ir_samples.chain_module(), ir_samples.chain_module()
    assert module_fingerprint(a) == module_fingerprint(b)
    renamed = b.with_function("main", b["main"].with_attrs(output_names=("y",)))
    assert module_fingerprint(renamed) != module_fingerprint(a)


def _const_module(data: np.ndarray, name: str = "w") -> IRModule:
    ib = IRBuilder()
    with ib.function("main"):
        ib.ret(g.Constant(data, name))
    return ib.get()


def test_fingerprint_sees_constant_bytes_dtype_shape_and_name() -> None:
    base = np.arange(4, dtype=np.float32)
    fp = module_fingerprint(_const_module(base))
    assert module_fingerprint(_const_module(base.copy())) == fp
    changed = base.copy()
    changed[3] = np.nextafter(changed[3], np.float32(10))
    assert module_fingerprint(_const_module(changed)) != fp
    assert module_fingerprint(_const_module(base.astype(np.int32))) != fp
    assert module_fingerprint(_const_module(base.reshape(2, 2))) != fp
    assert module_fingerprint(_const_module(base, "v")) != fp


def test_fingerprint_text_is_pinned() -> None:
    """The hashed text of a small module is what it was before the texts were hashed in
    batches: a change here (FINGERPRINT_VERSION, the IR's fields) misses every cache
    entry, so it must be deliberate."""
    fp = module_fingerprint(_const_module(np.arange(4, dtype=np.float32)))
    assert fp == "9e0758bf3a9033c68b9c00ec46d3d7a5c513a3398a535d049bd1fa0f51976231"


def test_fingerprint_distinguishes_variable_sharing() -> None:
    x = t.Buffer("x", (4,), "float32")
    i, j = t.Var("i"), t.Var("i")
    same = t.For(i, t.Const(0, "int64"), t.Const(4, "int64"), "serial",
                 t.Store(x, x[i], (i,)))
    other = t.For(i, t.Const(0, "int64"), t.Const(4, "int64"), "serial",
                  t.Store(x, x[j], (i,)))
    fa = module_fingerprint(IRModule({"f": t.PrimFunc((x,), same)}))
    fb = module_fingerprint(IRModule({"f": t.PrimFunc((x,), other)}))
    assert fa != fb


def test_fingerprint_handles_deep_expressions() -> None:
    x = t.Buffer("x", (1,), "int32")
    e: t.PrimExpr = t.Const(0, "int32")
    for k in range(5000):
        e = t.BinaryOp("add", e, t.Const(k, "int32"))
    fn = t.PrimFunc((x,), t.Store(x, e, (t.Const(0, "int64"),)))
    assert len(module_fingerprint(IRModule({"f": fn}))) == 64


def test_float_signed_zero_changes_fingerprint() -> None:
    x = t.Buffer("x", (1,), "float32")
    idx = (t.Const(0, "int64"),)
    pos = IRModule({"f": t.PrimFunc((x,), t.Store(x, t.Const(0.0, "float32"), idx))})
    neg = IRModule({"f": t.PrimFunc((x,), t.Store(x, t.Const(-0.0, "float32"), idx))})
    assert module_fingerprint(pos) != module_fingerprint(neg)


def test_source_fingerprint_covers_the_shipped_c(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """host.c embeds kiln_host.c: a change to it alone must not hit entries built before."""
    from kiln.driver.cache import kiln_source_fingerprint

    (tmp_path / "__init__.py").write_text("")
    host_c = tmp_path / "runtime" / "include" / "kiln" / "kiln_host.c"
    host_c.parent.mkdir(parents=True)
    host_c.write_text("/* one */\n")
    monkeypatch.setattr(kiln, "__file__", str(tmp_path / "__init__.py"))
    before = kiln_source_fingerprint.__wrapped__()
    host_c.write_text("/* two */\n")
    assert kiln_source_fingerprint.__wrapped__() != before
