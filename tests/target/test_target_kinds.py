"""Kinds: the registry, schemas, per-kind attributes, bring-your-own-codegen, describe()."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from kiln.target import (
    AttrSpec,
    Target,
    TargetError,
    TargetKind,
    describe,
    get_kind,
    list_kinds,
    register_kind,
    unregister_kind,
)

REQUIRED = {
    "llvm", "llvmjit", "c", "cuda", "nvptx", "rocm", "vulkan", "metal", "opencl", "webgpu",
    "ext_dev", "composite",
}
COMMON = {"kind", "tag", "keys", "libs", "host", "device", "model"}


def test_builtin_kinds() -> None:
    assert set(list_kinds()) >= REQUIRED
    for name in list_kinds():
        kind = get_kind(name)
        assert kind.name == name
        assert set(kind.options) >= COMMON
        assert all(isinstance(spec, AttrSpec) for spec in kind.options.values())
    assert get_kind("llvm").default_keys == ("cpu",)
    assert get_kind("cuda").default_keys == ("cuda", "gpu")
    assert set(get_kind("llvmjit").own_options) == set(get_kind("llvm").own_options)
    opt_level = AttrSpec(int, 3, min=0, max=3, doc="optimisation level")
    assert get_kind("llvm").options["opt-level"] == opt_level


def test_kind_options_are_read_only() -> None:
    with pytest.raises(TypeError):
        get_kind("llvm").options["x"] = AttrSpec(str)  # type: ignore[index]


@pytest.fixture
def dnnl() -> Iterator[TargetKind]:
    kind = register_kind(
        TargetKind(
            "dnnl",
            {
                "isa": AttrSpec(str, "avx2", choices=("avx2", "avx512_core", "amx")),
                "threads_hint": AttrSpec(int, min=1),
            },
            ("cpu", "dnnl"),
        )
    )
    yield kind
    unregister_kind("dnnl")


def test_bring_your_own_kind(dnnl: TargetKind) -> None:
    target = Target({"kind": "dnnl", "isa": "amx"})
    assert target.kind is dnnl
    assert target.keys == ("cpu", "dnnl")
    assert Target("dnnl -isa=avx512_core").get("isa") == "avx512_core"
    with pytest.raises(TargetError, match="did you mean 'amx'"):
        Target({"kind": "dnnl", "isa": "amx2"})
    with pytest.raises(TargetError, match="'dnnl' is already registered"):
        register_kind(TargetKind("dnnl"))
    assert "dnnl" in list_kinds()


def test_per_kind_attributes(dnnl: TargetKind) -> None:
    def codegen() -> str:
        return "code"

    dnnl.set_attr("codegen", codegen)
    dnnl.set_attr("tensor_pipeline", lazy="json:dumps")
    assert dnnl.get_attr("codegen") is codegen
    assert dnnl.get_attr("tensor_pipeline") is json.dumps
    assert dnnl.get_attr("loader") is None
    assert dnnl.get_attr("loader", "native") == "native"
    assert dnnl.attr_names() == ["codegen", "tensor_pipeline"]
    with pytest.raises(TargetError, match="attribute 'codegen' is already registered"):
        dnnl.set_attr("codegen", codegen)
    dnnl.set_attr("codegen", str, override=True)
    assert dnnl.get_attr("codegen") is str
    assert "per-kind attributes set: codegen, tensor_pipeline" in describe("dnnl")


def test_kind_declaration_errors() -> None:
    with pytest.raises(TargetError, match="common attribute"):
        TargetKind("bad", {"keys": AttrSpec(list[str])})
    with pytest.raises(TargetError, match="must be an AttrSpec"):
        TargetKind("bad", {"x": int})  # type: ignore[dict-item]
    with pytest.raises(TargetError, match="lowercase"):
        TargetKind("Bad Kind")
    with pytest.raises(TargetError, match=r"unknown attribute type 'strng'\. did you mean 'str'"):
        AttrSpec("strng")
    with pytest.raises(TargetError, match="the default expects int, got str"):
        AttrSpec(int, "3")
    with pytest.raises(TargetError, match="choices apply only to str"):
        AttrSpec(int, choices=("a",))


def test_describe_kind_and_tag() -> None:
    text = describe("llvm")
    assert text.startswith("target kind 'llvm'")
    assert "default keys: cpu" in text
    for fragment in ("mtriple", "opt-level", "int in 0..3", "mfloat-abi", "'softfp'"):
        assert fragment in text
    text = describe("aws/c5.xlarge")
    assert "target tag 'aws/c5' (resolved from 'aws/c5.xlarge')" in text
    assert '"mcpu": "skylake-avx512"' in text
    with pytest.raises(TargetError, match="did you mean 'cuda'"):
        describe("cuad")
