"""Composite targets: one model split between the llvm and c code generators (a stand-in
for two devices), linked into one library; per-function targets are IR attributes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import kiln
from kiln.artifact.artifact import device_key
from kiln.driver.split import assign_targets, target_of
from kiln.errors import CompileError
from kiln.frontend import from_onnx
from kiln.ir import structural_equal
from kiln.ir.attrs import ATTR_TARGET
from kiln.script import from_source
from kiln.target import Target
from support.cuda_nets import cnn
from support.processes import child_env
from support.reference import onnxruntime_outputs

COMPOSITE = Target({"kind": "composite", "devices": ["llvm", "c"], "host": "llvm"})


@pytest.fixture(scope="module")
def split() -> kiln.Executable:
    model, _ = cnn()
    return kiln.compile(model, COMPOSITE)


def test_kernels_are_shared_between_llvm_and_c(split: kiln.Executable) -> None:
    kinds = {name: target_of(fn).kind.name for name, fn in split.ir.items()}
    assert kinds["main"] == "llvm"
    kernels = [k for name, k in kinds.items() if name != "main"]
    assert kernels.count("c") >= 3 and kernels.count("llvm") >= 3
    keys = {a.key for a in split.artifacts}
    assert {("llvm", "kernels.o"), ("host", "host.c")} <= keys  # the host's: no target key
    (c_kernels,) = [a for a in split.artifacts if a.codegen_id == "c"]
    assert c_kernels.target_key == device_key("c", Target("c").fingerprint())
    assert c_kernels.file_name == f"{c_kernels.target_key}_kernels.c"
    # One weights blob for both code generators.
    assert [a.file_name for a in split.artifacts].count("constants.bin") == 1
    c_source = bytes(c_kernels.content).decode()
    for name, kind in kinds.items():
        defined = f"kiln__kernel_{name}(" in c_source and kind == "c"
        assert defined == (kind == "c"), name


def test_split_matches_single_target_and_onnxruntime(split: kiln.Executable) -> None:
    model, feeds = cnn()
    expected = onnxruntime_outputs(model, feeds)[0]
    single = kiln.compile(model, "llvm")(*feeds.values())
    got = split(*feeds.values())
    np.testing.assert_allclose(got, single, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


LOAD = """
import sys, numpy as np, kiln
lib = kiln.runtime.load_module(sys.argv[1])
x = np.load(sys.argv[2])
np.save(sys.argv[3], lib["main"](x))
"""


def test_exported_split_library_runs_in_a_fresh_process(split: kiln.Executable,
                                                         tmp_path: Path) -> None:
    model, feeds = cnn()
    (x,) = feeds.values()
    path = tmp_path / "split.so"
    split.export_library(path)
    np.save(tmp_path / "x.npy", x)
    env = child_env()
    proc = subprocess.run([sys.executable, "-c", LOAD, str(path), str(tmp_path / "x.npy"),
                           str(tmp_path / "y.npy")], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), onnxruntime_outputs(model, feeds)[0],
                               rtol=1e-4, atol=1e-4)


def test_target_annotations_print_and_parse_back(split: kiln.Executable) -> None:
    text = split.ir.script()
    assert '"target": ' in text
    again = from_source(text)
    assert structural_equal(again, split.ir)
    assert {n: target_of(f) for n, f in again.items()} == \
        {n: target_of(f) for n, f in split.ir.items()}


def test_a_kernel_annotated_by_hand_keeps_its_target() -> None:
    from kiln.ir.module import IRModule
    from kiln.transform.pipeline import get_pipeline

    model, _ = cnn()
    host, c = Target("llvm"), Target("c")
    with host:
        lowered = get_pipeline("default", "graph")(from_onnx(model))
    first = next(n for n in lowered.prim_funcs() if n != "main")
    pinned = IRModule({**lowered.functions,
                       first: lowered[first].with_attrs(**{ATTR_TARGET: "c"})}, lowered.attrs)
    assigned = assign_targets(pinned, host, [host, c])
    assert target_of(assigned[first]) == c
    assert target_of(assigned["main"]) == host
    with pytest.raises(CompileError, match="asks for target c but this build has llvm"):
        assign_targets(pinned, host, [Target("llvm -opt-level=2")])


def test_two_devices_of_one_kind_stay_distinct_through_export_load_and_mlf(
        tmp_path: Path) -> None:
    """Two llvm devices that differ only in their code (optimisation level): each one's
    artifacts carry its target key, in the library, the .tar and the MLF archive."""
    import tarfile

    from kiln.export.mlf import export_model_library_format

    model, feeds = cnn()
    devices = [Target("llvm -opt-level=1"), Target("llvm -opt-level=2")]
    ex = kiln.compile(model, {"kind": "composite", "devices": [str(d) for d in devices],
                              "host": "llvm"})
    keys = {device_key("llvm", d.fingerprint()) for d in devices}
    objects = sorted(a.file_name for a in ex.artifacts if a.file_name.endswith("kernels.o"))
    assert objects == sorted(["kernels.o", *(f"{k}_kernels.o" for k in keys)])
    expected = onnxruntime_outputs(model, feeds)[0]
    for suffix in (".so", ".tar"):
        path = tmp_path / f"two{suffix}"
        ex.export_library(path)
        lib = kiln.runtime.load_module(path)
        np.testing.assert_allclose(lib["main"](*feeds.values()), expected, rtol=1e-4,
                                   atol=1e-4)
        assert {a.target_key for a in kiln.artifact.load(path)} == {"", *keys}
    export_model_library_format(ex, tmp_path / "two.mlf.tar")
    with tarfile.open(tmp_path / "two.mlf.tar") as tar:
        names = tar.getnames()
    for key in keys:
        assert any(n.endswith(f"codegen/host/lib/{key}_kernels.o") for n in names), names


def test_a_c_host_calls_kernels_compiled_by_llvm() -> None:
    model, feeds = cnn()
    ex = kiln.compile(model, {"kind": "composite", "devices": ["c", "llvm"], "host": "c"})
    kinds = {target_of(fn).kind.name for name, fn in ex.ir.items() if name != "main"}
    assert kinds == {"c", "llvm"}
    np.testing.assert_allclose(ex(*feeds.values()), onnxruntime_outputs(model, feeds)[0],
                               rtol=1e-4, atol=1e-4)
