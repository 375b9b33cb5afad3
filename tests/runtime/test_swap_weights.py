"""Module.swap_weights: new weights into a loaded library, without the compiler.

One small ONNX model (a Gemm with a transposed B, a MatMul, a MatMul by a Transpose
of a weight that import folds, and a Reshape by a shape initializer, which the code
bakes in) is compiled once per codegen with its weights and once with new ones; the
library of the first, given the new weights, must answer bit for bit what the second
does (its transforms are exact: transposes, panel packing), embedded and external. A
small CNN covers folded batch norms and packed convolution filters; the call guard's
pause is checked on its own. The library's own C entry (`{prefix}_swap_weights`,
kiln_swap.c), which Module.swap_weights calls, is also run from a plain C program
(examples/c_deploy/swap_weights.c, built with `cc -Werror`) and given bad raw weights.
"""

from __future__ import annotations

import ctypes
import subprocess
import threading
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import kiln
from kiln.cli.inspect import cmd_inspect
from kiln.errors import ArgumentTypeError, CallError, FormatError, UsageError
from kiln.runtime import ctypes_abi, load_module, swap
from kiln.runtime.lifetime import CallGuard
from kiln.runtime.onnx_weights import read_onnx_weights
from kiln.runtime.swap import check_source
from support.c_programs import EXAMPLES, build_c_program
from support.graphs import GraphBuilder
from support.reference import onnxruntime_outputs
from support.toolchains import c_compiler

X = np.random.default_rng(60).standard_normal((4, 32)).astype(np.float32)


def model() -> onnx.ModelProto:
    b = GraphBuilder(seed=60)
    h = b.op("Relu", b.linear(b.input("x", [4, 32]), 32, 48))
    h = b.op("MatMul", h, b.weight(48, 24))
    h = b.op("MatMul", h, b.op("Transpose", b.weight(16, 24), perm=[1, 0]))
    y = b.op("Reshape", h, b.const(np.array([2, 32], np.int64), "shape"))
    b.output(y, [2, 32])
    return b.model()


def weights(m: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}


def with_weights(m: onnx.ModelProto, new: dict[str, np.ndarray]) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(m)
    for init in out.graph.initializer:
        init.CopyFrom(numpy_helper.from_array(new[init.name], init.name))
    return out


OLD = model()
NEW = {k: (v + np.random.default_rng(1).standard_normal(v.shape).astype(v.dtype)
           if v.dtype == np.float32 else v) for k, v in weights(OLD).items()}
NEW_MODEL = with_weights(OLD, NEW)
SHAPE = next(name for name in NEW if name.startswith("shape"))  # the Reshape's, baked


@pytest.fixture(scope="module", params=["llvm", "c"])
def built(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
          ) -> dict[str, Any]:
    """The old model's library (embedded and external) and the new model's answer, for
    codegen `request.param`."""
    tmp = tmp_path_factory.mktemp(f"swap_{request.param}")
    ex = kiln.compile(OLD, request.param)
    fresh = kiln.compile(NEW_MODEL, request.param).export_library(tmp / "new.so")
    with load_module(fresh) as lib:
        want = lib["main"](X)
    return {"embedded": ex.export_library(tmp / "emb.so"),
            "external": ex.export_library(tmp / "ext.so", weights="external"),
            "old": ex.jit()["main"](X), "new": want}


def test_the_new_weights_compute_what_a_fresh_compile_does(built):
    np.testing.assert_allclose(built["new"], onnxruntime_outputs(NEW_MODEL, {"x": X})[0],
                               rtol=1e-4, atol=1e-4)
    for mode in ("embedded", "external"):
        with load_module(built[mode]) as lib:
            assert lib["main"](X).tobytes() == built["old"].tobytes()
            lib.swap_weights(NEW)
            assert lib["main"](X).tobytes() == built["new"].tobytes(), mode
            lib.swap_weights(OLD)  # back, from the ModelProto
            assert lib["main"](X).tobytes() == built["old"].tobytes(), mode
        with load_module(built[mode]) as again:  # the file is not changed
            assert again["main"](X).tobytes() == built["old"].tobytes()


def test_inspect_lists_the_transforms_the_library_replays(built):
    for mode in ("embedded", "external"):
        report = cmd_inspect(str(built[mode]), None, None)
        assert ("transforms replayable: pad, reshape, transpose (Module.swap_weights "
                "rebuilds every constant)") in report
        assert "swap from C: kiln__swap_weights (the library runs its swap program)" in report


def test_weights_from_onnx_and_npz_files(built, tmp_path):
    onnx.save(NEW_MODEL, tmp_path / "new.onnx")
    np.savez(tmp_path / "new.npz", **NEW)
    with load_module(built["embedded"]) as lib:
        lib.swap_weights(tmp_path / "new.onnx")
        assert lib["main"](X).tobytes() == built["new"].tobytes()
        lib.swap_weights(OLD)
        lib.swap_weights(str(tmp_path / "new.npz"))
        assert lib["main"](X).tobytes() == built["new"].tobytes()


def test_the_onnx_reader_reads_what_onnx_writes(tmp_path):
    b = GraphBuilder(seed=3)
    arrays = {"f16": np.arange(6, dtype=np.float16).reshape(2, 3),
              "i8": np.array([-3, 4], np.int8), "i64": np.array([-1, 7], np.int64),
              "f64": np.array([0.5, -2.0]), "big": np.ones((3, 5), np.float32)}
    for name, value in arrays.items():
        b.const(value, name=name)
    typed = onnx.ModelProto()  # typed fields (float_data, int32_data...), not raw_data
    typed.CopyFrom(b.model([], [], check=False))
    for init in typed.graph.initializer:
        init.CopyFrom(numpy_helper.from_array(arrays[init.name], init.name))
        value = numpy_helper.to_array(init)
        init.ClearField("raw_data")
        field = {np.float32: "float_data", np.float64: "double_data",
                 np.int64: "int64_data"}.get(value.dtype.type, "int32_data")
        data = value.view(np.uint16) if value.dtype == np.float16 else value
        getattr(init, field).extend(data.reshape(-1).tolist())
    for m in (b.model([], [], check=False), typed):
        got = read_onnx_weights(m.SerializeToString(), "test")
        assert set(got) == set(arrays)
        for name, value in arrays.items():
            assert got[name].dtype == value.dtype and np.array_equal(got[name], value), name


@pytest.mark.parametrize("change, message", [
    (lambda w: w.pop(next(iter(w))), r"'w_1' is missing"),
    (lambda w: w.update(w_1=np.zeros((32, 48), np.float32)), r"'w_1' is float32\[32, 48\]"),
    (lambda w: w.update(w_1=np.zeros((48, 32), np.float64)), r"'w_1' is float64\[48, 32\]"),
    (lambda w: w.update(extra=np.zeros(3, np.float32)), r"'extra'.*not weights of this model"),
    (lambda w: w.update({SHAPE: np.array([4, 16], np.int64)}), r"'shape\w*' differs.*compile"),
])
def test_weights_that_do_not_fit_are_refused_and_nothing_changes(built, change, message):
    new = dict(NEW)
    change(new)
    with load_module(built["embedded"]) as lib:
        with pytest.raises(UsageError, match=message):
            lib.swap_weights(new)
        assert lib["main"](X).tobytes() == built["old"].tobytes()


def test_sources_of_other_kinds_are_refused(built, tmp_path):
    with load_module(built["embedded"]) as lib:
        with pytest.raises(ArgumentTypeError, match="source must be"):
            lib.swap_weights(42)
        with pytest.raises(UsageError, match="is not a file"):
            lib.swap_weights(tmp_path / "missing.onnx")
        (tmp_path / "bad.npz").write_bytes(b"not a zip")
        with pytest.raises(FormatError, match=r"not a readable \.npz"):
            lib.swap_weights(tmp_path / "bad.npz")
        with pytest.raises(FormatError):
            lib.swap_weights(b"\xff\xff\xff")  # not an ONNX model


def test_a_constant_without_a_replay_is_named_and_refused(tmp_path):
    b = GraphBuilder(seed=4)
    w = b.op("Exp", b.weight(8, 8))  # folded at import, by a function with no replay
    b.output(b.op("MatMul", b.input("x", [2, 8]), w), [2, 8])
    m = b.model()
    path = kiln.compile(m, "llvm").export_library(tmp_path / "mul.so")
    with load_module(path) as lib, pytest.raises(UsageError, match=r"folded exp"):
        lib.swap_weights(weights(m))
    with load_module(path) as lib:  # and the C entry says it cannot (kiln.h)
        assert swap.native_entry(lib) is None
        entry = lib.cdll["kiln__swap_weights"]
        entry.restype = ctypes.c_int32
        assert entry(None, 0) == 2 and "no swap program" in lib.last_error()
    assert "transforms replayable: none (1 constant(s) made by transforms without a replay" \
        in cmd_inspect(str(path), None, None)


def test_calls_in_flight_see_the_old_or_the_new_weights(built):
    answers = {built["old"].tobytes(), built["new"].tobytes()}
    seen: list[bytes] = []
    stop = threading.Event()
    with load_module(built["external"]) as lib:
        fn = lib["main"]

        def call() -> None:
            while not stop.is_set():
                seen.append(fn(X).tobytes())

        threads = [threading.Thread(target=call) for _ in range(3)]
        for t in threads:
            t.start()
        try:
            for k in range(10):
                lib.swap_weights(NEW if k % 2 == 0 else OLD)
        finally:
            stop.set()
            for t in threads:
                t.join()
    assert seen and set(seen) <= answers


def test_a_library_without_named_weights_says_so(tmp_path):
    ib = kiln.ir.IRBuilder()
    with ib.function("main"):
        x = ib.param("x", (2, 3), "float32")
        ib.ret(ib.emit(kiln.ops.call("matmul", x, kiln.ir.graph.Constant(
            np.ones((3, 3), np.float32), "w")), "y"))
    path: Path = kiln.compile(ib.get(), "llvm").export_library(tmp_path / "ir.so")
    with load_module(path) as lib, pytest.raises(UsageError, match="records no replay"):
        lib.swap_weights({"w": np.zeros((3, 3), np.float32)})


def cnn() -> onnx.ModelProto:
    """Convolutions with batch norms (folded into them), a depthwise one (NCHWc packed)
    and 3x3 ones on 32 channels (Winograd where the target takes it)."""
    b = GraphBuilder(seed=61)
    h = b.op("Relu", b.bn(b.conv(b.input("img", [1, 8, 16, 16]), 8, 32, 3), 32))
    h = b.op("Relu", b.bn(b.conv(h, 32, 32, 3, group=32), 32))
    h = b.op("Relu", b.bn(b.conv(h, 32, 32, 3), 32))
    b.output(b.conv(h, 32, 16, 1), [1, 16, 16, 16])
    return b.model()


@pytest.fixture(scope="module")
def conv_net(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The conv net's library of its old weights, new weights, an input and what a fresh
    compile of the new weights answers."""
    tmp = tmp_path_factory.mktemp("swap_cnn")
    old = cnn()
    rng = np.random.default_rng(2)
    new = {k: np.abs(v * (1 + 0.2 * rng.standard_normal(v.shape))).astype(v.dtype)
           if v.dtype == np.float32 else v for k, v in weights(old).items()}
    img = rng.standard_normal((1, 8, 16, 16)).astype(np.float32)
    with load_module(kiln.compile(with_weights(old, new), "llvm").export_library(
            tmp / "new.so")) as fresh:
        want = fresh["main"](img)
    return {"lib": kiln.compile(old, "llvm").export_library(tmp / "old.so"), "old": old,
            "new": new, "img": img, "want": want}


def test_folded_batch_norms_and_packed_filters_replay(conv_net, c_program, monkeypatch,
                                                      tmp_path):
    want, img, new = conv_net["want"], conv_net["img"], conv_net["new"]
    with load_module(conv_net["lib"]) as lib:
        record = lib.artifacts[[a.file_name for a in lib.artifacts].index("constants.bin")]
        assert "apply" in str(record.metadata["replay"])  # the folded batch norms
        lib.swap_weights(new)  # the library's C: its Winograd `dot` sums in its own order
        got = lib["main"](img)
        assert np.linalg.norm(got - want) <= 1e-6 * np.linalg.norm(want)
        # and from plain C (here: the conv net compiles once per xdist worker)
        in_c = _run(c_program, conv_net["lib"], new, img, want.shape, tmp_path)
        assert in_c.tobytes() == got.tobytes()
        lib.swap_weights(weights(conv_net["old"]))
        monkeypatch.setattr(swap, "native_entry", lambda _lib: None)  # numpy's replay
        lib.swap_weights(new)
        assert lib["main"](img).tobytes() == want.tobytes()


def test_a_paused_guard_holds_new_calls_until_resume_and_close_still_closes():
    guard = CallGuard("the test library")
    guard.enter("f")  # a call in flight
    paused = threading.Thread(target=guard.pause)
    paused.start()
    paused.join(0.2)
    assert paused.is_alive()  # pause waits for the call in flight
    guard.exit()
    paused.join()
    started = threading.Event()

    def call() -> None:
        guard.enter("g")
        started.set()
        guard.exit()

    waiting = threading.Thread(target=call)
    waiting.start()
    assert not started.wait(0.2)  # held while paused
    guard.resume()
    assert started.wait(5)
    waiting.join()
    guard.pause()
    guard.close()  # a close during a pause ends closed
    guard.resume()
    with pytest.raises(CallError, match="closed"):
        guard.enter("h")


def test_a_large_unused_weight_cannot_be_checked_so_it_must_be_left_out():
    record = {"weights": {"w": {"dtype": "float32", "shape": [2]},
                          "big": {"dtype": "float32", "shape": [3], "fixed": True,
                                  "sha256": None}}}
    w = np.zeros(2, np.float32)
    assert check_source(record, {"w": w}) == []
    (problem,) = check_source(record, {"w": w, "big": np.zeros(3, np.float32)})
    assert "'big' is not rebuilt by the library" in problem and "leave it out" in problem


# ------------------------------------------- the library's C entry (kiln_swap.c)
EARGUMENT = -1  # kiln.h's KILN_SWAP_EARGUMENT


@pytest.fixture(scope="module")
def c_program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/c_deploy/swap_weights.c, built with `cc -Werror` (skips without a cc)."""
    c_compiler()
    return build_c_program(EXAMPLES / "swap_weights.c",
                           tmp_path_factory.mktemp("swap_c") / "swap_weights")


def _run(program: Path, lib: Path, named: dict[str, np.ndarray], x: np.ndarray,
         out_shape: tuple[int, ...], tmp: Path) -> np.ndarray:
    with load_module(lib) as module:
        entry = swap.native_entry(module)
        assert entry is not None  # the library carries its swap program
        order = entry[1]
    with open(tmp / "w.bin", "wb") as f:
        for name in order:
            f.write(np.ascontiguousarray(named[name]).tobytes())
    x.tofile(tmp / "x.bin")
    shape = ",".join(map(str, x.shape))
    subprocess.run([str(program), str(lib), "kiln_", str(tmp / "w.bin"), str(tmp / "x.bin"),
                    shape, str(tmp / "y.bin"), ",".join(map(str, out_shape))],
                   check=True, timeout=60)
    return np.fromfile(tmp / "y.bin", np.float32).reshape(out_shape)


def test_a_c_program_swaps_the_weights_bit_for_bit(c_program, built, tmp_path):
    """examples/c_deploy/swap_weights.c: dlopen, `{prefix}_swap_weights`, `main`."""
    got = _run(c_program, built["embedded"], NEW, X, (2, 32), tmp_path)
    assert got.tobytes() == built["new"].tobytes()


def _tensors(arrays: list[np.ndarray]) -> tuple[Any, list[Any]]:
    args = [ctypes_abi.TensorArg(a, ctypes_abi.Where("test", i, "w"))
            for i, a in enumerate(arrays)]
    return (ctypes_abi.DLTensor * max(len(args), 1))(*(a.tensor for a in args)), args


def test_bad_raw_weights_get_the_codes_and_leave_the_old_weights(built):
    with load_module(built["embedded"]) as lib:
        before = lib["main"](X)
        entry = swap.native_entry(lib)
        assert entry is not None
        fn, names = entry
        good = [np.ascontiguousarray(NEW[n]) for n in names]
        cases = {
            f"expected {len(good)} raw weights, got {len(good) - 1}": good[:-1],
            "expected dtype float32": [good[0].astype(np.float64), *good[1:]],
            "dimension 0 is": [good[0][:-1], *good[1:]],
            "expected 2 dimensions": [good[0].reshape(-1), *good[1:]],
        }
        for message, arrays in cases.items():
            raw, _keep = _tensors(arrays)
            assert fn(raw, len(arrays)) == EARGUMENT, message
            assert message in lib.last_error()
        raw, _keep = _tensors(good)
        raw[1].data = None
        assert fn(raw, len(good)) == EARGUMENT and "data is NULL" in lib.last_error()
        assert lib["main"](X).tobytes() == before.tobytes()  # nothing installed
        raw, _keep = _tensors(good)
        assert fn(raw, len(good)) == 0
        assert lib["main"](X).tobytes() != before.tobytes()


def test_gathered_sliced_and_scalar_weights_swap_in_c(tmp_path, monkeypatch):
    """The program's take (a folded Gather, its indices a weight too), slice and a 0-d
    weight, against numpy's replay (a fresh compile's bits, above); an index out of range
    is KILN_SWAP_EVALUE and leaves the old weights."""
    b = GraphBuilder(seed=7)
    rows = b.op("Gather", b.weight(10, 16, hint="table"),
                b.const(np.array([3, 1, 4, 1], np.int64), "idx"), axis=0)
    ends = [b.const(np.array(v, np.int64), n) for n, v in
            (("st", [0, 2]), ("en", [16, 24]), ("ax", [0, 1]), ("sp", [1, 2]))]
    part = b.op("Slice", b.weight(16, 24, hint="w"), *ends)
    h = b.op("Mul", b.op("Add", b.input("x", [4, 16]), rows),
             b.const(np.array(0.5, np.float32), "scale"))
    b.output(b.op("MatMul", h, part), [4, 11])
    m = b.model()
    rng = np.random.default_rng(3)
    new = {k: v + rng.standard_normal(v.shape).astype(v.dtype) if v.dtype == np.float32
           else v for k, v in weights(m).items()}
    x = rng.standard_normal((4, 16)).astype(np.float32)
    with load_module(kiln.compile(m, "llvm").export_library(tmp_path / "old.so")) as lib:
        assert swap.native_entry(lib) is not None
        before = lib["main"](x)
        idx = next(k for k in new if k.startswith("idx"))
        with pytest.raises(UsageError, match=r"out of range \(status 4\)"):
            lib.swap_weights({**new, idx: np.array([3, 1, 40, 1], np.int64)})
        assert lib["main"](x).tobytes() == before.tobytes()
        lib.swap_weights(new)
        got = lib["main"](x)
        table, w, scale = (new[next(k for k in new if k.startswith(p))]
                           for p in ("table", "w_", "scale"))
        np.testing.assert_allclose(got, (x + table[[3, 1, 4, 1]]) * scale @ w[:, 2::2],
                                   rtol=1e-5, atol=1e-5)
        lib.swap_weights(weights(m))
        monkeypatch.setattr(swap, "native_entry", lambda _lib: None)
        lib.swap_weights(new)
        assert lib["main"](x).tobytes() == got.tobytes()


# ------------------------------------ the weights check after a swap (kiln_check.c)
@pytest.fixture(scope="module")
def check_program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/runtime/swap_check.c, built with `cc -Werror` (skips without a cc)."""
    c_compiler()
    return build_c_program(Path(__file__).with_name("swap_check.c"),
                           tmp_path_factory.mktemp("swap_check") / "swap_check")


def constants_delta(lib: Any) -> int:
    """Where the constants start, in bytes past the exported `{prefix}_blob` symbol."""
    symbol = str(swap.replay_record(lib)[0].metadata["symbol"])
    return swap.constants_address(lib, symbol) - ctypes.addressof(
        ctypes.c_uint8.in_dll(lib.cdll, f"{lib.prefix}_blob"))


@pytest.mark.parametrize("mode", ["embedded", "external"])
def test_a_c_host_checks_after_swapping(check_program, built, mode, tmp_path):
    """swap then `{prefix}_check_weights` -> intact; a byte flipped after -> its chunk."""
    with load_module(built[mode]) as lib:
        entry = swap.native_entry(lib)
        assert entry is not None
        delta = constants_delta(lib) + 5
    with open(tmp_path / "raw.bin", "wb") as f:
        for name in entry[1]:
            f.write(np.ascontiguousarray(NEW[name]).tobytes())
    extra = [f"{built[mode]}.weights"] if mode == "external" else []
    run = subprocess.run([str(check_program), str(built[mode]), "kiln_", str(tmp_path / "raw.bin"),
                          str(delta), *extra], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == ["before -1", "swap 0 ", "after -1", "damaged 0"]


def test_the_numpy_swap_keeps_the_check_true_and_damage_found(built, monkeypatch):
    """The Python loader's own install (no swap program) updates the library's table as
    the C swap does; a chunk damaged before a swap stays damaged after it."""
    monkeypatch.setattr(swap, "native_entry", lambda _lib: None)
    with load_module(built["embedded"], verify_weights=False) as lib:
        check = ctypes_abi.bind(lib.cdll, "kiln__check_weights", "check_weights")
        chunks = ctypes_abi.bind(lib.cdll, "kiln__weights_chunks", "weights_chunks")()
        assert check(0, chunks) == -1
        lib.swap_weights(NEW)
        assert check(0, chunks) == -1
        symbol = str(swap.replay_record(lib)[0].metadata["symbol"])
        address = swap.constants_address(lib, symbol)
        with swap._writable(address, 8):
            ctypes.c_uint8.from_address(address + 5).value ^= 0x40
        assert check(0, chunks) == 0
        lib.swap_weights(OLD)  # the damaged chunk keeps its old hash: still refused
        assert check(0, chunks) == 0
