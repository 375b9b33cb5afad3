"""Calls that used to write read-only memory, crash or race: each is refused or made safe.

Anything that could crash runs in a fresh interpreter, and the test asserts it
exited normally (no signal).
"""

from __future__ import annotations

import mmap
import subprocess
import sys
import textwrap
import threading
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import kiln
from kiln.errors import CallError, KilnError
from kiln.ir import IRBuilder, IRModule
from kiln.runtime import Module, PackedFunction, load_module
from support import handmade_lib as hm

F32 = np.float32


def _run(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run `script` in a fresh interpreter; fail on a signal (a crash), return the process."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(script), *args],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode >= 0, f"killed by signal {-proc.returncode}: {proc.stderr[-2000:]}"
    return proc


def _add_one_module() -> IRModule:
    ib = IRBuilder()
    with ib.prim_func("add_one"):
        x = ib.arg("X", (64,), "float32")
        y = ib.arg("Y", (64,), "float32")
        with ib.for_range(64, name="i") as i:
            ib.store(y, [i], x[i] + 1.0)
    return ib.get()


# ------------------------------------------------------------------ read-only memory
def test_read_only_mmap_output_is_refused_and_left_alone(hand_lib: Module,
                                                         tmp_path: Path) -> None:
    path = tmp_path / "y.bin"
    path.write_bytes(np.full(4, 7, F32).tobytes())
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        y = np.frombuffer(m, F32)
        with pytest.raises(CallError, match="argument 1 'Y': the array is read-only"):
            hand_lib["add_one"](np.ones(4, F32), y)
        del y
    assert path.read_bytes() == np.full(4, 7, F32).tobytes()


def test_read_only_inputs_are_fine(hand_lib: Module) -> None:
    x = np.frombuffer(np.arange(4, dtype=F32).tobytes(), F32)
    y = np.zeros(4, F32)
    hand_lib["add_one"](x, y)
    np.testing.assert_array_equal(y, x + 1)
    np.testing.assert_array_equal(hand_lib["main"](x), hm.reference("main", x))


@pytest.mark.parametrize("target", ["c", "llvm", "python"])
def test_every_backend_marks_written_parameters(target: str) -> None:
    """Compiled metadata says which parameters are written, so every backend refuses."""
    ex = kiln.compile(_add_one_module(), target)
    params = ex.metadata["functions"]["add_one"]["params"]
    assert [p.get("written", False) for p in params] == [False, True]
    y = np.frombuffer(bytes(256), F32)
    with pytest.raises(CallError, match="add_one: argument 1 'Y': the array is read-only"):
        ex["add_one"](np.ones(64, F32), y)
    assert not y.any()
    with pytest.raises(CallError, match="add_one: argument 0 'X': numpy dtype '>f4' has "
                                        "non-native byte order"):
        ex["add_one"](np.ones(64, ">f4"), np.zeros(64, F32))
    x = np.arange(64, dtype=F32)
    with pytest.raises(CallError, match="argument 1 'Y': overlaps argument 0 'X'"):
        ex["add_one"](x, x)
    np.testing.assert_array_equal(x, np.arange(64, dtype=F32))


# ------------------------------------------------------------------ shapes before allocation
class _NeverRuns(PackedFunction):
    def _invoke(self, values: list[Any], wheres: Any) -> None:
        raise AssertionError("a call with a wrong input shape must not reach the code")


def test_wrong_input_shape_is_refused_before_outputs_are_allocated() -> None:
    big = {"name": "big", "kind": "graph",
           "params": [{"name": "x", "kind": "tensor", "shape": [4], "dtype": "float32"}],
           "results": [{"name": "y", "kind": "tensor", "shape": [1 << 28], "dtype": "float32"}]}
    fn = _NeverRuns(big)
    tracemalloc.start()
    try:
        with pytest.raises(CallError,
                           match=r"big: argument 0 'x': expected shape \[4\], got \[5\]"):
            fn(np.zeros(5, F32))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, f"{peak} bytes allocated for a call that was refused"


def test_out_arrays_may_not_overlap_each_other(hand_lib: Module) -> None:
    buf = np.zeros(3, np.int64)
    with pytest.raises(CallError, match="split: argument 2 'b': the out= array overlaps out= "
                                        "array 0 in memory"):
        hand_lib["split"](np.arange(3), out=(buf, buf.view(np.float64)))


# ------------------------------------------------------------------ lifetime
def test_calls_after_close_raise_call_error(hand_lib: Module) -> None:
    lib = load_module(hand_lib.path)
    add_one = lib["add_one"]
    lib.close()
    with pytest.raises(CallError, match=r"add_one: the library '.*' is closed"):
        add_one(np.ones(4, F32), np.zeros(4, F32))


CLOSE_DURING_CALLS = """
    import sys, threading
    import numpy as np
    from kiln.errors import CallError
    from kiln.runtime import load_module

    lib = load_module(sys.argv[1])
    fns = [lib["add_one"], lib["main"]]
    counts, errors = [], []
    start = threading.Barrier(5)

    def worker(k):
        x, y, n = np.ones(4, np.float32), np.zeros(4, np.float32), 0
        start.wait()
        try:
            while True:
                fns[0](x, y) if k % 2 else fns[1](x)
                n += 1
        except CallError as exc:
            errors.append(str(exc))
        counts.append(n)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    start.wait()
    threading.Event().wait(0.05)
    lib.close()
    for t in threads:
        t.join()
    assert len(errors) == 4 and all("is closed" in e for e in errors), errors
    print("calls", sum(counts))
"""


# What a free-threaded interpreter reports: the call guard takes its lock at every step.
WITHOUT_GIL = "import sys\nsys._is_gil_enabled = lambda: False\n"


@pytest.mark.parametrize("gil", [True, False], ids=["gil", "guard-locked"])
def test_close_while_other_threads_call_is_safe(hand_lib: Module, gil: bool) -> None:
    script = textwrap.dedent(CLOSE_DURING_CALLS)
    proc = _run(script if gil else WITHOUT_GIL + script, str(hand_lib.path))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("calls ") and int(proc.stdout.split()[1]) > 0


LLVMJIT_CLOSE = """
    import threading
    import numpy as np
    import kiln
    from kiln.errors import CallError
    from kiln.ir import IRBuilder

    ib = IRBuilder()
    with ib.prim_func("add_one"):
        x = ib.arg("X", (64,), "float32")
        y = ib.arg("Y", (64,), "float32")
        with ib.for_range(64, name="i") as i:
            ib.store(y, [i], x[i] + 1.0)
    module = kiln.compile(ib.get(), "llvmjit").jit()
    fn = module["add_one"]
    x, y = np.ones(64, np.float32), np.zeros(64, np.float32)
    fn(x, y)
    assert (y == 2).all()
    stop = []

    def worker():
        try:
            while True:
                fn(x, np.zeros(64, np.float32))
        except CallError as exc:
            stop.append(str(exc))

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    threading.Event().wait(0.05)
    module.close()
    for t in threads:
        t.join()
    assert len(stop) == 3 and all("closed" in s for s in stop), stop
    try:
        fn(x, y)
    except CallError as exc:
        print(exc)
"""


def test_llvmjit_functions_stop_after_close() -> None:
    proc = _run(LLVMJIT_CLOSE)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "add_one: the llvmjit module is closed; load it again to call it"


def test_first_calls_from_eight_threads_link_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from kiln.runtime import loading

    ex = kiln.compile(_add_one_module(), "c")
    real = loading.load_artifacts
    loads: list[int] = []

    def counting(*args: Any, **kwargs: Any) -> Module:
        loads.append(1)
        threading.Event().wait(0.05)  # widen the window a second loader would slip into
        return real(*args, **kwargs)

    monkeypatch.setattr(loading, "load_artifacts", counting)
    x = np.arange(64, dtype=F32)
    outs = [np.zeros(64, F32) for _ in range(8)]
    failures: list[BaseException] = []
    start = threading.Barrier(8)

    def first_call(k: int) -> None:
        start.wait()
        try:
            ex["add_one"](x, outs[k])
        except BaseException as exc:  # reported below, in the test's thread
            failures.append(exc)

    threads = [threading.Thread(target=first_call, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures
    assert len(loads) == 1
    for y in outs:
        np.testing.assert_array_equal(y, x + 1)


# ------------------------------------------------------------------ one hierarchy
def test_every_kiln_error_is_a_kiln_error() -> None:
    from kiln import errors

    kinds = [errors.CallError, errors.CompileError, errors.ExportError, errors.FormatError,
             errors.FrontendError, errors.IRError, errors.TargetError,
             errors.MissingDependencyError]
    assert all(issubclass(k, KilnError) for k in kinds)
    # The builtin bases they had before stay, so `except ValueError` keeps working.
    assert issubclass(errors.FormatError, ValueError)
    assert issubclass(errors.CallError, RuntimeError)
    assert kiln.CallError is CallError and kiln.KilnError is KilnError


@pytest.mark.parametrize("kind", ["FrontendError", "FormatError", "CallError"])
def test_pass_context_lets_kiln_errors_through_unwrapped(kind: str) -> None:
    from kiln import errors
    from kiln.transform import PassContext
    from kiln.transform.pass_base import ModulePassFromCallable

    error = getattr(errors, kind)(f"a {kind} from inside a pass")

    def failing(mod: IRModule) -> IRModule:
        raise error

    with pytest.raises(getattr(errors, kind)) as info:
        PassContext().run_pass(ModulePassFromCallable(failing), _add_one_module())
    assert info.value is error


def test_pass_context_wraps_a_bug_in_a_pass() -> None:
    from kiln.errors import CompileError
    from kiln.transform import PassContext
    from kiln.transform.pass_base import ModulePassFromCallable

    def buggy(mod: IRModule) -> IRModule:
        return {}["missing"]  # type: ignore[no-any-return]

    with pytest.raises(CompileError, match="pass 'buggy' failed: KeyError: 'missing'"):
        PassContext().run_pass(ModulePassFromCallable(buggy), _add_one_module())


# ------------------------------------------------------------------ clear errors (issue 11)
def test_symbol_the_loader_cannot_find_is_a_format_error(hand_lib: Module,
                                                         tmp_path: Path) -> None:
    """.dynsym names a blob the GNU hash table does not know: dlsym fails."""
    data = Path(hand_lib.path).read_bytes()
    assert data.count(b"\0kiln__blob\0") >= 1
    damaged = tmp_path / "damaged.so"
    damaged.write_bytes(data.replace(b"\0kiln__blob\0", b"\0kilm__blob\0"))
    with pytest.raises(kiln.FormatError, match=r"damaged\.so: the ELF symbol table lists "
                                               r"kilm__blob, but the dynamic loader cannot "
                                               r"find it \(.*\); the file is damaged"):
        load_module(damaged)


def test_non_ascii_prefix_is_refused_before_codegen() -> None:
    with pytest.raises(kiln.CompileError, match="system_lib_prefix 'kïln_' must be a non-empty "
                                                r"C identifier \(ASCII"):
        kiln.compile(_add_one_module(), "c", system_lib_prefix="kïln_")


@pytest.mark.parametrize("suffix", [".so", ".tar"])
def test_exporting_onto_a_directory_is_an_export_error(tmp_path: Path, suffix: str) -> None:
    ex = kiln.compile(_add_one_module(), "c")
    folder = tmp_path / f"lib{suffix}"
    folder.mkdir()
    with pytest.raises(kiln.ExportError, match=f"cannot export to '{folder}': it is a directory"):
        ex.export_library(folder)
    # The lower-level entry refuses it the same way.
    with pytest.raises(kiln.ExportError, match="it is a directory"):
        kiln.export.export_library(ex.artifacts, ex.metadata, folder, prefix=ex.prefix)
    assert list(folder.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == [
        folder.name]


def test_write_tar_onto_a_directory_is_an_export_error(tmp_path: Path) -> None:
    from kiln.artifact import archive

    with pytest.raises(kiln.ExportError, match="it is a directory"):
        archive.write_tar(tmp_path, hm.artifacts(), hm.library_metadata("kiln_"))


BLOCK_COMPILER = """
    import sys
    class _Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("llvmlite", "onnx", "onnxruntime"):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None
    sys.meta_path.insert(0, _Block())
"""


def test_compiler_entry_points_name_the_missing_package() -> None:
    script = BLOCK_COMPILER + """
    import kiln
    from kiln.ir import IRBuilder
    ib = IRBuilder()
    with ib.prim_func("f"):
        x = ib.arg("X", (4,), "float32")
        with ib.for_range(4, name="i") as i:
            ib.store(x, [i], x[i] + 1.0)
    for call in (lambda: kiln.frontend.from_onnx(sys.argv[1]),
                 lambda: kiln.compile(ib.get(), "llvm")):
        try:
            call()
        except kiln.MissingDependencyError as exc:
            assert isinstance(exc, ImportError) and isinstance(exc, kiln.KilnError)
            print(exc)
    """
    model = Path(__file__).resolve().parents[2] / "models" / "mlp.onnx"
    proc = _run(script, str(model))
    assert proc.returncode == 0, proc.stderr
    onnx_line, llvm_line = proc.stdout.splitlines()
    assert onnx_line.startswith("importing an ONNX model needs the 'onnx' package, which is "
                                "not installed here (pip install \"kiln-tensor[compiler]\", "
                                "or pip install onnx)")
    assert llvm_line.startswith("codegen 'llvm' needs the 'llvmlite' package")


def test_damaged_signature_in_library_metadata_is_a_format_error(hand_lib: Module,
                                                                  tmp_path: Path) -> None:
    data = Path(hand_lib.path).read_bytes()
    assert b'"name":"k","kind":"scalar","dtype":"int32"' in data
    damaged = tmp_path / "damaged.so"
    damaged.write_bytes(data.replace(b'"name":"k","kind":"scalar","dtype":"int32"',
                                     b'"name":"k","kind":"scalar","dtype":"int33"'))
    with pytest.raises(kiln.FormatError, match=r"damaged\.so: library metadata: function "
                                               r"'scale_add': k: unknown dtype 'int33'"):
        load_module(damaged)


def test_loading_a_directory_is_a_format_error(tmp_path: Path) -> None:
    folder = tmp_path / "lib.so"
    folder.mkdir()
    with pytest.raises(kiln.FormatError, match=r"lib\.so: is a directory, not a library file"):
        load_module(folder)


def test_a_shape_that_is_not_a_dimension_text_is_a_format_error(hand_lib: Module,
                                                                 tmp_path: Path) -> None:
    """Symbolic dims in metadata are text (docs/abi.md): one outside that form is refused
    at load, never evaluated."""
    data = Path(hand_lib.path).read_bytes()
    assert b'"shape":[2,3]' in data
    damaged = tmp_path / "damaged.so"
    damaged.write_bytes(data.replace(b'"shape":[2,3]', b'"shape":["~"]'))
    with pytest.raises(kiln.FormatError, match=r"damaged\.so: library metadata: function "
                                               r"'scale_add': X: shape \['~'\] is not a list "
                                               r"of sizes"):
        load_module(damaged)
