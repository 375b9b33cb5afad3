"""Every spec form builds the same canonical target, and round-trips through export()."""

from __future__ import annotations

import json
import pickle

import pytest

from kiln.target import Target, TargetError

ACCEPTANCE_CLI = "llvm -mtriple=aarch64-linux-gnu -mattr=+neon"
ACCEPTANCE_DICT = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]}


def test_acceptance_cli_equals_dict() -> None:
    assert Target(ACCEPTANCE_CLI) == Target(ACCEPTANCE_DICT)
    assert hash(Target(ACCEPTANCE_CLI)) == hash(Target(ACCEPTANCE_DICT))


@pytest.mark.parametrize(
    "spec",
    [
        "llvm",
        "c",
        "cuda",
        ACCEPTANCE_CLI,
        ACCEPTANCE_DICT,
        json.dumps(ACCEPTANCE_DICT),
        "raspberry-pi/4b-aarch64",
        "nvidia/jetson-agx-orin",
        {"tag": "aws/c5", "opt-level": 2},
        {"kind": "composite", "devices": ["nvidia/a100", "llvm"], "host": "llvm"},
    ],
    ids=str,
)
def test_round_trip_through_export_json_and_pickle(spec: object) -> None:
    target = Target(spec)  # type: ignore[arg-type]
    for again in (
        Target(target.export()),
        Target(str(target)),
        Target(json.dumps(target.export())),
        Target(target),
        pickle.loads(pickle.dumps(target)),
    ):
        assert again == target
        assert hash(again) == hash(target)
        assert again.fingerprint() == target.fingerprint()
        assert again.export() == target.export()


def test_export_is_sorted_with_defaults_filled() -> None:
    exported = Target(ACCEPTANCE_DICT).export()
    assert list(exported) == sorted(exported)
    assert exported == {
        "fast-math": False,
        "keys": ["cpu"],
        "kind": "llvm",
        "libs": [],
        "mattr": ["+neon"],
        "mtriple": "aarch64-linux-gnu",
        "opt-level": 3,
    }
    canonical = json.dumps(exported, sort_keys=True, separators=(",", ":"))
    assert str(Target(ACCEPTANCE_DICT)) == canonical


def test_tvm_example_with_num_cores_is_rejected_with_the_reason() -> None:
    spec = "llvm -mtriple=aarch64-linux-gnu -mattr=+neon,+fp-armv8 -num-cores=4"
    with pytest.raises(TargetError, match="'num-cores' is not a target attribute") as info:
        Target(spec)
    assert "does not change generated code" in str(info.value)
    assert "when running the module" in str(info.value)
    # Without it, the same line is fine and lists split on commas.
    target = Target(spec.replace(" -num-cores=4", ""))
    assert target.get("mattr") == ("+fp-armv8", "+neon")


def test_command_line_value_types() -> None:
    target = Target("llvm -mtriple=x86_64-linux-gnu -opt-level=1 -fast-math -vector-width=256")
    assert target.get("opt-level") == 1
    assert target.get("fast-math") is True
    assert target.get("vector-width") == 256
    assert Target("llvm -fast-math=false").get("fast-math") is False
    assert Target("cuda -libs=cudnn,cublas -arch=sm_80").libs == ("cublas", "cudnn")
    assert Target("llvm -mattr=").get("mattr") == ()


def test_command_line_host_may_be_quoted() -> None:
    target = Target("cuda -arch=sm_87 -host='llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a78ae'")
    assert target.host == Target("llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a78ae")


def test_command_line_may_start_with_a_tag() -> None:
    target = Target("raspberry-pi/4b-aarch64 -opt-level=2")
    assert target.tag == "raspberry-pi/4b-aarch64"
    assert target.get("mcpu") == "cortex-a72"
    assert target.get("opt-level") == 2


def test_mattr_is_canonical_last_sign_wins_and_sorted() -> None:
    mattr = ["+avx2", "+fma", "-avx2"]
    target = Target({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mattr": mattr})
    assert target.get("mattr") == ("-avx2", "+fma")
    assert target == Target("llvm -mtriple=x86_64-linux-gnu -mattr=+fma,-avx2")


def test_tag_with_overrides_merges() -> None:
    target = Target({"tag": "aws/c5", "opt-level": 2, "mattr": ["-avx512f"]})
    assert target.tag == "aws/c5"
    assert target.get("mcpu") == "skylake-avx512"
    assert target.get("opt-level") == 2
    assert target.get("mattr") == ("-avx512f",)
    assert target != Target("aws/c5")


def test_none_means_not_given() -> None:
    assert Target({"kind": "llvm", "mcpu": None}) == Target("llvm")
    assert Target({"tag": "aws/c5", "mcpu": None}).get("mcpu") == "skylake-avx512"


def test_host_argument_builds_a_nested_target() -> None:
    target = Target("cuda -arch=sm_80", host="llvm -mtriple=x86_64-linux-gnu")
    assert target.host is not None
    assert target.host.kind.name == "llvm"
    assert target.export()["host"] == Target("llvm -mtriple=x86_64-linux-gnu").export()
    # The argument replaces a host given in the spec.
    replaced = Target({"kind": "cuda", "host": "llvm -mcpu=znver3"}, host="llvm -mcpu=znver4")
    assert replaced.host is not None and replaced.host.get("mcpu") == "znver4"


def test_device_joins_the_keys() -> None:
    target = Target({"kind": "llvm", "device": "arm_cpu", "keys": ["rpi"]})
    assert target.keys == ("rpi", "arm_cpu", "cpu")
    assert Target("nvidia/a100").keys == ("cuda", "gpu")


def test_composite_targets() -> None:
    target = Target({"kind": "composite", "devices": ["nvidia/a100", "llvm"], "host": "llvm"})
    assert target.kind.name == "composite"
    assert [device.kind.name for device in target.devices] == ["cuda", "llvm"]
    assert target.devices[0].tag == "nvidia/a100"
    assert target.host == Target("llvm")
    assert Target("llvm").devices == ()


def test_llvm_fills_the_host_triple_and_is_stable() -> None:
    import llvmlite.binding as llvm

    assert Target("llvm").get("mtriple") == llvm.get_process_triple()
    assert Target("llvm") == Target("llvm")
    assert Target("c").get("mtriple") is None  # the system C compiler's own


def test_gpu_defaults() -> None:
    cuda = Target("cuda")
    assert cuda.get("max_threads_per_block") == 1024
    assert cuda.get("thread_warp_size") == 32
    assert cuda.get("max_shared_memory_per_block") == 49152
    assert cuda.get("arch") is None
    assert Target("nvptx").get("mtriple") == "nvptx64-nvidia-cuda"
    assert Target("rocm").get("thread_warp_size") == 64
