"""Compiled CUDA libraries on a real GPU (skipped elsewhere, naming the reason):
the CNN and the encoder match onnxruntime, in this process and after export, and a
kernel runs zero-copy on torch / cupy tensors passed as DLPack."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

import kiln
from kiln.runtime.cuda_loader import CudaModule
from kiln.target import Target
from support.cuda_nets import NETS
from support.reference import onnxruntime_outputs


def _arch(cu: ModuleType) -> str:
    attr = cu.CUdevice_attribute
    _, dev = cu.cuDeviceGet(0)
    _, major = cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)
    _, minor = cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)
    return f"sm_{major}{minor}"


def _target(cu: ModuleType) -> Target:
    return Target({"kind": "cuda", "arch": _arch(cu), "host": {"kind": "llvm"}})


@pytest.mark.parametrize("name", sorted(NETS))
def test_model_matches_onnxruntime_on_the_gpu(driver: ModuleType, name: str,
                                              tmp_path: Path) -> None:
    model, feeds = NETS[name]()
    expected = onnxruntime_outputs(model, feeds)[0]
    ex = kiln.compile(model, _target(driver))
    np.testing.assert_allclose(ex(*feeds.values()), expected, rtol=1e-3, atol=1e-3)
    ex.export_library(tmp_path / "m.so")
    lib = kiln.runtime.load_module(tmp_path / "m.so")
    np.testing.assert_allclose(lib["main"](*feeds.values()), expected, rtol=1e-3, atol=1e-3)


def _cuda_module(lib: kiln.runtime.Module) -> CudaModule:
    found = [m for m in lib.imports if isinstance(m, CudaModule)]
    assert len(found) == 1
    return found[0]


@pytest.mark.parametrize("framework", ["torch", "cupy"])
def test_a_kernel_runs_on_dlpack_device_tensors(driver: ModuleType, framework: str) -> None:
    xp = pytest.importorskip(framework)
    model, _ = NETS["cnn"]()
    lib = kiln.compile(model, _target(driver)).jit()
    cuda = _cuda_module(lib)
    kernel = next(k for k in cuda.kernels if k["name"].startswith("max_pool2d"))
    src, dst = kernel["params"]
    x = np.random.default_rng(0).standard_normal(src["shape"]).astype(np.float32)
    if framework == "torch":
        d_x = xp.from_numpy(x).to("cuda:0")
        d_y = xp.empty(tuple(dst["shape"]), dtype=xp.float32, device="cuda:0")
    else:
        d_x = xp.asarray(x)
        d_y = xp.empty(tuple(dst["shape"]), dtype=xp.float32)
    cuda.launch(kernel["name"], d_x, d_y)
    got = d_y.cpu().numpy() if framework == "torch" else xp.asnumpy(d_y)
    n, c, h, w = src["shape"]
    expected = x.reshape(n, c, h // 2, 2, w // 2, 2).max(axis=(3, 5))
    np.testing.assert_array_equal(got, expected)
