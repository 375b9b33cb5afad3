"""export_library (.so / .tar / .a) and load_module, checked from fresh processes and C."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kiln.artifact import Artifact
from kiln.errors import CompileError, FormatError
from kiln.export import export_library, load_module
from kiln.runtime import include_dir
from kiln.runtime.threads import POOL_EXPORTS
from kiln.runtime.weights_check import CHECK_EXPORTS
from support import handmade_lib as hm

META = hm.library_metadata("kiln_")
INPUTS = {
    "main": (np.array([0.25, -1.0, 3.0, 1e30], np.float32),),
    "split": (np.array([-5, 0, 2**40], np.int64),),
}


def _run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False, **kwargs)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}"
    return proc


def _results(lib: Any) -> dict[str, list[bytes]]:
    out: dict[str, list[bytes]] = {}
    for name, args in INPUTS.items():
        res = lib[name](*args)
        out[name] = [r.tobytes() for r in (res if isinstance(res, tuple) else (res,))]
    return out


LOAD_AND_PRINT = """
import sys
import numpy as np
from kiln.runtime import load_module
INPUTS = {inputs}
lib = load_module(sys.argv[1])
for name, args in INPUTS.items():
    res = lib[name](*(np.array(a, dtype=d) for a, d in args))
    for r in (res if isinstance(res, tuple) else (res,)):
        print(name, r.dtype, r.tobytes().hex())
"""


def _fresh_process_results(path: Path, preamble: str = "") -> list[str]:
    inputs = {k: [(a.tolist(), str(a.dtype)) for a in v] for k, v in INPUTS.items()}
    script = preamble + LOAD_AND_PRINT.format(inputs=inputs)
    proc = _run([sys.executable, "-c", script, str(path)])
    return proc.stdout.split("\n")[:-1]


def _expected_lines() -> list[str]:
    lines = []
    for name, args in INPUTS.items():
        ref = hm.reference(name, *args)
        for r in ref if isinstance(ref, tuple) else (ref,):
            lines.append(f"{name} {r.dtype} {r.tobytes().hex()}")
    return lines


# ------------------------------------------------------------------ round trips
@pytest.mark.parametrize("suffix", [".so", ".tar"])
def test_fresh_process_load_gives_bit_identical_results(
        exported: dict[str, Path], suffix: str) -> None:
    assert _fresh_process_results(exported[suffix]) == _expected_lines()
    with load_module(exported[suffix]) as lib:
        in_process = _results(lib)
    assert [f"{n} {b.hex()}" for n, bs in in_process.items() for b in bs] == [
        f"{line.split()[0]} {line.split()[2]}" for line in _expected_lines()]


def test_runtime_alone_loads_and_runs_without_llvmlite_or_onnx(exported: dict[str, Path]) -> None:
    """A deploy host: the compiler's dependencies cannot even be imported."""
    blocker = textwrap.dedent("""
        import sys
        class _Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("llvmlite", "onnx", "onnxruntime"):
                    raise ImportError("blocked on this deploy host: " + name)
                return None
        sys.meta_path.insert(0, _Block())
        import kiln.runtime
    """)
    check = textwrap.dedent("""
        compiler = [m for m in sys.modules if m.split(".")[0] in ("llvmlite", "onnx")
                    or m.startswith(("kiln.ir", "kiln.codegen", "kiln.transform", "kiln.target",
                                     "kiln.frontend", "kiln.driver"))]
        assert not compiler, compiler
    """)
    for suffix in (".so", ".tar"):
        script_lines = _fresh_process_results(exported[suffix], preamble=blocker)
        assert script_lines == _expected_lines()
    _run([sys.executable, "-c", blocker + "from kiln.runtime import load_module\n"
          f"load_module({str(exported['.so'])!r})\n" + check])


def test_exported_symbols_are_exactly_the_abi(exported: dict[str, Path]) -> None:
    nm = _run(["nm", "-D", "--defined-only", str(exported[".so"])]).stdout
    symbols = {line.split()[-1] for line in nm.splitlines()}
    assert symbols == {"kiln_add_one", "kiln_scale_add", "kiln_main", "kiln_split",
                       "kiln__last_error", "kiln__metadata", "kiln__cpu_missing", "kiln__blob",
                       *(f"kiln__{name}" for name in POOL_EXPORTS),
                       *(f"kiln__{name}" for name in CHECK_EXPORTS)}  # the weights' check
    kinds = {line.split()[-1]: line.split()[-2] for line in nm.splitlines()}
    assert kinds["kiln__blob"] == "R"  # read-only data


def test_weights_are_aligned_read_only_data(exported: dict[str, Path]) -> None:
    nm = _run(["nm", str(exported[".so"])]).stdout
    (line,) = [entry for entry in nm.splitlines() if entry.endswith(" kiln__consts")]
    address, kind, _ = line.split()
    assert kind == "r" and int(address, 16) % 64 == 0


def test_tar_is_a_plain_archive_of_the_artifacts(exported: dict[str, Path]) -> None:
    listing = _run(["tar", "tf", str(exported[".tar"])]).stdout.split()
    assert listing == ["manifest.json", "c/kernels.c", "host/host.c", "c/constants.bin"]


# ------------------------------------------------------------------ damaged files
def _damage_blob(data: bytes) -> bytes:
    at = data.index(b"KILNBLOB") + 200
    return data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1:]


@pytest.mark.parametrize(("what", "damage", "message"), [
    ("truncated", lambda d: d[: len(d) // 3], "damaged or truncated|cannot load"),
    ("blob byte flipped", _damage_blob, "checksum mismatch"),
    ("not ELF", lambda d: b"hello world" * 100, "not an ELF file"),
    ("empty", lambda d: b"", "not an ELF file"),
])
def test_damaged_shared_library_raises_format_error(
        exported: dict[str, Path], tmp_path: Path, what: str, damage: Any, message: str) -> None:
    bad = tmp_path / "bad.so"
    bad.write_bytes(damage(exported[".so"].read_bytes()))
    with pytest.raises(FormatError, match=message):
        load_module(bad)


def test_library_without_blob_is_not_a_kiln_library(tmp_path: Path) -> None:
    src = tmp_path / "x.c"
    src.write_text("int f(void) { return 1; }\n")
    so = tmp_path / "plain.so"
    _run(["cc", "-shared", "-fPIC", "-o", str(so), str(src)])
    with pytest.raises(FormatError, match="not a library exported by kiln"):
        load_module(so)


@pytest.mark.parametrize(("what", "damage"), [
    ("truncated", lambda d: d[: len(d) // 2]),
    ("member byte flipped", lambda d: d.replace(b"kiln__kernel_main", b"kiln__kernel_MAIN", 1)),
    ("garbage", lambda d: os.urandom(2048)),
])
def test_damaged_tar_raises_format_error(
        exported: dict[str, Path], tmp_path: Path, what: str, damage: Any) -> None:
    bad = tmp_path / "bad.tar"
    bad.write_bytes(damage(exported[".tar"].read_bytes()))
    with pytest.raises(FormatError):
        load_module(bad)


# ------------------------------------------------------------------ export errors
def test_unknown_suffix_lists_the_valid_ones(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"unknown suffix '\.dylib'; valid suffixes: \.so "
                                         r"\(shared library\), \.tar .*, \.a "):
        export_library(hm.artifacts(), META, tmp_path / "m.dylib", prefix="kiln_")


def test_prefix_must_match_the_metadata(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not match the library metadata's prefix"):
        export_library(hm.artifacts(), META, tmp_path / "m.so", prefix="other_")


FAILING_LINKER = """#!/bin/sh
# Compiles like cc, but a link (-shared / -r) writes half a file and fails.
out=""; link=0; prev=""
for a in "$@"; do
  [ "$prev" = "-o" ] && out="$a"
  case "$a" in -shared|-r) link=1 ;; esac
  prev="$a"
done
if [ $link = 1 ]; then echo partial > "$out"; echo "ld: simulated failure" >&2; exit 1; fi
exec cc "$@"
"""


@pytest.mark.parametrize("suffix", [".so", ".a"])
def test_failed_export_leaves_no_partial_file(tmp_path: Path, suffix: str) -> None:
    cc = tmp_path / "bad-cc"
    cc.write_text(FAILING_LINKER)
    cc.chmod(cc.stat().st_mode | stat.S_IEXEC)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    target = out_dir / f"model{suffix}"
    with pytest.raises(CompileError, match=r"(?s)failed \(exit 1\): .*bad-cc.*simulated failure"):
        export_library(hm.artifacts(), META, target, prefix="kiln_", cc=str(cc))
    assert list(out_dir.iterdir()) == []

    target.write_bytes(b"previous export")  # an existing file survives a failed export
    with pytest.raises(CompileError):
        export_library(hm.artifacts(), META, target, prefix="kiln_", cc=str(cc))
    assert sorted(p.name for p in out_dir.iterdir()) == [target.name]
    assert target.read_bytes() == b"previous export"


def test_exporting_again_reuses_the_compiled_objects(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A .so then a .a of the same artifacts compile the C once; the reused objects make
    the same .a as a fresh compile, and other flags compile again."""
    from kiln.runtime import native, object_cache

    compiled: list[str] = []
    run_all = native._run_all

    def recording(jobs: list[tuple[list[str], str]]) -> None:
        compiled.extend(Path(cmd[-1]).name for cmd, _what in jobs if "-c" in cmd
                        and cmd[-1].endswith(".c"))
        run_all(jobs)

    monkeypatch.setattr(native, "_run_all", recording)
    object_cache.clear()
    so = export_library(hm.artifacts(), META, tmp_path / "m.so", prefix="kiln_")
    assert sorted(compiled) == ["host.c", "kernels.c", "kiln_check.c",
                                "kiln_hash64.c"]
    reused = export_library(hm.artifacts(), META, tmp_path / "reused.a", prefix="kiln_")
    assert sorted(compiled) == ["host.c", "kernels.c", "kiln_check.c",
                                "kiln_hash64.c"]  # nothing compiled again
    object_cache.clear()
    fresh = export_library(hm.artifacts(), META, tmp_path / "fresh" / "reused.a",
                           prefix="kiln_")
    assert reused.read_bytes() == fresh.read_bytes()
    compiled.clear()
    export_library(hm.artifacts(), META, tmp_path / "o1.so", prefix="kiln_", options=["-O1"])
    assert sorted(compiled) == ["host.c", "kernels.c", "kiln_check.c",
                                "kiln_hash64.c"]
    with load_module(so) as lib:
        x = np.arange(4, dtype=np.float32)
        np.testing.assert_array_equal(lib["main"](x), hm.reference("main", x))


def test_fcompile_replaces_the_link_step(tmp_path: Path) -> None:
    seen: list[tuple[Path, list[Path], list[str]]] = []

    def fcompile(out: Path, objects: list[Path], options: Any) -> None:
        seen.append((out, list(objects), list(options)))
        _run(["cc", "-shared", "-o", str(out), *map(str, objects)])

    so = export_library(hm.artifacts(), META, tmp_path / "m.so", prefix="kiln_",
                        fcompile=fcompile, options=["-DUNUSED_FLAG=1"])
    (out, objects, options), = seen
    assert out.parent == tmp_path and out != so  # linked into a temporary, then renamed
    # The weights are assembled into blob.o, right after the blob (docs/format.md).
    assert sorted(o.name for o in objects) == ["blob.o", "host.c.o", "kernels.c.o",
                                               "kiln_check.c.o", "kiln_hash64.c.o"]
    assert options == ["-DUNUSED_FLAG=1"]
    with load_module(so) as lib:
        np.testing.assert_array_equal(lib["main"](np.zeros(4, np.float32)), hm.WEIGHTS)


def test_failing_fcompile_leaves_no_file(tmp_path: Path) -> None:
    def fcompile(out: Path, objects: list[Path], options: Any) -> None:
        out.write_bytes(b"half")
        raise RuntimeError("custom linker exploded")

    with pytest.raises(RuntimeError, match="exploded"):
        export_library(hm.artifacts(), META, tmp_path / "m.so", prefix="kiln_",
                       fcompile=fcompile)
    assert list(tmp_path.iterdir()) == []


def test_missing_abi_symbol_fails_at_export_not_at_load(tmp_path: Path) -> None:
    meta = {**META, "functions": {**META["functions"], "ghost": {
        "name": "ghost", "symbol": "kiln_ghost", "kind": "tensor", "params": [],
        "results": [], "tuple_result": False}}}
    with pytest.raises(CompileError, match="kiln_ghost"):
        export_library(hm.artifacts(), meta, tmp_path / "m.so", prefix="kiln_")
    assert list(tmp_path.iterdir()) == []


def test_unsupported_native_suffix_is_a_compile_error(tmp_path: Path) -> None:
    arts = hm.artifacts(extra=[Artifact("x", "native", "kernels.ptx", b"...")])
    with pytest.raises(CompileError, match=r"x/kernels.ptx: cannot link a native artifact with "
                                           r"suffix '\.ptx'; native artifacts are \.o, \.c, \.bin"):
        export_library(arts, META, tmp_path / "m.so", prefix="kiln_")


# ------------------------------------------------------------------ C programs
DLOPEN_PROGRAM = r"""
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <kiln/kiln.h>

int main(int argc, char **argv) {
  if (argc != 2) return 2;
  void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) { fprintf(stderr, "%s\n", dlerror()); return 3; }
  KilnPackedFunc f_main, f_scale;
  KilnStringFunc last_error, metadata;
  *(void **)&f_main = dlsym(lib, "kiln_main");
  *(void **)&f_scale = dlsym(lib, "kiln_scale_add");
  *(void **)&last_error = dlsym(lib, "kiln__last_error");
  *(void **)&metadata = dlsym(lib, "kiln__metadata");
  if (!f_main || !f_scale || !last_error || !metadata) return 4;
  if (!strstr(metadata(), "\"format\":\"kiln.library\"")) return 5;

  float x[4] = {1, 2, 3, 4}, y[4] = {0};
  int64_t shape[1] = {4};
  DLTensor tx = kiln_tensor(x, 1, shape, KILN_FLOAT32);
  DLTensor ty = kiln_tensor(y, 1, shape, KILN_FLOAT32);
  DLTensor *ts[2] = {&tx, &ty};
  if (kiln_call_tensors(f_main, ts, 2) != 0) { fprintf(stderr, "%s\n", last_error()); return 6; }
  printf("main %g %g %g %g\n", y[0], y[1], y[2], y[3]);

  float X[6] = {1, 2, 3, 4, 5, 6}, Y[6];
  int64_t shape2[2] = {2, 3};
  DLTensor tX = kiln_tensor(X, 2, shape2, KILN_FLOAT32);
  DLTensor tY = kiln_tensor(Y, 2, shape2, KILN_FLOAT32);
  KilnValue args[4];
  int32_t codes[4];
  kiln_set_tensor(args, codes, 0, &tX);
  kiln_set_tensor(args, codes, 1, &tY);
  kiln_set_float(args, codes, 2, 0.5);
  kiln_set_int(args, codes, 3, 10);
  if (f_scale(args, codes, 4) != 0) { fprintf(stderr, "%s\n", last_error()); return 7; }
  printf("scale_add %g %g\n", Y[0], Y[5]);

  /* A bad call reports an error instead of crashing. */
  ty.dtype = KILN_INT32;
  if (kiln_call_tensors(f_main, ts, 2) == 0) return 8;
  printf("error %s\n", last_error());
  dlclose(lib);
  return 0;
}
"""


def _compile_c(tmp_path: Path, source: str, *extra: str) -> Path:
    src = tmp_path / "prog.c"
    src.write_text(source)
    exe = tmp_path / "prog"
    _run(["cc", "-std=c99", "-Wall", "-Wextra", "-Werror", f"-I{include_dir()}",
          "-o", str(exe), str(src), *extra])
    return exe


def test_c_program_dlopens_the_library_and_calls_it(exported: dict[str, Path],
                                                    tmp_path: Path) -> None:
    exe = _compile_c(tmp_path, DLOPEN_PROGRAM, "-ldl")
    out = _run([str(exe), str(exported[".so"])]).stdout.splitlines()
    y = hm.reference("main", np.array([1, 2, 3, 4], np.float32))
    assert out[0] == "main " + " ".join(f"{v:g}" for v in y)
    assert out[1] == "scale_add 10.5 13"
    assert out[2] == "error main: argument 1 'y': expected dtype float32, got int32"


def test_abi_doc_example_compiles_and_runs(exported: dict[str, Path], tmp_path: Path) -> None:
    doc = (Path(__file__).parents[2] / "docs" / "abi.md").read_text()
    (example,) = [block for block in re.findall(r"```c\n(.*?)```", doc, re.S)
                  if "dlopen" in block]
    exe = _compile_c(tmp_path, example, "-ldl")
    (tmp_path / "model.so").symlink_to(exported[".so"])
    proc = subprocess.run([str(exe)], cwd=tmp_path, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


TWO_LIBRARIES = r"""
#include <stdio.h>
#include "alpha.h"
#include "beta.h"

int main(void) {
  float x[4] = {1, 2, 3, 4}, ya[4], yb[4];
  int64_t shape[1] = {4};
  DLTensor tx = kiln_tensor(x, 1, shape, KILN_FLOAT32);
  DLTensor ta = kiln_tensor(ya, 1, shape, KILN_FLOAT32);
  DLTensor tb = kiln_tensor(yb, 1, shape, KILN_FLOAT32);
  DLTensor *a[2] = {&tx, &ta}, *b[2] = {&tx, &tb};
  if (kiln_call_tensors(alpha_main, a, 2) != 0) { puts(alpha__last_error()); return 1; }
  if (kiln_call_tensors(beta_add_one, b, 2) != 0) { puts(beta__last_error()); return 1; }
  printf("%g %g %g %g | %g %g %g %g\n", ya[0], ya[1], ya[2], ya[3], yb[0], yb[1], yb[2], yb[3]);
  return alpha__metadata()[0] == '{' && beta__metadata()[0] == '{' ? 0 : 2;
}
"""


def test_two_static_libraries_with_different_prefixes_link_into_one_program(
        tmp_path: Path) -> None:
    libs = []
    for prefix, name in (("alpha_", "alpha"), ("beta_", "beta")):
        libs.append(export_library(hm.artifacts(prefix), hm.library_metadata(prefix),
                                   tmp_path / f"{name}.a", prefix=prefix))
        assert (tmp_path / f"{name}.h").is_file()
    members = _run(["ar", "t", str(libs[0])]).stdout.split()
    assert members == ["alpha.o"]
    # both define helper_shared_name(); it must have become local
    assert " T helper_shared_name" not in _run(["nm", str(libs[0])]).stdout
    exe = _compile_c(tmp_path, TWO_LIBRARIES, *map(str, libs), "-lm")
    out = _run([str(exe)]).stdout.strip()
    x = np.array([1, 2, 3, 4], np.float32)
    ya = hm.reference("main", x)
    yb = hm.reference("add_one", x)
    assert out == " ".join(f"{v:g}" for v in ya) + " | " + " ".join(f"{v:g}" for v in yb)


def test_static_header_declares_every_entry(exported: dict[str, Path]) -> None:
    header = exported[".a"].with_suffix(".h").read_text()
    for name in ("add_one", "scale_add", "main", "split"):
        assert f"int32_t kiln_{name}(const KilnValue *args" in header
    assert "/* split(x: int64[3]) -> (a: int64[3], b: float64[3])" in header
    assert "const char *kiln__last_error(void);" in header


def test_without_native_code_the_library_only_carries_the_blob(tmp_path: Path) -> None:
    import json

    from kiln.artifact import ArtifactSet
    from kiln.errors import ExportError
    from kiln.runtime import LOADERS, FunctionTableModule, LibraryModule, register_loader

    seen: list[Any] = []
    register_loader("carried", lambda arts, ctx: seen.append((arts, ctx)) or
                    FunctionTableModule("carried", {}, metadata=ctx.metadata))
    try:
        arts = ArtifactSet([Artifact("gen", "carried", "prog.json", b'{"ops": []}')])
        meta = {"prefix": "kiln_", "functions": {}}
        so = export_library(arts, meta, tmp_path / "m.so", prefix="kiln_")
        nm = _run(["nm", "-D", "--defined-only", str(so)]).stdout.split()
        assert nm[-2:] == ["R", "kiln__blob"] and len(nm) == 3
        with load_module(so) as lib:
            assert isinstance(lib, LibraryModule) and not lib.has_native
            assert lib.metadata == meta and lib.function_names() == []
            (loaded, ctx), = seen
            assert json.loads(loaded[0].content) == {"ops": []} and ctx.host is lib
            assert [m.kind for m in lib.imports] == ["carried"]
    finally:
        LOADERS.unregister("carried")
    with pytest.raises(ExportError, match=r"no native code to link into a static library "
                                          r"\(artifact loaders: carried\)"):
        export_library(arts, meta, tmp_path / "m.a", prefix="kiln_")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.so"]
