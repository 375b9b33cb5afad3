"""The codegen registry and build dispatcher, the python kind, backend plug-ins."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterator
from typing import Any

import pytest

import kiln.codegen.registry as reg
import kiln.runtime.plugins as plugins
from kiln.artifact import Artifact, ArtifactSet, InMemoryArtifact
from kiln.codegen import (
    build,
    codegen_for,
    get_codegen,
    list_codegens,
    load_backends,
    register_codegen,
    resolve_target,
)
from kiln.codegen.constants import ConstantPool
from kiln.errors import CompileError, TargetError
from kiln.ir import IRModule
from kiln.target import Target, TargetKind, get_kind, register_kind, unregister_kind
from kiln.transform import get_pipeline
from support import ir_samples


def _lowered() -> IRModule:
    return get_pipeline("default", "graph")(ir_samples.chain_module())


@pytest.fixture
def toy_kind() -> Iterator[TargetKind]:
    kind = register_kind(TargetKind("toyreg", {}, ("cpu",)))
    yield kind
    unregister_kind("toyreg")
    reg.CODEGENS.unregister("toyreg")
    reg.CODEGENS.unregister("toyreg-alt")


def _toy_codegen(mod: IRModule, target: Target, *, prefix: str,
                 pool: ConstantPool) -> list[Artifact]:
    return [Artifact("toy", "none", "funcs.txt", " ".join(mod).encode(),
                     {"prefix": prefix, "consts": len(pool), "kind": target.kind.name})]


def test_builtins_are_lazy_and_listed() -> None:
    assert {"llvm", "llvmjit", "c", "python"} <= set(list_codegens())
    from kiln.codegen.llvm import codegen_llvm
    assert get_codegen("llvm") is codegen_llvm


def test_kind_name_fallback_and_build(toy_kind: TargetKind) -> None:
    register_codegen("toyreg", _toy_codegen)
    name, fn = codegen_for(Target("toyreg"))
    assert (name, fn) == ("toyreg", _toy_codegen)
    arts = build(_lowered(), Target("toyreg"), prefix="p_")
    assert isinstance(arts, ArtifactSet)
    (a,) = list(arts)
    assert a.content.decode().split() == ["add", "mul", "scale2", "neg", "square", "main"]
    assert dict(a.metadata) == {"prefix": "p_", "consts": 2, "kind": "toyreg"}


def test_kind_attr_names_or_holds_the_codegen(toy_kind: TargetKind) -> None:
    register_codegen("toyreg-alt", _toy_codegen)
    toy_kind.set_attr("codegen", "toyreg-alt")
    assert codegen_for(Target("toyreg"))[0] == "toyreg-alt"
    toy_kind.set_attr("codegen", _toy_codegen, override=True)
    name, fn = codegen_for(Target("toyreg"))
    assert fn is _toy_codegen and name.endswith("_toy_codegen")
    toy_kind.set_attr("codegen", 42, override=True)
    with pytest.raises(CompileError, match="must name a registered codegen or be a function"):
        codegen_for(Target("toyreg"))


def test_builtin_kinds_dispatch() -> None:
    assert codegen_for(Target("c"))[0] == "c"
    assert codegen_for(Target("python"))[0] == "python"
    assert get_kind("python").default_keys == ("cpu",)


def test_unknown_codegen_lists_choices(toy_kind: TargetKind) -> None:
    with pytest.raises(CompileError,
                       match=r"target kind 'toyreg' has no code generator.*kinds with one: c, "):
        codegen_for(Target("toyreg"))
    with pytest.raises(CompileError, match=r"'rocm' has no code generator.*llvm") as err:
        codegen_for(Target("rocm"))
    kinds = str(err.value).split("kinds with one:")[1].split(".")[0]
    assert "rocm" not in kinds and "cuda" in kinds
    with pytest.raises(CompileError, match="did you mean 'llvm'"):
        get_codegen("llvn")


def test_duplicate_registration(toy_kind: TargetKind) -> None:
    register_codegen("toyreg", _toy_codegen)
    with pytest.raises(CompileError, match="already registered"):
        register_codegen("toyreg", _toy_codegen)
    register_codegen("toyreg", _toy_codegen, override=True)
    with pytest.raises(CompileError, match="must be callable"):
        register_codegen("toyreg-alt", "nope")  # type: ignore[arg-type]


@pytest.mark.parametrize(("result", "message"), [
    (Artifact("x", "none", "a", b""), "returned Artifact; a codegen returns a list"),
    (None, "returned NoneType"),
    ([b"bytes"], "returned a bytes among its artifacts"),
    ([Artifact("x", "none", "a", b""), Artifact("x", "none", "a", b"")], "duplicate artifact"),
])
def test_build_checks_codegen_output(toy_kind: TargetKind, result: Any, message: str) -> None:
    register_codegen("toyreg", lambda *a, **k: result)
    with pytest.raises(CompileError, match=message):
        build(_lowered(), Target("toyreg"))


def test_build_wraps_codegen_crash(toy_kind: TargetKind) -> None:
    def crash(*args: Any, **kwargs: Any) -> list[Artifact]:
        raise KeyError("boom")

    register_codegen("toyreg", crash)
    with pytest.raises(CompileError, match="codegen 'toyreg' failed: KeyError"):
        build(_lowered(), Target("toyreg"))


def test_build_rejects_bad_prefix() -> None:
    with pytest.raises(CompileError, match="system_lib_prefix"):
        build(_lowered(), Target("python"), prefix="9x-")


def test_python_codegen_is_in_memory() -> None:
    arts = build(_lowered(), Target("python"))
    (a,) = list(arts)
    assert isinstance(a, InMemoryArtifact) and a.loader == "python"
    assert isinstance(a.value, IRModule)
    assert set(a.metadata["metadata"]["functions"]) == set(a.value)
    assert not arts.serializable


# ----------------------------------------------------------------- plug-ins

class _EntryPoint:
    def __init__(self, name: str, fn: Any) -> None:
        self.name = name
        self._fn = fn

    def load(self) -> Any:
        if isinstance(self._fn, Exception):
            raise self._fn
        return self._fn


@pytest.fixture
def fake_entry_points(monkeypatch: pytest.MonkeyPatch) -> list[_EntryPoint]:
    eps: list[_EntryPoint] = []
    monkeypatch.setattr(importlib.metadata, "entry_points",  # the scan imports it late
                        lambda group: eps if group == "kiln.backends" else [])
    monkeypatch.setattr(plugins, "_SCANNED", False)
    monkeypatch.setattr(plugins, "_BACKENDS", {})
    return eps


def test_entry_point_backend_registers_lazily(fake_entry_points: list[_EntryPoint]) -> None:
    calls: list[str] = []

    def register() -> None:
        calls.append("plugin")
        kind = register_kind(TargetKind("plugdev", {}, ("cpu",)))
        kind.set_attr("codegen", "plugdev")
        register_codegen("plugdev", _toy_codegen)

    fake_entry_points.append(_EntryPoint("plugdev", register))
    fake_entry_points.append(_EntryPoint("broken", ImportError("no module named plugbroken")))
    try:
        assert calls == []
        target = resolve_target("plugdev")  # unknown kind -> plug-ins load -> retry
        assert calls == ["plugin"] and target.kind.name == "plugdev"
        assert codegen_for(target)[1] is _toy_codegen
        assert load_backends() == {"plugdev": None,
                                   "broken": "ImportError: no module named plugbroken"}
        assert calls == ["plugin"]  # loaded once
        with pytest.raises(CompileError, match="plug-ins that failed to load: broken"):
            get_codegen("nothing-like-this")
    finally:
        unregister_kind("plugdev")
        reg.CODEGENS.unregister("plugdev")


def test_unknown_kind_without_plugins_keeps_target_error(
        fake_entry_points: list[_EntryPoint]) -> None:
    with pytest.raises(TargetError, match="unknown target kind 'llvmm'"):
        resolve_target("llvmm")
