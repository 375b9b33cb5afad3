"""`kiln.cuda(n)`: devices chosen at run time; without a GPU, a clear kiln error."""

from __future__ import annotations

import importlib.util

import pytest

import kiln
from kiln.errors import CallError, KilnError
from kiln.runtime.cuda_device import CudaDevice, require_device


def _has_binding() -> bool:
    try:
        return importlib.util.find_spec("cuda.bindings") is not None
    except ModuleNotFoundError:
        return False


def test_device_is_chosen_by_ordinal() -> None:
    dev = kiln.cuda(1)
    assert isinstance(dev, CudaDevice)
    assert dev.index == 1 and str(dev) == "cuda(1)"
    assert dev.dlpack_device == (2, 1)  # kDLCUDA, device id
    assert kiln.cuda() == CudaDevice(0)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "0"])
def test_bad_ordinal_is_a_kiln_error(bad: object) -> None:
    with pytest.raises(CallError, match="CUDA device index must be an int"):
        kiln.cuda(bad)  # type: ignore[arg-type]


@pytest.mark.skipif(_has_binding(), reason="cuda-python is installed: tests/gpu covers it")
def test_without_the_binding_using_a_device_says_no_cuda_device() -> None:
    with pytest.raises(CallError,
                       match=r"no CUDA device available.*cuda-python.*kiln-tensor\[cuda\]") \
            as err:
        require_device(kiln.cuda(0))
    assert isinstance(err.value, KilnError)
