"""Host detection, lazy llvmlite, and the leaf rule for kiln.target."""

from __future__ import annotations

import ast
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

import kiln.target
from kiln.target import Target
from kiln.target.host import HOST_CPU_VAR
from support.processes import run_python

TARGET_DIR = pathlib.Path(kiln.target.__file__).parent


@pytest.mark.skipif(HOST_CPU_VAR in os.environ and os.environ[HOST_CPU_VAR].strip() != "",
                    reason=f"${HOST_CPU_VAR} makes host another CPU than this machine's")
def test_from_host_matches_llvmlite() -> None:
    import llvmlite.binding as llvm

    host = Target.from_host()
    features = llvm.get_host_cpu_features()
    expected = tuple(("+" if on else "-") + name for name, on in sorted(features.items()))
    assert host.kind.name == "llvm"
    assert host.get("mtriple") == llvm.get_process_triple()
    assert host.get("mcpu") == llvm.get_host_cpu_name()
    assert host.get("mattr") == expected
    assert list(host.get("mattr")) == sorted(host.get("mattr"), key=lambda f: f[1:])
    assert set(features.flatten().split(",")) == set(host.get("mattr"))


def test_from_host_is_cached_and_round_trips() -> None:
    assert Target.from_host() is Target.from_host()
    assert Target(Target.from_host().export()) == Target.from_host()


def _run(code: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, check=True, timeout=60,
    )
    return result.stdout.strip()


def test_llvm_target_is_equal_across_processes() -> None:
    out = _run(
        """
        from kiln.target import Target
        print(Target("llvm").fingerprint(), Target("nvidia/jetson-agx-orin").fingerprint())
        """
    )
    assert out.split() == [
        Target("llvm").fingerprint(), Target("nvidia/jetson-agx-orin").fingerprint()
    ]


def test_import_does_not_load_llvmlite_and_works_without_it() -> None:
    out = _run(
        """
        import sys
        import kiln.target
        assert "llvmlite" not in sys.modules, "kiln.target imported llvmlite eagerly"
        sys.modules["llvmlite"] = None  # now make it unimportable
        sys.modules["llvmlite.binding"] = None
        from kiln.target import Target, TargetError
        print(Target("nvidia/a100").get("arch"))
        print(Target("llvm -mtriple=aarch64-linux-gnu").get("mtriple"))
        print(Target("llvm").get("mtriple").count("-") >= 2)
        try:
            Target.from_host()
        except TargetError as err:
            print("needs llvmlite" in str(err))
        """
    )
    assert out.splitlines() == ["sm_80", "aarch64-linux-gnu", "True", "True"]


def test_target_package_is_a_leaf() -> None:
    allowed = ("kiln.target", "kiln._registry", "kiln.errors")
    for path in TARGET_DIR.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                if name.startswith("kiln"):
                    assert name.startswith(allowed), f"{path.name} imports {name}"
        top_level = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
        for node in top_level:
            module = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
            eager = (module or "").startswith("llvmlite")
            assert not eager, f"{path.name} imports llvmlite at module level"


# An LLVM CPU of this machine's architecture that lacks the widest vectors of today's
# servers, for `host` to stand for.
STAND_IN = {"x86_64": ("haswell", "avx512f"), "aarch64": ("cortex-a53", "sve")}

STAND_IN_CHILD = """
import sys
import numpy as np
import kiln
from kiln.codegen.c.flags import arch_flags
from kiln.script import ir_module, T
from kiln.target import Target
from kiln.target.isa import isa_for

@ir_module
class Mod:
    @T.prim_func
    def add_one(X: T.Buffer((64,), "float32"), Y: T.Buffer((64,), "float32")):
        for i in T.serial(64):
            Y[i] = X[i] + T.float32(1)

host = Target.from_host()
print(host.get("mcpu"), sorted(isa_for(host).features))
print(arch_flags(Target(dict(host.export(), kind="c"))))
x, y = np.arange(64, dtype="float32"), np.empty(64, "float32")
kiln.compile(Mod)["add_one"](x, y)
print(bool((y == x + 1).all()))
"""


def test_host_cpu_variable_makes_host_another_cpu(tmp_path: pathlib.Path) -> None:
    """$KILN_HOST_CPU makes `host` an older CPU of this machine's architecture: its
    features only, the C compiler asked for it by name (not -march=native), and what
    kiln builds for it runs here."""
    import platform

    cpu, missing = STAND_IN.get(platform.machine().lower(), (None, None))
    if cpu is None:
        pytest.skip(f"no stand-in CPU listed for {platform.machine()}")
    script = tmp_path / "child.py"  # the DSL reads its source from a file
    script.write_text(STAND_IN_CHILD)
    proc = run_python(script, env={HOST_CPU_VAR: cpu})
    assert proc.returncode == 0, proc.stderr
    name, flags, ran = proc.stdout.strip().splitlines()[-3:]
    assert name.split()[0] == cpu and f"'{missing}'" not in name, name
    assert "native" not in flags and cpu in flags, flags
    assert ran == "True"


def test_host_cpu_variable_names_an_llvm_cpu() -> None:
    proc = run_python("from kiln.target import Target; Target.from_host()",
                      env={HOST_CPU_VAR: "zen99"})
    assert proc.returncode != 0
    assert f"${HOST_CPU_VAR}='zen99'" in proc.stderr and "TargetError" in proc.stderr
