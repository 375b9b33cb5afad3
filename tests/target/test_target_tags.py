"""Every tag builds and validates, and its CPU/GPU names are ones LLVM 22 knows."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kiln.target import Target, TargetError, get_tag, list_tags, register_tag, unregister_tag

TAGS = list_tags()


def test_there_are_at_least_40_tags() -> None:
    assert len(TAGS) >= 40
    assert "raspberry-pi/4b-aarch64" in TAGS


@pytest.mark.parametrize("name", TAGS)
def test_every_tag_builds_and_round_trips(name: str) -> None:
    target = Target(name)
    assert target.tag == name
    assert Target(target.export()) == target
    assert get_tag(name).description


def _machines(target: Target) -> Iterator[tuple[str, str, str]]:
    """(triple, cpu, features) for every LLVM-backed part of a target and its host."""
    kind = target.kind.name
    if kind in ("llvm", "c"):
        assert target.get("mtriple") and target.get("mcpu"), f"{target.tag} needs mtriple and mcpu"
        yield target.get("mtriple"), target.get("mcpu"), ",".join(target.get("mattr"))
    elif kind == "cuda":
        yield "nvptx64-nvidia-cuda", target.get("arch"), ""
    elif kind == "rocm":
        yield target.get("mtriple"), target.get("mcpu"), ",".join(target.get("mattr"))
    if target.host is not None:
        yield from _machines(target.host)


def test_every_cpu_and_feature_is_known_to_llvm(capfd: pytest.CaptureFixture[str]) -> None:
    import llvmlite.binding as llvm

    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    checked = set()
    for name in TAGS:
        for triple, cpu, features in _machines(Target(name)):
            capfd.readouterr()
            llvm.Target.from_triple(triple).create_target_machine(cpu=cpu, features=features)
            complaint = capfd.readouterr().err
            assert "not a recognized" not in complaint, f"{name} {triple} {cpu}: {complaint}"
            checked.add((triple, cpu))
    assert len(checked) >= 30


def test_figures_spot_checks() -> None:
    assert Target("aws/c5").get("mcpu") == "skylake-avx512"
    assert Target("aws/c6i").get("mcpu") == "icelake-server"
    assert Target("aws/c7i").get("mcpu") == "sapphirerapids"
    assert [Target(f"aws/{n}").get("mcpu") for n in ("c6g", "c7g", "c8g")] == [
        "neoverse-n1", "neoverse-v1", "neoverse-v2"
    ]
    assert Target("raspberry-pi/4b-aarch64").get("mcpu") == "cortex-a72"
    assert Target("raspberry-pi/5").get("mcpu") == "cortex-a76"
    orin = Target("nvidia/jetson-agx-orin")
    assert orin.get("arch") == "sm_87"
    assert orin.host is not None and orin.host.get("mtriple") == "aarch64-linux-gnu"
    expected = {
        "a100": "sm_80", "h100": "sm_90", "h200": "sm_90", "l4": "sm_89", "rtx-4090": "sm_89"
    }
    assert {name: Target(f"nvidia/{name}").get("arch") for name in expected} == expected
    assert Target("nvidia/h100").get("max_shared_memory_per_block_optin") == 227 * 1024
    assert Target("nvidia/rtx-4090").get("l2_cache_size_bytes") == 72 * 1024 * 1024
    m4 = Target("arm/cortex-m4")
    assert m4.kind.name == "c"
    assert (m4.get("mtriple"), m4.get("mcpu"), m4.get("mfloat-abi")) == (
        "thumbv7em-none-eabi", "cortex-m4", "hard"
    )
    assert Target("arm/cortex-m55").get("mtriple") == "thumbv8.1m.main-none-eabi"
    assert Target("sifive/hifive-unmatched").get("mattr") == ("+a", "+c", "+d", "+f", "+m")


@pytest.mark.parametrize("alias", list_tags(aliases=True))
def test_aliases_resolve_to_the_canonical_tag(alias: str) -> None:
    tag = get_tag(alias)
    assert tag.canonical in TAGS
    assert alias == tag.canonical or alias in tag.aliases
    assert Target(alias) == Target(tag.canonical)


def test_alias_examples() -> None:
    assert Target("aws/c5.xlarge").tag == "aws/c5"
    assert Target("raspberry-pi/400").tag == "raspberry-pi/4b-aarch64"
    assert Target("banana-pi/bpi-f3").tag == "milkv/jupiter"


@pytest.fixture
def versioned_tag() -> Iterator[str]:
    base = {"kind": "llvm", "mtriple": "aarch64-linux-gnu"}
    register_tag("acme/board", {**base, "mcpu": "cortex-a53"}, version="v1", aliases=["acme/b"])
    register_tag("acme/board", {**base, "mcpu": "cortex-a72"}, version="v2", aliases=["acme/b"])
    register_tag("acme/board", {**base, "mcpu": "cortex-a76"}, version="v10", aliases=["acme/b"])
    yield "acme/board"
    for version in ("v1", "v2", "v10"):
        unregister_tag(f"acme/board:{version}")


def test_version_suffix_and_latest(versioned_tag: str) -> None:
    assert Target(f"{versioned_tag}:v1").get("mcpu") == "cortex-a53"
    assert Target(f"{versioned_tag}:v1").tag == "acme/board:v1"
    latest = Target(versioned_tag)
    assert latest.tag == "acme/board:v10"  # v10 > v2: versions compare as numbers
    assert latest.get("mcpu") == "cortex-a76"
    assert Target("acme/b:v2").tag == "acme/board:v2"
    assert "acme/board:v1" in list_tags()
    with pytest.raises(TargetError, match=r"has no version 'v3'.*Versions: v1, v2, v10"):
        Target("acme/board:v3")


def test_register_tag_rejects_clashes_and_bad_names() -> None:
    with pytest.raises(TargetError, match="'aws/c5' is defined twice"):
        register_tag("aws/c5", {"kind": "llvm"})
    with pytest.raises(TargetError, match="is already the name or an alias of 'aws/c6i'"):
        register_tag("acme/x", {"kind": "llvm"}, aliases=["aws/c6i.large"])
    with pytest.raises(TargetError, match="a tag name is 'vendor/name'"):
        register_tag("NoVendor", {"kind": "llvm"})
    with pytest.raises(TargetError, match="must not contain 'tag'"):
        register_tag("acme/y", {"kind": "llvm", "tag": "acme/y"})
    with pytest.raises(TargetError, match="a tag version looks like 'v1'"):
        register_tag("acme/z", {"kind": "llvm"}, version="1.0")
