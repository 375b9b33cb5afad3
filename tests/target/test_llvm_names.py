"""mcpu/mattr typos are TargetErrors when the target is built, never an LLVM abort."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from kiln.errors import TargetError
from kiln.target import Target, list_tags

TYPOS = [
    ({"kind": "llvm", "mcpu": "skylakee"}, r"LLVM knows no CPU 'skylakee' for x86_64; "
                                           r"did you mean 'skylake'\?"),
    ({"kind": "llvm", "mattr": ["+avx5112f"]}, r"no feature 'avx5112f' .* 'avx512f'"),
    ({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "cortex-a77x"},
     r"no CPU 'cortex-a77x' for aarch64; did you mean 'cortex-a77'"),
    ({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon", "-sve2x"]},
     r"no feature 'sve2x' for aarch64"),
    ({"kind": "llvmjit", "mcpu": "znver55"}, r"target kind 'llvmjit': LLVM knows no CPU"),
]


@pytest.mark.parametrize(("spec", "message"), TYPOS)
def test_typos_raise_target_error(spec: dict[str, object], message: str) -> None:
    if spec["kind"] == "llvm" and "mtriple" not in spec:
        spec = {**spec, "mtriple": "x86_64-unknown-linux-gnu"}
    with pytest.raises(TargetError, match=message):
        Target(spec)


def test_the_typo_that_used_to_abort_is_caught_in_process() -> None:
    """`skylakee` once aborted the whole process inside LLVM at code generation."""
    code = ("import kiln\n"
            "try:\n"
            "    kiln.compile(kiln.ir.IRModule({}), '{\"kind\":\"llvm\",\"mtriple\":"
            "\"x86_64-linux-gnu\",\"mcpu\":\"skylakee\"}')\n"
            "except kiln.errors.TargetError as e:\n"
            "    print('TargetError:', e)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "TargetError:" in proc.stdout and "did you mean 'skylake'" in proc.stdout


def test_every_llvm_tag_passes() -> None:
    for tag in list_tags():
        target = Target(tag)
        if target.kind.name == "llvm":
            assert target.get("mcpu") is None or isinstance(target.get("mcpu"), str)


# A child whose os.dup/os.dup2 fail: the names are checked without redirecting file
# descriptor 2, and a marker written to it in the middle of the check (from the
# suggestion step, which runs between LLVM's answer and the error) reaches the parent.
UNTOUCHED_STDERR = textwrap.dedent("""
    import os
    import kiln.target.llvm_names as names
    from kiln.errors import TargetError
    from kiln.target import Target

    def refuse(*args):
        raise AssertionError("file descriptor redirected")

    os.dup = os.dup2 = refuse
    real_suggest = names.suggest

    def suggest_with_marker(*args):
        os.write(2, b"MARKER-DURING-CHECK\\n")
        return real_suggest(*args)

    names.suggest = suggest_with_marker
    os.write(2, b"MARKER-BEFORE\\n")
    Target({"kind": "llvm", "mtriple": "x86_64-unknown-linux-gnu", "mcpu": "skylake"})
    try:
        Target({"kind": "llvm", "mtriple": "x86_64-unknown-linux-gnu", "mcpu": "skylakee"})
    except TargetError as e:
        print(e)
    os.write(2, b"MARKER-AFTER\\n")
""")


def test_the_check_leaves_the_process_stderr_alone() -> None:
    proc = subprocess.run([sys.executable, "-c", UNTOUCHED_STDERR], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "LLVM knows no CPU 'skylakee'" in proc.stdout and "'skylake'" in proc.stdout
    lines = proc.stderr.splitlines()
    assert lines == ["MARKER-BEFORE", "MARKER-DURING-CHECK", "MARKER-AFTER"], proc.stderr


def test_the_host_names_need_no_child_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """The host target's CPU and features are LLVM's own detection: checked without the
    child process that lists LLVM's names; a name the host did not detect still is."""
    import kiln.target.llvm_names as names
    from kiln.target.host import detected_names, host_config

    host = detected_names()
    if host is None:
        pytest.skip("needs llvmlite")
    triple, cpu, features = host
    asked: list[str] = []

    def listed(target: str, triple: str) -> names.LLVMNames | None:
        asked.append(triple)
        return names.LLVMNames(frozenset({cpu}), features)

    monkeypatch.setattr(names, "_names_of_target", listed)
    assert Target(host_config()).get("mcpu") == cpu
    Target({"kind": "llvm", "mtriple": triple, "mcpu": cpu, "mattr": ["+" + f for f in features]})
    assert asked == []
    with pytest.raises(TargetError, match="LLVM knows no CPU 'not-this-cpu'"):
        Target({"kind": "llvm", "mtriple": triple, "mcpu": "not-this-cpu"})
    with pytest.raises(TargetError, match="no feature 'not-a-feature'"):
        Target({"kind": "llvm", "mtriple": triple, "mcpu": cpu, "mattr": ["+not-a-feature"]})
    assert asked == [triple, triple]
