"""Property tests: parse -> export -> parse is the identity, whatever the attribute set."""

from __future__ import annotations

import json
import shlex
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from kiln.target import AttrSpec, Target, get_kind, list_tags
from kiln.target.host import host_triple
from kiln.target.llvm_names import llvm_names

SETTINGS = settings(max_examples=100, deadline=None)

NAMES = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_", min_size=1, max_size=8)
FEATURE_NAMES = st.sampled_from(["neon", "sve", "avx2", "fma", "mve.fp", "v8.2a", "fp-armv8"])
FEATURES = st.lists(st.tuples(st.sampled_from("+-"), FEATURE_NAMES).map("".join), max_size=6)
ARM_TRIPLES = ["armv7a-linux-gnueabihf", "thumbv7em-none-eabi", "thumbv8.1m.main-none-eabi"]
OTHER_TRIPLES = ["x86_64-linux-gnu", "aarch64-linux-gnu", "riscv64-unknown-linux-gnu"]

# Attributes whose values a kind's canonicalizer restricts.
SPECIAL: dict[str, st.SearchStrategy[Any]] = {
    "mattr": FEATURES,
    "arch": st.sampled_from(["sm_70", "sm_80", "sm_89", "sm_90a"]),
    "mtriple": st.sampled_from(OTHER_TRIPLES),
    "max_shared_memory_per_block": st.integers(min_value=0, max_value=49152),
    "max_shared_memory_per_block_optin": st.integers(min_value=49152, max_value=1 << 20),
    # bf16 depends on the drawn CPU's features (tests/target/test_precision.py): f32 only
    "precision": st.just("f32"),
}
SKIP = {"kind", "tag", "host", "devices", "mfloat-abi"}


def value_for(name: str, spec: AttrSpec, kind: str) -> st.SearchStrategy[Any]:
    if kind == "nvptx" and name == "mcpu":
        return st.sampled_from(["sm_75", "sm_86"])
    if kind == "rocm" and name == "mcpu":
        return st.sampled_from(["gfx90a", "gfx942", "gfx1100"])
    if kind in ("nvptx", "rocm") and name == "mtriple":
        return st.just(spec.default)
    if name in SPECIAL:
        return SPECIAL[name]
    if spec.choices is not None:
        return st.sampled_from(spec.choices)
    if spec.type_name == "str":
        return NAMES
    if spec.type_name == "int":
        return st.integers(min_value=spec.min or 0, max_value=spec.max or 1 << 20)
    if spec.type_name == "bool":
        return st.booleans()
    if spec.type_name == "list[str]":
        return st.lists(NAMES, max_size=4)
    raise AssertionError(f"no strategy for {name}: {spec.type_name}")


@st.composite
def attribute_sets(draw: st.DrawFn, kinds: tuple[str, ...]) -> dict[str, Any]:
    kind_name = draw(st.sampled_from(kinds))
    kind = get_kind(kind_name)
    names = sorted(set(kind.options) - SKIP)
    chosen = draw(st.lists(st.sampled_from(names), unique=True, max_size=len(names)))
    spec: dict[str, Any] = {"kind": kind_name}
    for name in chosen:
        spec[name] = draw(value_for(name, kind.options[name], kind_name))
    if kind_name in ("llvm", "c") and draw(st.booleans()):
        spec["mtriple"] = draw(st.sampled_from(ARM_TRIPLES))
        spec["mfloat-abi"] = draw(st.sampled_from(["hard", "soft", "softfp"]))
    if kind_name in ("llvm", "llvmjit", "c"):
        # LLVM checks CPU and feature names per triple (c's too): draw names it knows.
        names = llvm_names(spec.get("mtriple") or host_triple())
        assert names is not None
        if "mcpu" in spec:
            spec["mcpu"] = draw(st.sampled_from(sorted(names.cpus)))
        if "mattr" in spec:
            spec["mattr"] = draw(st.lists(st.tuples(st.sampled_from("+-"), st.sampled_from(
                sorted(names.features))).map("".join), max_size=6))
    if "cpu" not in get_kind(kind_name).default_keys and draw(st.booleans()):
        spec["host"] = draw(attribute_sets(("llvm", "c")))
    return spec


KINDS = ("llvm", "c", "cuda", "nvptx", "rocm", "vulkan", "metal", "opencl", "webgpu", "ext_dev")


def to_command_line(spec: dict[str, Any]) -> str:
    """Write a spec dict as a TVM-style command line."""
    words = [spec["kind"]]
    for name, value in spec.items():
        if name == "kind":
            continue
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, list):
            text = ",".join(value)
        elif isinstance(value, dict):
            text = to_command_line(value)
        else:
            text = str(value)
        words.append(shlex.quote(f"-{name}={text}"))
    return " ".join(words)


@SETTINGS
@given(attribute_sets(KINDS))
def test_parse_export_parse_is_identity(spec: dict[str, Any]) -> None:
    target = Target(spec)
    exported = target.export()
    again = Target(exported)
    assert again == target
    assert again.export() == exported
    assert hash(again) == hash(target)
    assert again.fingerprint() == target.fingerprint()
    assert Target(json.dumps(spec)) == target
    assert Target(str(target)) == target


@SETTINGS
@given(attribute_sets(KINDS))
def test_command_line_form_equals_dict_form(spec: dict[str, Any]) -> None:
    assert Target(to_command_line(spec)) == Target(spec)


@SETTINGS
@given(attribute_sets(KINDS), st.data())
def test_explicit_defaults_change_nothing(spec: dict[str, Any], data: st.DataObject) -> None:
    kind = get_kind(spec["kind"])
    defaults = {
        name: option.default
        for name, option in kind.options.items()
        if option.default is not None and name not in spec and name != "keys"
    }
    if not defaults:
        return
    extra = data.draw(st.lists(st.sampled_from(sorted(defaults)), unique=True))
    filled = {**spec, **{name: defaults[name] for name in extra}}
    assert Target(filled) == Target(spec)


CPU_TAGS = sorted(name for name in list_tags() if Target(name).kind.name in ("llvm", "c"))


@SETTINGS
@given(st.sampled_from(CPU_TAGS), attribute_sets(("llvm",)))
def test_tag_overrides_round_trip(tag: str, overrides: dict[str, Any]) -> None:
    base = Target(tag)
    skip = {"kind", "mtriple", "mfloat-abi", "host"}
    drawn_for = (overrides.get("mtriple") or host_triple()).split("-")[0]
    if (base.get("mtriple") or host_triple()).split("-")[0] != drawn_for:
        skip |= {"mcpu", "mattr"}  # LLVM names drawn for another architecture
    changes = {
        name: value
        for name, value in overrides.items()
        if name in base.kind.options and name not in skip
    }
    target = Target({"tag": tag, **changes})
    assert target.tag == base.tag
    assert Target(target.export()) == target
