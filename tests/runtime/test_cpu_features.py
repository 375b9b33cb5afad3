"""CPU features: LLVM says what a target enables, the library checks the running CPU.

A library compiled for CPU features this machine lacks is refused at load (Python)
and on its first call (C), naming them, instead of dying with SIGILL. No test here
fails because of what the host has: a test that needs a target this host lacks
picks one from a list reaching past the newest CPUs LLVM knows (APX, AVX10), and
is skipped, with the reason, on a machine that has all of them.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import kiln
from kiln.codegen.cpu_requirements import implied_features, required_features
from kiln.codegen.host import cpu_features_config, host_runtime_source
from kiln.errors import CompileError
from kiln.ir import IRBuilder
from kiln.runtime.cpu_features import TABLES, machine_arch, table_arch, table_for
from kiln.runtime.native import include_dir
from kiln.target.host import machine_config
from kiln.target.llvm_names import llvm_names

X86 = "x86_64-unknown-linux-gnu"
AARCH64 = "aarch64-unknown-linux-gnu"
TRIPLES = {"x86": X86, "aarch64": AARCH64}
ON_X86 = machine_arch() == "x86_64"
needs_x86 = pytest.mark.skipif(not ON_X86, reason="runs x86 code on this machine")

# Newest first: diamondrapids has APX (egpr, ndd, ...) and AVX10.2, which no earlier
# CPU has; then single features past it, for a machine that has all of these.
FOREIGN_CPUS = ("diamondrapids", "graniterapids", "sapphirerapids", "znver5", "znver4",
                "icelake-server", "skylake-avx512", "haswell")
FOREIGN_MATTRS = ("+egpr", "+avx10.2", "+amx-tile", "+avx512fp16", "+avx512f", "+avx2")


def _llvm() -> Any:
    from kiln.codegen.llvm.target_machine import llvm_binding

    return llvm_binding()


# ------------------------------------------------------------------ LLVM's side
def test_probe_gives_llvm_known_answers() -> None:
    v3 = set(required_features(X86, "x86-64-v3", ""))
    assert {"avx", "avx2", "fma", "bmi2", "sse4.2"} <= v3 and "avx512f" not in v3
    dmr = set(required_features(X86, "diamondrapids", ""))
    assert {"egpr", "ndd", "ppx", "push2pop2", "nf", "ccmp", "avx10.2", "amx-tile"} <= dmr
    assert "egpr" not in required_features(X86, "graniterapids", "")
    skx = set(required_features(X86, "skylake-avx512", "-avx512f"))
    assert "avx2" in skx and not {f for f in skx if f.startswith("avx512")}
    assert "avx512f" in required_features(X86, "x86-64-v2", "+avx512f")
    v1 = set(required_features(AARCH64, "neoverse-v1", ""))
    assert {"neon", "sve", "dotprod", "i8mm", "bf16", "lse"} <= v1
    a72 = set(required_features(AARCH64, "cortex-a72", ""))
    assert "neon" in a72 and not {"sve", "dotprod", "lse"} & a72
    assert "sve" not in required_features(AARCH64, "neoverse-v1", "-sve")
    # No table for the triple: nothing recorded (and nothing checked).
    assert required_features("riscv64-unknown-linux-gnu", "sifive-u74", "") == []


def _cpu_targets() -> list[tuple[str, str]]:
    """(triple, cpu) of the x86 and AArch64 CPUs of every llvm tag, and FOREIGN_CPUS."""
    out = {(X86, cpu) for cpu in FOREIGN_CPUS}
    for name in kiln.target.list_tags():
        t = kiln.Target(name)
        for cand in (t, t.host):
            if cand is None or cand.kind.name != "llvm" or not cand.get("mcpu"):
                continue
            if table_arch(str(cand.get("mtriple"))) is not None:
                out.add((str(cand.get("mtriple")), str(cand.get("mcpu"))))
    return sorted(out)


def test_every_recorded_name_is_decidable() -> None:
    """Only features the table can detect are recorded, never tuning flags; system
    instructions (not in kiln's code, often hidden by hypervisors) are not either."""
    targets = _cpu_targets()
    assert len(targets) > 20
    for triple, cpu in targets:
        table = table_for(triple)
        need = required_features(triple, cpu, "")
        assert need, (triple, cpu)
        assert [f for f in need if f not in table or table[f].system] == [], (triple, cpu)


def test_table_names_are_llvm_features() -> None:
    """Every row names a feature LLVM knows for the architecture (a typo or a rename in
    a newer LLVM fails here), and the table covers LLVM's host feature map."""
    for arch, table in TABLES.items():
        names = llvm_names(TRIPLES[arch])
        assert names is not None
        assert sorted(set(table) - names.features) == [], arch
    host = table_arch(str(_llvm().get_process_triple()))
    if host is not None:  # every name LLVM's host detection knows here has a row
        assert sorted(set(dict(_llvm().get_host_cpu_features())) - set(TABLES[host])) == []


def test_a_feature_the_table_cannot_decide_is_a_compile_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import kiln.codegen.cpu_requirements as req

    partial = {k: v for k, v in TABLES["x86"].items() if k != "avx2"}
    monkeypatch.setattr(req, "table_for", lambda triple: partial)
    monkeypatch.setattr(req, "_candidates", lambda triple: (*sorted(partial), "avx2"))
    with pytest.raises(CompileError, match=r"kiln cannot check .*: avx2; .*-avx2"):
        req.required_features(X86, "haswell", "")
    assert "avx2" not in req.required_features(X86, "haswell", "-avx2")


def _counted_probes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ...]]:
    """Forget the probes made so far and record the candidates of each new one."""
    import kiln.target.llvm_features as lf

    monkeypatch.setattr(lf, "_ANSWERS", {})
    made: list[tuple[str, ...]] = []
    real = lf._probe

    def probe(triple: str, cpu: str, features: str, candidates: list[str]) -> frozenset[str]:
        made.append(tuple(candidates))
        return real(triple, cpu, features, candidates)

    monkeypatch.setattr(lf, "_probe", probe)
    return made


def test_probe_is_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    made = _counted_probes(monkeypatch)
    first = required_features(X86, "haswell", "")
    assert required_features(X86, "haswell", "") == first
    assert len(made) == 1


def test_a_probe_of_more_candidates_answers_fewer(monkeypatch: pytest.MonkeyPatch) -> None:
    made = _counted_probes(monkeypatch)
    wide = implied_features(X86, "haswell", "-fma", ("avx2", "fma", "avx512f", "f16c"))
    assert wide == {"avx2", "f16c"}
    assert implied_features(X86, "haswell", "-fma", ("fma", "avx2")) == {"avx2"}
    assert len(made) == 1
    # a candidate the first probe did not ask about takes a probe of its own
    assert implied_features(X86, "haswell", "-fma", ("avx2", "bmi2")) == {"avx2", "bmi2"}
    assert len(made) == 2


def test_threads_asking_at_once_share_one_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    made = _counted_probes(monkeypatch)
    answers: list[frozenset[str]] = []
    start = threading.Barrier(4)

    def ask() -> None:
        start.wait()
        answers.append(implied_features(X86, "skylake", "", ("avx2", "avx512f", "sse4.1")))

    threads = [threading.Thread(target=ask) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert answers == [frozenset({"avx2", "sse4.1"})] * 4
    assert len(made) == 1


# ------------------------------------------------------------------ the host's side
def _table_program(tmp_path: Path, arch: str) -> Path:
    """C source that prints the features of TABLES[arch] the running CPU lacks, through
    kiln_host.c's own check (the code every library carries)."""
    config = cpu_features_config("kiln_", list(TABLES[arch].values()))
    main = ("int main(void) {\n  static char out[16384];\n"
            "  int32_t n = kiln__cpu_missing(out, (int32_t)sizeof out);\n"
            '  printf("%d\\n%s\\n", (int)n, out);\n  return 0;\n}\n')
    src = tmp_path / f"table_{arch}.c"
    src.write_text("\n".join(config) + "\n" + host_runtime_source() + "\n" + main)
    return src


def _parse_missing(stdout: str) -> set[str]:
    count, _, names = stdout.partition("\n")
    missing = {n for n in names.strip().split(", ") if n}
    assert int(count) == len(missing), stdout
    return missing


@needs_x86
@pytest.mark.parametrize("std", ["-std=c99", "-std=c11"])
def test_the_check_compiles_strictly(tmp_path: Path, std: str) -> None:
    """kiln_host.c with every row of the table, as C99 and C11, warnings as errors."""
    proc = subprocess.run(["cc", std, "-Wall", "-Wextra", "-Werror", "-pedantic", "-c",
                           str(_table_program(tmp_path, "x86")), "-o", str(tmp_path / "t.o")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@functools.cache
def _host_missing(tmp: str) -> frozenset[str]:
    """The x86 table's features this machine lacks, as every library's check sees it."""
    exe = Path(tmp) / "table_x86"
    subprocess.run(["cc", "-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic",
                    str(_table_program(Path(tmp), "x86")), "-o", str(exe)], check=True,
                   capture_output=True)
    proc = subprocess.run([str(exe)], capture_output=True, text=True, check=True)
    return frozenset(_parse_missing(proc.stdout))


@pytest.fixture(scope="module")
def host_missing(tmp_path_factory: pytest.TempPathFactory) -> frozenset[str]:
    if not ON_X86:
        pytest.skip("the x86 table is read with cpuid on an x86 machine")
    return _host_missing(str(tmp_path_factory.mktemp("table")))


@needs_x86
def test_table_view_of_this_host_equals_llvm(host_missing: frozenset[str]) -> None:
    """cpuid through kiln's table says what LLVM's host detection says, for every key."""
    llvm_host = dict(_llvm().get_host_cpu_features())
    differ = {f: (f not in host_missing, llvm_host[f]) for f in llvm_host
              if (f not in host_missing) != llvm_host[f]}
    assert {f: d for f, d in differ.items() if not _deliberate(f, d, llvm_host)} == {}, \
        f"feature: (table, LLVM) {differ}"


APX = ("egpr", "push2pop2", "ppx", "ndd", "ccmp", "nf", "cf", "zu")


def _deliberate(feature: str, table_llvm: tuple[bool, bool], llvm_host: dict[str, bool]) -> bool:
    """The two places the table is stricter than LLVM 22's detection, by design:
    - APX and AVX10 also need their register state saved by the OS (XCR0 bit 19; the
      AVX-512 state), which LLVM does not check: without it their instructions fault;
    - LLVM reads the AVX10 version as `HasLeaf24 && (EBX & 0xff)`, a bool, so it never
      reports avx10.2; the table compares the version number."""
    if table_llvm == (False, True):
        return feature in APX or feature.startswith("avx10.")
    return table_llvm == (True, False) and feature == "avx10.2" and llvm_host["avx10.1"]


@needs_x86
def test_host_target_records_exactly_the_host_features() -> None:
    """The probe of this machine's own target (Target.from_host()) finds what LLVM's host
    detection found: the probe reads LLVM's subtarget faithfully."""
    host = kiln.Target(machine_config())  # the machine's, not a $KILN_HOST_CPU
    need = required_features(X86, str(host.get("mcpu")), ",".join(host.get("mattr")))
    llvm_host = dict(_llvm().get_host_cpu_features())
    assert set(need) == {f for f, row in TABLES["x86"].items() if not row.system
                         and llvm_host[f]}


# ------------------------------------------------------------------ libraries
def _module() -> kiln.ir.IRModule:
    ib = IRBuilder()
    with ib.function("main"):
        x = ib.param("x", (64,), "float32")
        ib.ret(ib.emit(kiln.ops.call("relu", x), "y"))
    return ib.get()


def _foreign_target(host_missing: frozenset[str]) -> tuple[dict[str, Any], list[str]]:
    """A target (a CPU name where one fits, else one feature) this host lacks, and what
    it lacks; the test is skipped when the host has every one."""
    for cpu in FOREIGN_CPUS:
        lacks = sorted(set(required_features(X86, cpu, "")) & host_missing)
        if lacks:
            return {"kind": "llvm", "mtriple": X86, "mcpu": cpu}, lacks
    for mattr in FOREIGN_MATTRS:
        lacks = sorted(set(required_features(X86, "", mattr)) & host_missing)
        if lacks:
            return {"kind": "llvm", "mtriple": X86, "mattr": [mattr]}, lacks
    pytest.skip(f"this machine has every feature of {', '.join(FOREIGN_CPUS)} and "
                f"{', '.join(FOREIGN_MATTRS)}: no foreign target to refuse")


_LOAD = ("import sys, numpy as np, kiln\n"
         "try:\n"
         "    m = kiln.runtime.load_module(sys.argv[1])\n"
         "except kiln.errors.KilnError as e:\n"
         "    print(type(e).__name__ + ':', e); sys.exit(3)\n"
         "print('loaded')\n")


def _load_in_subprocess(lib: Path, **env: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-c", _LOAD, str(lib)], capture_output=True,
                          text=True, timeout=300, env={**os.environ, **env})
    assert proc.returncode >= 0, f"killed by {signal.Signals(-proc.returncode).name}"
    return proc


@needs_x86
@pytest.mark.parametrize("suffix", [".so", ".tar"])
def test_foreign_features_refused_at_load(tmp_path: Path, suffix: str,
                                          host_missing: frozenset[str]) -> None:
    target, lacks = _foreign_target(host_missing)
    lib = kiln.compile(_module(), target).export_library(tmp_path / f"m{suffix}")
    proc = _load_in_subprocess(lib)
    assert proc.returncode == 3, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stdout.startswith("CPUFeatureError:")
    named = proc.stdout.split("lacks: ", 1)[1].split(" (it would stop", 1)[0].split(", ")
    assert sorted(named) == lacks, proc.stdout
    # The documented escape hatch loads it (nothing is called).
    proc = _load_in_subprocess(lib, KILN_SKIP_CPU_CHECK="1")
    assert proc.stdout.strip() == "loaded", proc.stderr


@needs_x86
def test_c_entry_checks_features_on_first_call(tmp_path: Path,
                                               host_missing: frozenset[str]) -> None:
    """Plain C callers get the same protection: the first call of any entry fails with
    the missing features named, not an illegal instruction."""
    target, lacks = _foreign_target(host_missing)
    lib = kiln.compile(_module(), target).export_library(tmp_path / "m.so")
    example = Path(__file__).resolve().parents[2] / "examples" / "c_deploy" / "deploy.c"
    exe = tmp_path / "deploy"
    subprocess.run(["cc", "-Wall", "-Werror", f"-I{include_dir()}", str(example), "-ldl",
                    "-o", str(exe)], check=True)
    (tmp_path / "in.bin").write_bytes(np.ones(64, np.float32).tobytes())
    argv = [str(exe), str(lib), "kiln_", str(tmp_path / "in.bin"), "64",
            str(tmp_path / "out.bin"), "64"]
    proc = subprocess.run(argv, capture_output=True, text=True)
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    assert "main: this CPU lacks" in proc.stderr and "the library was compiled for" in proc.stderr
    assert all(f in proc.stderr for f in lacks[:3]), proc.stderr  # the buffer may cut the list
    # KILN_SKIP_CPU_CHECK=1 skips the entry's check too: called with no arguments, the
    # entry gets past it to the argument count (and no kernel runs).
    call = ("import ctypes, sys\n"
            "lib = ctypes.CDLL(sys.argv[1])\n"
            "entry, err = lib['kiln_main'], lib['kiln__last_error']\n"
            "entry.restype, err.restype = ctypes.c_int32, ctypes.c_char_p\n"
            "print(entry(None, None, 0), err().decode())\n")
    for skip, expected in (("0", "main: this CPU lacks"), ("1", "main: expected 2 arguments")):
        proc = subprocess.run([sys.executable, "-c", call, str(lib)], capture_output=True,
                              text=True, env={**os.environ, "KILN_SKIP_CPU_CHECK": skip})
        assert proc.stdout.startswith(f"-1 {expected}"), (skip, proc.stdout, proc.stderr)


@needs_x86
def test_mattr_emulates_a_smaller_cpu(tmp_path: Path, host_missing: frozenset[str]) -> None:
    """Disabling this host's widest vector unit (avx512f on an AVX-512 machine, avx2 on an
    AVX2 one) records a set without it, and the library loads and runs here."""
    host = kiln.Target.from_host()
    widest = next(f for f in ("avx512f", "avx2", "avx") if f not in host_missing)
    # mattr is applied in name order, so "+avx512vl" after "-avx512f" would turn it back
    # on (and the recorded set would rightly say so): drop every feature implying it.
    mattr = [f for f in host.get("mattr") if f[0] == "-" or widest not in
             implied_features(X86, "", f, (widest,))] + [f"-{widest}"]
    target = host.with_attrs({"mattr": mattr})
    ex = kiln.compile(_module(), target)
    kernels = next(a for a in ex.artifacts if a.file_name == "kernels.o")
    need = kernels.metadata["requires_features"]
    assert widest not in need and "sse2" in need
    assert not set(need) & host_missing
    lib = kiln.runtime.load_module(ex.export_library(tmp_path / "m.so"))
    x = np.linspace(-1, 1, 64, dtype=np.float32)
    np.testing.assert_array_equal(lib["main"](x), np.maximum(x, 0))


@needs_x86
def test_host_library_records_and_passes(tmp_path: Path) -> None:
    """Code for this host records its features (the vector units among them) and loads."""
    ex = kiln.compile(_module(), kiln.Target.from_host())
    kernels = next(a for a in ex.artifacts if a.file_name == "kernels.o")
    assert "sse2" in kernels.metadata["requires_features"]
    lib = kiln.runtime.load_module(ex.export_library(tmp_path / "m.so"))
    x = np.linspace(-1, 1, 64, dtype=np.float32)
    np.testing.assert_array_equal(lib["main"](x), np.maximum(x, 0))


# ------------------------------------------------------------------ AArch64, under qemu
QEMU = ["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu"]
needs_qemu = pytest.mark.skipif(
    not (shutil.which("qemu-aarch64") and shutil.which("aarch64-linux-gnu-gcc")
         and Path("/usr/aarch64-linux-gnu").is_dir()),
    reason="needs qemu-aarch64 and aarch64-linux-gnu-gcc (libc6-dev-arm64-cross)")


@needs_qemu
def test_aarch64_table_agrees_with_qemu_cpu_models(tmp_path: Path) -> None:
    """The hwcap rows, read with getauxval under qemu's model of a CPU, find every feature
    LLVM's CPU of that name has, and miss what an older core lacks."""
    exe = tmp_path / "table_aarch64"
    subprocess.run(["aarch64-linux-gnu-gcc", "-std=c11", "-Wall", "-Wextra", "-Werror",
                    "-pedantic", str(_table_program(tmp_path, "aarch64")), "-o", str(exe)],
                   check=True)
    missing = {}
    for cpu in ("cortex-a53", "cortex-a72", "neoverse-n1", "a64fx"):
        proc = subprocess.run([*QEMU, "-cpu", cpu, str(exe)], capture_output=True, text=True,
                              check=True, timeout=60)
        missing[cpu] = _parse_missing(proc.stdout)
        assert set(required_features(AARCH64, cpu, "")) & missing[cpu] == set(), cpu
    assert {"lse", "dotprod", "sve", "i8mm"} <= missing["cortex-a53"]
    assert "sve" in missing["neoverse-n1"] and "sve" not in missing["a64fx"]


@needs_qemu
def test_aarch64_first_call_refuses_an_older_cpu(tmp_path: Path) -> None:
    """A neoverse-n1 library, called from plain C under qemu's Cortex-A53: the first call
    names the missing features; under a Neoverse-N1 it runs."""
    target = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "neoverse-n1"}
    lib = kiln.compile(_module(), target).export_library(tmp_path / "m.so")
    example = Path(__file__).resolve().parents[2] / "examples" / "c_deploy" / "deploy.c"
    exe = tmp_path / "deploy"
    subprocess.run(["aarch64-linux-gnu-gcc", "-Wall", "-Werror", f"-I{include_dir()}",
                    str(example), "-ldl", "-o", str(exe)], check=True)
    x = np.linspace(-1, 1, 64, dtype=np.float32)
    (tmp_path / "in.bin").write_bytes(x.tobytes())
    argv = [str(exe), str(lib), "kiln_", str(tmp_path / "in.bin"), "64",
            str(tmp_path / "out.bin"), "64"]
    proc = subprocess.run([*QEMU, "-cpu", "cortex-a53", *argv], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    assert "main: this CPU lacks features the library was compiled for: " in proc.stderr
    assert "lse" in proc.stderr and "dotprod" in proc.stderr
    proc = subprocess.run([*QEMU, "-cpu", "neoverse-n1", *argv], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    y = np.frombuffer((tmp_path / "out.bin").read_bytes(), np.float32)
    np.testing.assert_array_equal(y, np.maximum(x, 0))


# ------------------------------------------------------------------ the c backend
@needs_x86
def test_c_backend_with_mcpu_is_checked_too(tmp_path: Path,
                                            host_missing: frozenset[str]) -> None:
    """A `c` target with mcpu compiles kernels.c with `-march=<mcpu>`: it records the same
    LLVM-derived features, host.c (built for any CPU) checks them, and the load refuses."""
    def gcc_knows(cpu: str) -> bool:
        return subprocess.run(["cc", f"-march={cpu}", "-E", "-x", "c", "-"], input="",
                              capture_output=True, text=True).returncode == 0

    cpu = next((c for c in FOREIGN_CPUS if set(required_features(X86, c, "")) & host_missing
                and gcc_knows(c)), None)
    if cpu is None:
        pytest.skip("this machine has every feature of the CPUs the C compiler knows")
    ex = kiln.compile(_module(), {"kind": "c", "mcpu": cpu})
    kernels, host = (next(a for a in ex.artifacts if a.file_name == name)
                     for name in ("kernels.c", "host.c"))
    assert f"-march={cpu}" in kernels.metadata["cflags"]
    assert not any(f.startswith("-march") for f in host.metadata["cflags"])
    assert kernels.metadata["requires_features"] == required_features(X86, cpu, "")
    proc = _load_in_subprocess(ex.export_library(tmp_path / "m.so"))
    assert proc.returncode == 3 and proc.stdout.startswith("CPUFeatureError:"), proc.stdout
