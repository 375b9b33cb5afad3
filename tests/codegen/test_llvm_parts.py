"""The llvm codegen compiles a module in parts, on every core, through the kernel cache.

A graph function with more than MAX_INLINED_CALL_SITES kernel calls is cut into one
part per kernel plus the graph function's (kiln.codegen.llvm.split); the parts are
compiled by forked worker processes and joined into one kernels.o. Checked here:
every kernel's optimised IR is the whole module's; a part found in the kernel cache
gives the very bytes a fresh compile gives, also when its kernel is found by the key
taken before lowering (kiln.codegen.llvm.kernel_keys) and not lowered; another model
that numbers the same kernels otherwise finds them (kiln.codegen.llvm.part_names), and
its library, joined from them, computes what onnxruntime computes; a changed machine
(opt-level, features) or codegen misses the cache; a damaged cache file or index entry
is refused and rebuilt, never used.
"""

from __future__ import annotations

import ctypes
import re
from pathlib import Path

import numpy as np
import onnx
import pytest

import kiln
from kiln.codegen import kernel_cache
from kiln.codegen.constants import ConstantPool
from kiln.codegen.llvm import codegen as llvm_codegen
from kiln.codegen.llvm import parts, split
from kiln.codegen.llvm.target_machine import llvm_binding, optimize, parse_and_verify
from kiln.codegen.naming import DEFAULT_PREFIX
from kiln.driver.compiler import lower_for_codegen
from kiln.frontend import from_onnx
from kiln.runtime import native
from support.graphs import GraphBuilder
from support.reference import onnxruntime_outputs

pytest.importorskip("onnxruntime")
if not llvm_codegen.compiles_in_parts(llvm_codegen.machine_config(kiln.Target.from_host())):
    pytest.skip("no `ld` here: the module is compiled whole", allow_module_level=True)

LAYERS = 34  # more calls than MAX_INLINED_CALL_SITES: the graph function inlines none
BATCH = 2


def model(seed: int = 0, width: int = 16) -> onnx.ModelProto:
    """MatMul+Relu layers alternating widths 16 and 24 (two kernels, the first numbered
    after the input's `width`), then Softmax."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    h, first = "x", width
    for i in range(LAYERS):
        out = 24 if width == 16 else 16
        w = b.const((rng.standard_normal((width, out)) / 4).astype(np.float32), f"w{i}")
        b.node("MatMul", [h, w], [f"m{i}"])
        b.node("Relu", [f"m{i}"], [f"r{i}"])
        h, width = f"r{i}", out
    b.node("Softmax", [h], ["y"], axis=-1)
    b.input("x", [BATCH, first])
    b.output("y", [BATCH, width])
    return b.model(name="layers")


@pytest.fixture(scope="module")
def built() -> dict[str, object]:
    """`model()` lowered to LLVM IR as the llvm codegen lowers it, and the machine
    configuration (the parts themselves compiled in the kernel cache test below)."""
    target = kiln.Target.from_host()
    mod = lower_for_codegen(from_onnx(model()), target)
    config, _tm, lowered = llvm_codegen._lower(mod, target, prefix=DEFAULT_PREFIX,
                                              pool=ConstantPool.from_module(mod), jit=False)
    return {"lowered": lowered, "config": config}


def _function_texts(mod: object) -> dict[str, str]:
    """Each definition's text, attribute groups written out and metadata numbered anew."""
    text = str(mod)
    groups = dict(re.findall(r"^attributes #(\d+) = \{ (.*) \}$", text, re.M))
    out = {}
    for fn in mod.functions:  # type: ignore[attr-defined]
        if fn.is_declaration:
            continue
        body = re.sub(r"#(\d+)\b", lambda m: groups[m[1]], str(fn))
        out[fn.name] = _renumbered(body)
    return out


def _renumbered(text: str) -> str:
    """`text` with its metadata numbered in order of first use."""
    numbers: dict[str, str] = {}
    return re.sub(r"!(\d+)\b", lambda m: "!" + numbers.setdefault(m[1], str(len(numbers))),
                  text)


def test_every_kernel_is_optimised_as_in_the_whole_module(built: dict) -> None:
    module, config = built["lowered"], built["config"]
    tm = config.target_machine()
    llvm = llvm_binding()
    whole = parse_and_verify(str(module.module), context=llvm.create_context())
    optimize(whole, tm, config.opt_level)
    want = _function_texts(whole)
    pieces = split.split_module(module.module)
    assert len(pieces) >= 3  # the graph function and two kernels
    got: dict[str, str] = {}
    for piece in pieces:
        if piece.calls:
            continue  # the graph function: its phis may list predecessors in another order
        mod = parse_and_verify(piece.text, context=llvm.create_context())
        optimize(mod, tm, config.opt_level)
        got.update({k: v for k, v in _function_texts(mod).items() if k in piece.functions})
    assert got and all(got[name] == want[name] for name in got), sorted(
        name for name in got if got[name] != want[name])


def _kernels_o(seed: int) -> bytes:
    ex = kiln.compile(from_onnx(model(seed)), kiln.Target.from_host())
    return bytes(ex.artifacts.get("llvm", "kernels.o").content)


def test_the_kernel_cache_gives_the_bytes_of_a_fresh_compile(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Hits give a fresh compile's bytes; a damaged file is refused and rebuilt; another
    model finds the kernels it shares. Each compile has other weights: a compile-cache
    miss."""
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    fresh = _kernels_o(seed=1)
    files = sorted(p for p in (tmp_path / "kernels").rglob("*") if p.is_file())
    # the parts' objects, and the index entries of the kernels keyed before lowering
    # (kiln.codegen.llvm.kernel_keys), which hold no object
    index = [p for p in files if kernel_cache.lookup(p.name)[0] == b""]  # type: ignore[index]
    files = [p for p in files if p not in index]
    assert len(files) >= 3 and len(index) == 3  # the two MatMul kernels and Softmax

    for damaged in (files[0], index[0]):
        data = bytearray(damaged.read_bytes())
        data[len(data) // 2] ^= 0xFF  # one flipped byte inside the object code or entry
        damaged.write_bytes(bytes(data))
    stats = dict(kernel_cache.STATS)
    with pytest.warns(kernel_cache.KernelCacheWarning, match="damaged"):
        # the other parts found (all but one without lowering them), the damaged rebuilt
        assert _kernels_o(seed=2) == fresh
    assert kernel_cache.STATS["hits"] - stats["hits"] == len(files) - 1
    assert kernel_cache.STATS["index_hits"] - stats["index_hits"] == len(index) - 1
    assert kernel_cache.STATS["refused"] - stats["refused"] == 2
    assert kernel_cache.lookup(files[0].name) is not None  # stored again, whole

    # Another model: its input 24 wide, it numbers the two MatMul kernels the other way
    # round, and finds both (a key over names would find neither); its Softmax (24
    # wide) and graph function are its own. It computes what onnxruntime computes, and
    # its load compiles no C (host.c's object was compiled during codegen). (A changed
    # machine's key: the test below.)
    hits = kernel_cache.STATS["hits"]
    other = kiln.compile(from_onnx(model(seed=4, width=24)), kiln.Target.from_host())
    assert kernel_cache.STATS["hits"] - hits == 2
    assert [a.file_name for a in other.artifacts if a.file_name.endswith(".o")] == ["kernels.o"]
    commands: list[str] = []
    run_all = native._run_all

    def spy(jobs: list[tuple[list[str], str]]) -> None:
        commands.extend(what for _cmd, what in jobs)
        run_all(jobs)

    monkeypatch.setattr(native, "_run_all", spy)
    x = np.random.default_rng(4).standard_normal((2, 24)).astype(np.float32)
    got = other["main"](x)
    assert not [c for c in commands if c.startswith("compiling")], commands
    (expected,) = onnxruntime_outputs(model(seed=4, width=24), {"x": x})
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)

    monkeypatch.setenv("KILN_CACHE", "0")  # compiled anew, in this process alone
    monkeypatch.setenv("KILN_CODEGEN_JOBS", "1")
    assert _kernels_o(seed=5) == fresh


def _pool_model(tail: str) -> onnx.ModelProto:
    """A 3x3 stride-2 max pool (a kernel run on the thread pool), then `tail` (a
    Softmax of the last axis: not fused into the pool); two kernel calls."""
    b = GraphBuilder()
    b.node("MaxPool", ["x"], ["p"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    b.node(tail, ["p"], ["y"], axis=-1)
    b.input("x", [1, 64, 56, 56])
    b.output("y", [1, 64, 28, 28])
    return b.model(name="pool")


def test_a_small_model_shares_its_parallel_kernels(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A graph function of few calls inlines its kernels, but not one that runs its
    loops on the thread pool: that one is a part of its own, keyed before lowering, and
    another model with the same kernel finds it (a small ResNet's stem max pool in a
    large one's build)."""
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    kiln.compile(from_onnx(_pool_model("Softmax")), kiln.Target.from_host())
    stats = dict(kernel_cache.STATS)
    other = kiln.compile(from_onnx(_pool_model("LogSoftmax")), kiln.Target.from_host())
    assert kernel_cache.STATS["index_hits"] - stats["index_hits"] == 1
    assert kernel_cache.STATS["hits"] - stats["hits"] == 1
    x = np.random.default_rng(0).standard_normal((1, 64, 56, 56)).astype(np.float32)
    (expected,) = onnxruntime_outputs(_pool_model("LogSoftmax"), {"x": x})
    np.testing.assert_allclose(other["main"](x), expected, rtol=1e-5, atol=1e-5)


def test_a_malformed_index_entry_is_refused(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """An index entry whose checksum holds but whose text is not a current entry is a
    miss with a warning (the kernel is lowered), never an error."""
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    entry = {"key": "k" * 64, "functions": [["kernel", 0]], "aliased": [True]}
    kernel_cache.store_index("group", entry)
    assert kernel_cache.lookup_index("group") == {**entry, "format": kernel_cache.FORMAT}
    kernel_cache.store(kernel_cache._index_name("other"), b"", b"", "not json")
    with pytest.warns(kernel_cache.KernelCacheWarning, match="malformed"):
        assert kernel_cache.lookup_index("other") is None


def test_the_key_covers_machine_and_codegen(monkeypatch: pytest.MonkeyPatch) -> None:
    config = {"triple": "x86_64-unknown-linux-gnu", "cpu": "znver4", "features": "+avx2",
              "opt_level": 3}
    key = kernel_cache.part_key("ir", config, "22.1.0")
    assert key == kernel_cache.part_key("ir", dict(config), "22.1.0")
    for changed in ({"opt_level": 2}, {"features": "+avx2,-fma"}, {"cpu": "znver5"}):
        assert kernel_cache.part_key("ir", {**config, **changed}, "22.1.0") != key
    assert kernel_cache.part_key("ir", config, "22.1.1") != key
    assert kernel_cache.part_key("ir2", config, "22.1.0") != key
    kernel_cache.codegen_fingerprint.cache_clear()
    monkeypatch.setattr(kernel_cache, "__version__", "0.0.0-other")
    try:
        assert kernel_cache.part_key("ir", config, "22.1.0") != key
    finally:
        monkeypatch.undo()
        kernel_cache.codegen_fingerprint.cache_clear()


def _tiny_part(i: int) -> str:
    """A part of `i` + 1 blocks (`parts.cost` counts its branches)."""
    blocks = "".join(f"b{k}:\n  br label %b{k + 1}\n" for k in range(i))
    return (f'define i32 @"f{i}"(i32 %x) {{\nentry:\n  br label %b0\n{blocks}'
            f"b{i}:\n  %y = add i32 %x, {i}\n  ret i32 %y\n}}\n")


def test_workers_take_parts_from_one_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    """More workers than cores, parts queued in groups, costliest first: each part is
    compiled once, and its result comes back in its place."""
    config = llvm_codegen.machine_config(kiln.Target.from_host())
    texts = [_tiny_part(i) for i in (2, 0, 5, 1, 4)]
    monkeypatch.setattr(parts, "_QUEUE_ENTRIES", 2)
    assert parts._queue(texts) == [[2, 4, 0], [3, 1]]
    monkeypatch.setenv("KILN_CODEGEN_JOBS", "3")
    tm = config.target_machine()
    assert parts._compile_all(texts, config) == [parts.compile_part(t, config, tm)
                                                 for t in texts]

    monkeypatch.setenv("KILN_CODEGEN_JOBS", "many")
    with pytest.raises(kiln.errors.CompileError, match="KILN_CODEGEN_JOBS"):
        parts.jobs()


def test_two_groups_found_under_one_part_join_once(tmp_path: Path) -> None:
    """Two kernel groups whose kiln IR differs may lower to one LLVM text, so the kernel
    cache finds both under one part: its object is joined once and both model names
    become aliases of its functions (joining it twice defined its content names twice:
    `ld -r` refused the build)."""
    config = llvm_codegen.machine_config(kiln.Target.from_host())
    name = "kiln_part_0123456789abcdef01234567_0"
    obj, bitcode, declared = parts.compile_part(
        _tiny_part(3).replace('@"f3"', f'@"{name}"'), config, config.target_machine())
    codes = [parts.PartCode(obj, bitcode, declared, {name: model}, {model: name}, "k" * 64)
             for model in ("kiln__kernel_a", "kiln__kernel_b")]
    aliases = {m: n for code in codes for m, n in code.aliases.items()}
    ld = str(parts.linker())
    with pytest.raises(kiln.errors.CompileError, match="multiple definition"):
        parts.join_objects([code.obj for code in codes], ld, aliases)
    joined = tmp_path / "kernels.o"
    joined.write_bytes(parts.join_objects(parts.distinct_objects(codes), ld, aliases))
    lib = native.link_shared([joined], tmp_path / "k.so")
    dll = ctypes.CDLL(str(lib))
    for model in ("kiln__kernel_a", "kiln__kernel_b"):
        fn = getattr(dll, model)
        fn.restype, fn.argtypes = ctypes.c_int32, [ctypes.c_int32]
        assert fn(4) == 7
