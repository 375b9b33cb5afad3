"""A malformed target names the offending part and suggests the fix (docs/targets.md)."""

from __future__ import annotations

import pytest

from kiln.target import Target, TargetError


def error_text(spec: object, **kwargs: object) -> str:
    with pytest.raises(TargetError) as info:
        Target(spec, **kwargs)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError)
    return str(info.value)


def test_attribute_typo_suggests_the_name() -> None:
    text = error_text({"kind": "llvm", "mtripel": "aarch64-linux-gnu"})
    assert "target kind 'llvm' has no attribute 'mtripel'" in text
    assert "did you mean 'mtriple'?" in text
    assert "Valid attributes:" in text and "mcpu" in text


def test_attribute_typo_on_the_command_line_reads_the_same() -> None:
    text = error_text("llvm -mcpuu=cortex-a72")
    assert "has no attribute 'mcpuu'" in text
    assert "did you mean 'mcpu'?" in text


def test_underscore_for_hyphen_is_suggested() -> None:
    assert "did you mean 'opt-level'?" in error_text({"kind": "llvm", "opt_level": 2})


def test_wrong_type_bool_for_int() -> None:
    text = error_text({"kind": "llvm", "opt-level": True})
    assert "attribute 'opt-level' of target kind 'llvm' expects int, got bool True" in text
    assert "a bool is not an int" in text


def test_wrong_type_str_for_list() -> None:
    text = error_text({"kind": "llvm", "mattr": "+neon"})
    assert "attribute 'mattr' of target kind 'llvm' expects list[str], got str '+neon'" in text
    assert "write a list such as ['+neon']" in text


def test_wrong_type_quoted_number() -> None:
    text = error_text({"kind": "cuda", "max_threads_per_block": "512"})
    assert "expects int, got str '512'; write 512 without quotes" in text


def test_wrong_type_on_the_command_line() -> None:
    assert "attribute 'opt-level' of target kind 'llvm' expects int, got 'high'" in error_text(
        "llvm -opt-level=high"
    )
    assert "expects bool (true/false/1/0), got 'maybe'" in error_text("llvm -fast-math=maybe")
    assert "needs a value: -mcpu=<str>" in error_text("llvm -mcpu")


def test_out_of_range_and_choices() -> None:
    assert "expects int in 0..3, got 7" in error_text({"kind": "llvm", "opt-level": 7})
    text = error_text(
        {"kind": "llvm", "mtriple": "armv7a-linux-gnueabihf", "mfloat-abi": "hrad"}
    )
    assert "must be one of 'hard', 'soft', 'softfp'; got 'hrad'. did you mean 'hard'?" in text


def test_unknown_kind() -> None:
    text = error_text("lvm")
    assert "unknown target kind 'lvm'. did you mean 'llvm'?" in text
    text = error_text({"kind": "cudaa"})
    assert "unknown target kind 'cudaa'. did you mean 'cuda'?" in text
    assert "Known: c, composite, cuda" in text


def test_a_typo_of_host_is_suggested_host() -> None:
    """`host` is a head of its own, not a kind: a typo of it still gets the hint."""
    for typo in ("hots", "hsot", "Host"):
        text = error_text(typo)
        assert f"unknown target kind '{typo}'. did you mean 'host'?" in text, text
    assert "'host' (this machine's CPU)" in error_text("hots")


def test_unknown_tag() -> None:
    text = error_text("raspberry-pi/4b-arch64")
    assert "unknown target tag 'raspberry-pi/4b-arch64'." in text
    assert "did you mean 'raspberry-pi/4b-aarch64'?" in text
    text = error_text({"tag": "nvidia/a1000"})
    assert "unknown target tag 'nvidia/a1000'. did you mean 'nvidia/a100'?" in text


def test_unknown_tag_version() -> None:
    text = error_text("nvidia/a100:v2")
    assert "target tag 'nvidia/a100' has no version 'v2'" in text


def test_kind_specific_checks() -> None:
    assert "must look like 'sm_NN'" in error_text({"kind": "cuda", "arch": "ampere"})
    assert "must look like 'gfxNNN'" in error_text({"kind": "rocm", "mcpu": "mi300"})
    text = error_text("llvm -mtriple=quantum-linux-gnu")
    assert "LLVM has no backend for triple 'quantum-linux-gnu'" in text
    text = error_text({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mfloat-abi": "hard"})
    assert "'mfloat-abi' of target kind 'llvm' applies to Arm triples" in text
    assert "feature 'neon' must be '+name' or '-name'" in error_text("llvm -mattr=neon")


def test_llvmjit_must_target_this_process() -> None:
    text = error_text("llvmjit -mtriple=riscv64-unknown-linux-gnu")
    assert "llvmjit runs code in this process" in text
    assert "use kind 'llvm' to cross-compile" in text


def test_runtime_settings_are_not_target_attributes() -> None:
    assert "'device_id' is not a target attribute" in error_text({"kind": "cuda", "device_id": 1})
    assert "'system-lib' is not a target attribute" in error_text("llvm -system-lib")


def test_old_tvm_names_are_translated() -> None:
    assert "target spec uses 'id'; kiln calls it 'kind'" in error_text({"id": "llvm"})
    assert "no attribute 'target_host'; kiln calls it 'host'" in error_text(
        {"kind": "cuda", "target_host": "llvm"}
    )
    assert "kiln calls it 'max_threads_per_block'" in error_text("cuda -max_num_threads=512")


def test_bad_host_and_devices() -> None:
    text = error_text("cuda", host="cuda")
    assert "the host of a 'cuda' target must be a CPU target" in text
    text = error_text("cuda", host={"kind": "llvm", "host": "llvm"})
    assert "a host target cannot have a host" in text
    text = error_text({"kind": "cuda", "host": "llvm -mcpuu=x"})
    assert text.startswith("in attribute 'host' of target kind 'cuda': ")
    assert "did you mean 'mcpu'?" in text
    assert "needs 'devices'" in error_text({"kind": "composite"})
    assert "is itself composite" in error_text(
        {"kind": "composite", "devices": [{"kind": "composite", "devices": ["llvm"]}]}
    )
    assert "expects a list of targets, got str" in error_text(
        {"kind": "composite", "devices": "llvm"}
    )


def test_malformed_strings_and_objects() -> None:
    assert "target JSON is malformed" in error_text('{"kind": "llvm",}')
    assert "target JSON must be an object" in error_text("[1, 2]")
    assert "empty target spec" in error_text("  ")
    assert "must look like '-name=value'" in error_text("llvm mcpu=x")
    assert "-mcpu' is given twice" in error_text("llvm -mcpu=a -mcpu=b")
    assert "a target spec is a kind or tag name" in error_text(42)
    assert "neither 'kind' nor 'tag'" in error_text({"mcpu": "x"})
    assert "its kind cannot be overridden with 'cuda'" in error_text(
        {"tag": "aws/c5", "kind": "cuda"}
    )


def test_wrong_case_is_suggested() -> None:
    assert "unknown target kind 'LLVM'. did you mean 'llvm'?" in error_text("LLVM")
    assert "did you mean 'cuda'?" in error_text({"kind": "CUDA"})
    assert "did you mean 'aws/c5'?" in error_text("AWS/C5")
    assert "did you mean 'mcpu'?" in error_text({"kind": "llvm", "MCPU": "x"})
    assert "did you mean 'hard'?" in error_text(
        {"kind": "c", "mtriple": "thumbv7em-none-eabi", "mfloat-abi": "HARD"}
    )
