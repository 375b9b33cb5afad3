"""int8 models with a symbolic batch (as onnxruntime's quantizer leaves an exported
model's dynamic axes) against onnxruntime, and the kernels they run: the packed int8
kernels a pinned batch runs (kiln.kernels.int8.per_sample), not the operators' generic
tensor-expression loops (docs/dynamic-shapes.md).

Each model is quantized with its batch pinned to 1 (the calibration reader's), then its
inputs' and outputs' first axis is made the symbol `batch`; one library runs batches 1
and 3 (a chunk of 8 samples' kernel is not reached at 3, the one-sample kernel is; 9
reaches both on one target). The dynamically quantized models (`quantize_dynamic`: an
MLP with a symbolic batch, an encoder with a symbolic batch and sequence) run their
products on `dynamic_quant_matmul_packed`'s tiles over a run-time row count
(kiln.kernels.int8.matmul); kiln quantizes A as onnxruntime does, so they agree closely.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import onnx
import pytest
from quantized_models import (
    MAX_REL_L2,
    RECURRENT_REL_L2,
    quantize_dynamic_model,
    quantize_static_model,
    rel_l2,
)

import kiln
from kiln.driver.compiler import lower_for_codegen
from kiln.frontend import from_onnx
from kiln.ir import IRModule
from kiln.target import Target
from kiln.target.isa import isa_for
from support import dynamic_models
from support import small_models as builders
from support.reference import like_onnxruntime, onnxruntime_outputs

#: Targets: generic x86-64 (llvm, c), and the AVX2 and AVX-512 kernels where this host
#: runs them (`-mattr=-avx512f`: the AVX2 path, as tests/ops/test_conv_kernels.py does).
AVX2 = "llvm -mcpu=znver4 -mattr=-avx512f"
AVX512 = "llvm -mcpu=znver4"
TARGETS = ("llvm", "c", AVX2, AVX512)
#: The packed int8 kernels' names (the `kiln.gemm_kernel` attribute of their functions).
PACKED_CONVS = {"qlinear_conv_dot", "qlinear_conv_grouped"}
PACKED_PRODUCTS = {"qlinear_matmul_packed", "matmul_integer_packed",
                   "dynamic_quant_matmul_packed"}


def _host_runs(target: str) -> bool:
    return isa_for(Target(target)).features <= isa_for(Target.from_host()).features


def symbolic_batch(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with its inputs' and outputs' first axis the symbol `batch` (the inferred
    shapes inside dropped: they name the pinned batch)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.value_info[:]
    for value in (*out.graph.input, *out.graph.output):
        dim = value.type.tensor_type.shape.dim[0]
        dim.Clear()
        dim.dim_param = "batch"
    return out


# (model, format, per-channel weights): the small CNN, and a ResNet-shaped one whose
# residual adds are `qlinear_add`s: ResNet-18's layout at two stages, 8 and 24 channels
# (identity and projection shortcuts, a channel count off the 16-lane blocks; the later
# stages repeat their kernels at other sizes and cost the suite's time)
CONFIGS: dict[str, tuple[Any, str, bool]] = {
    "cnn-qdq-per-tensor": (dynamic_models.cnn, "QDQ", False),
    "cnn-qdq-per-channel": (dynamic_models.cnn, "QDQ", True),
    "cnn-qoperator": (dynamic_models.cnn, "QOperator", True),
    "resnet-qdq": (functools.partial(builders.resnet18, widths=(8, 24)), "QDQ", True),
}


def _grouped(names: list[str]) -> list[Any]:
    """Fixture params whose tests one xdist worker runs, per param (`make test`
    distributes with --dist loadgroup): the model is quantized and each target's build
    compiled once (`_compiled`), not once per worker its tests land on."""
    return [pytest.param(n, marks=pytest.mark.xdist_group(f"int8-symbolic-{n}")) for n in names]


@pytest.fixture(scope="module", params=_grouped(list(CONFIGS)))
def cnn(request: pytest.FixtureRequest) -> onnx.ModelProto:
    build, fmt, per_channel = CONFIGS[request.param]
    return symbolic_batch(quantize_static_model(build(batch=1), fmt, per_channel))


# (id of the model, target) -> (the model, its build): the model is held so that its id
# is not reused by the next config's model once the module fixture lets it go (a reused
# id returned another quantization's build: results one quantum off, now and then)
_BUILDS: dict[tuple[int, str], tuple[onnx.ModelProto, Any]] = {}


def _compiled(model: onnx.ModelProto, target: str) -> Any:
    """`model` compiled for `target`, once per module."""
    key = (id(model), target)
    if key not in _BUILDS:
        _BUILDS[key] = (model, kiln.compile(from_onnx(model), like_onnxruntime(target)))
    return _BUILDS[key][1]


def _kernels(ex: Any) -> list[str]:
    """The hand-built kernels of `ex` (a function's `kiln.gemm_kernel`, or `qlinear_add`
    for the flat int8 add), one per function; the generic loops have neither."""
    return _kernels_of(ex.ir)


def _kernels_of(mod: IRModule) -> list[str]:
    """_kernels of a lowered module; the parallel loops outlined out of a function (where
    lower_for_codegen outlines them, compile's `ex.ir` does not) are part of it."""
    return [f.attrs.get("kiln.gemm_kernel") or
            ("qlinear_add" if f.attrs.get("kiln.qlinear_add") else None)
            for f in mod.functions.values()
            if not f.attrs.get("kiln.graph") and "kiln.parallel_loop_of" not in f.attrs]


def _pinned_kernels(model: onnx.ModelProto, target: str, pins: dict[str, int]) -> list[str]:
    """_kernels of `model` built with `pins`, lowered as compile hands it to the code
    generator but not compiled: the pinned builds are only compared with, never run
    (the code generator was most of their time)."""
    return _kernels_of(lower_for_codegen(from_onnx(model, shape_dict=pins),
                                         Target(like_onnxruntime(target))))


@pytest.mark.parametrize("target", TARGETS)
def test_cnn_with_a_symbolic_batch_matches_onnxruntime(cnn: onnx.ModelProto,
                                                       target: str) -> None:
    if not _host_runs(target):
        pytest.skip(f"this host does not run {target}")
    ex = _compiled(cnn, target)
    for batch in (1, 3) if target != AVX512 else (9,):
        feeds = dynamic_models.feeds(cnn, {"batch": batch}, seed=batch)
        want = onnxruntime_outputs(cnn, feeds)[0]
        got = np.asarray(ex["main"](*feeds.values()))
        assert got.shape == want.shape
        assert rel_l2(got, want) < MAX_REL_L2, (target, batch)


@pytest.mark.parametrize("target", (AVX2, AVX512))
def test_symbolic_batch_convolutions_take_the_packed_kernels(cnn: onnx.ModelProto,
                                                             target: str) -> None:
    # compiled, not run: any host checks which kernels the target's build has
    ex = _compiled(cnn, target)
    pinned = _pinned_kernels(cnn, target, {"batch": 1})
    kernels = sorted(k for k in _kernels(ex) if k in PACKED_CONVS | {"qlinear_add"})
    # every convolution (and residual add) on the kernel a pinned batch takes: no
    # function of theirs runs the generic loops
    generic = [name for name, f in ex.ir.functions.items()
               if name.startswith(("qlinear_conv", "qlinear_add"))
               and not (f.attrs.get("kiln.gemm_kernel") or f.attrs.get("kiln.qlinear_add"))]
    assert kernels and not generic, generic
    assert kernels == sorted(k for k in pinned if k in PACKED_CONVS | {"qlinear_add"})
    # and no int8 op of theirs (the global average pool included) is left on a generic
    # loop that a pinned build would run on a kernel (docs/dynamic-shapes.md)
    assert "generic_kernels" not in ex.metadata, ex.metadata["generic_kernels"]


DYNAMIC: dict[str, Any] = {
    "mlp": (lambda: symbolic_batch(builders.mlp(batch=1)), ({"batch": 1}, {"batch": 5})),
    "encoder": (lambda: dynamic_models.encoder(layers=1),
                ({"batch": 1, "seq": 16}, {"batch": 3, "seq": 7})),
}


@pytest.fixture(scope="module", params=_grouped(list(DYNAMIC)))
def dynamic(request: pytest.FixtureRequest) -> tuple[onnx.ModelProto, Any]:
    build, sizes = DYNAMIC[request.param]
    return quantize_dynamic_model(build()), sizes


@pytest.mark.parametrize("target", (*TARGETS[:2], AVX2))
def test_dynamic_quantization_with_symbolic_rows_matches_onnxruntime(
        dynamic: tuple[onnx.ModelProto, Any], target: str) -> None:
    if not _host_runs(target):
        pytest.skip(f"this host does not run {target}")
    model, sizes = dynamic
    ex = _compiled(model, target)
    for size in sizes:
        feeds = dynamic_models.feeds(model, size, seed=sum(size.values()))
        want = onnxruntime_outputs(model, feeds)[0]
        got = np.asarray(ex["main"](*feeds.values()))
        assert got.shape == want.shape
        assert rel_l2(got, want) < RECURRENT_REL_L2, (target, size)


@pytest.mark.parametrize("target", (AVX2, AVX512))
def test_symbolic_rows_take_the_packed_products(dynamic: tuple[onnx.ModelProto, Any],
                                                target: str) -> None:
    # lowered as compile hands it to the code generator, not compiled: which kernel a
    # product takes is decided before code generation (the AVX-512 build was compiled
    # for this check alone, the int8 encoder's LLVM work most of the module's time)
    model, sizes = dynamic
    lowered = lower_for_codegen(from_onnx(model), Target(like_onnxruntime(target)))
    kernels = sorted(k for k in _kernels_of(lowered) if k in PACKED_PRODUCTS)
    pinned = _pinned_kernels(model, target, sizes[0])
    assert kernels and kernels == sorted(k for k in pinned if k in PACKED_PRODUCTS)


def test_depthwise_convolutions_over_a_symbolic_batch() -> None:
    # MobileNetV2's depthwise layers: qlinear_conv_grouped, chunk by chunk (AVX2 only:
    # the other targets run the same wrapper, tested above on the dot-form layers)
    if not _host_runs(AVX2):
        pytest.skip(f"this host does not run {AVX2}")
    model = symbolic_batch(quantize_static_model(builders.mobilenet_v2(batch=1), "QDQ", True))
    ex = _compiled(model, AVX2)
    assert "qlinear_conv_grouped" in _kernels(ex)
    assert sorted(map(str, _kernels(ex))) == \
        sorted(map(str, _pinned_kernels(model, AVX2, {"batch": 1})))
    for batch in (1, 9):
        feeds = dynamic_models.feeds(model, {"batch": batch}, seed=batch)
        got = np.asarray(ex["main"](*feeds.values()))
        assert rel_l2(got, onnxruntime_outputs(model, feeds)[0]) < MAX_REL_L2, batch
