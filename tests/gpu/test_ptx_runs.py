"""PTX kiln emits loads and runs on a real GPU and matches numpy (GPU machines only)."""

from __future__ import annotations

import ctypes
from types import ModuleType
from typing import Any

import numpy as np

from kiln.codegen.cuda import emit_ptx
from support.cuda_ptx_kernels import RELU_KERNEL


def _ok(result: Any) -> Any:
    err, *rest = result
    assert int(err) == 0, err
    return rest[0] if len(rest) == 1 else rest


def test_relu_ptx_matches_numpy(driver: ModuleType) -> None:
    cu = driver
    dev = _ok(cu.cuDeviceGet(0))
    major = _ok(cu.cuDeviceGetAttribute(
        cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev))
    minor = _ok(cu.cuDeviceGetAttribute(
        cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev))
    ctx = _ok(cu.cuDevicePrimaryCtxRetain(dev))
    _ok(cu.cuCtxSetCurrent(ctx))
    ptx = emit_ptx(RELU_KERNEL, f"sm_{major}{minor}")
    module = _ok(cu.cuModuleLoadData(ptx.encode() + b"\0"))
    fn = _ok(cu.cuModuleGetFunction(module, b"relu"))
    n = 1000
    a = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    out = np.empty_like(a)
    d_a = _ok(cu.cuMemAlloc(a.nbytes))
    d_out = _ok(cu.cuMemAlloc(out.nbytes))
    try:
        _ok(cu.cuMemcpyHtoD(d_a, a.ctypes.data, a.nbytes))
        args = ((d_a, d_out, n), (None, None, ctypes.c_int32))
        block = 256
        _ok(cu.cuLaunchKernel(fn, (n + block - 1) // block, 1, 1, block, 1, 1, 0, 0, args, 0))
        _ok(cu.cuCtxSynchronize())
        _ok(cu.cuMemcpyDtoH(out.ctypes.data, d_out, out.nbytes))
    finally:
        _ok(cu.cuMemFree(d_a))
        _ok(cu.cuMemFree(d_out))
        _ok(cu.cuModuleUnload(module))
        _ok(cu.cuDevicePrimaryCtxRelease(dev))
    np.testing.assert_array_equal(out, np.maximum(a, 0))
