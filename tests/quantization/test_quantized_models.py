"""Models quantized by onnxruntime's quantizer, compiled by kiln, against onnxruntime's
int8 run (docs/quantization.md).

For each model and format, the model is quantized once (module-scoped fixture) and
run by onnxruntime; kiln imports it, fuses the QDQ patterns into integer ops
(quantize-ops) and compiles it for `llvm` and `c` (the QOperator form, whose integer
ops are the QDQ form's, for `llvm`). Integer outputs (the model with its final
DequantizeLinear removed) must equal onnxruntime's, or be one quantum apart on at most
0.1% of the elements; dequantized outputs of the QDQ models must be within a relative
L2 error of 1e-2 (on llvm). One configuration is also exported and run in a fresh
process with 1 and 2 threads. With KILN_FULL_MODELS=1 the same runs on `-mcpu=znver4`
(the dot-product kernels) too.
"""

from __future__ import annotations

import functools
import os
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from quantized_models import (
    MAX_REL_L2,
    check_integer,
    integer_outputs,
    onnxruntime_int8_outputs,
    quantize_dynamic_model,
    quantize_static_model,
    rel_l2,
)

import kiln
from kiln.frontend import from_onnx
from kiln.ir import assert_structural_equal
from kiln.ir import graph as g
from kiln.script import from_source, print_module
from kiln.target import Target
from kiln.target.isa import isa_for
from kiln.transform.quantize_ops import QuantizeOps
from support import dynamic_models
from support import small_models as builders
from support.processes import outputs_in_fresh_process
from support.reference import like_onnxruntime, onnxruntime_outputs

TARGETS = ("llvm", "c")
# The dot-product kernels (vpdpbusd) on the model set: about 100 s of compilation, so
# with KILN_FULL_MODELS=1 only (tests/quantization/test_dot_gemm.py covers the kernels
# in CI), and on a host that runs the target.
DOT_TARGET = "llvm -mcpu=znver4"
FULL = os.environ.get("KILN_FULL_MODELS") == "1"


def _host_runs(target: str) -> bool:
    if target == DOT_TARGET and not FULL:
        return False
    return isa_for(Target(target)).features <= isa_for(Target.from_host()).features

# ResNet-18's layout at two stages, 8 and 24 channels: identity and projection
# shortcuts, a channel count off the 16-lane blocks (its later stages repeat these
# kernels at other sizes, and the c build of all four took the suite's time)
RESNET = functools.partial(builders.resnet18, widths=(8, 24))

# (model builder, quant format, per-channel weights, activation type)
CONFIGS: dict[str, tuple[Any, str, bool, str]] = {
    "resnet-qdq-u8": (RESNET, "QDQ", True, "uint8"),
    "resnet-qoperator-u8": (RESNET, "QOperator", True, "uint8"),
    "mobilenet_v2-qdq-s8": (builders.mobilenet_v2, "QDQ", True, "int8"),
    "vgg-qdq-per-tensor": (lambda: builders.vgg(batch=1), "QDQ", False, "uint8"),
}


def _op_counts(mod: Any) -> Counter[str]:
    return Counter(b.value.op for b in mod["main"].bindings if isinstance(b.value, g.Call))


@pytest.fixture(scope="module", params=list(CONFIGS))
def quantized(request: pytest.FixtureRequest) -> dict[str, Any]:
    build, fmt, per_channel, activations = CONFIGS[request.param]
    model = quantize_static_model(build(), fmt, per_channel, activations)
    ints = integer_outputs(model)
    feeds = builders.example_inputs(model, seed=1)
    return {"name": request.param, "format": fmt, "model": model, "ints": ints,
            "feeds": feeds, "want_float": onnxruntime_int8_outputs(model, feeds, activations),
            "want_int": onnxruntime_int8_outputs(ints, feeds, activations),
            "executables": {}}


def _compiled(q: dict[str, Any], target: str, which: str) -> kiln.driver.Executable:
    key = (target, which)
    if key not in q["executables"]:
        q["executables"][key] = kiln.compile(from_onnx(q[which]), like_onnxruntime(target))
    return q["executables"][key]


def _outputs(ex: kiln.driver.Executable, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    got = ex["main"](*feeds.values())
    return list(got) if isinstance(got, tuple) else [got]


def test_qdq_products_become_integer_ops(quantized: dict[str, Any]) -> None:
    model = quantized["model"]
    mod = QuantizeOps()(from_onnx(model))
    ops = _op_counts(mod)
    convs = sum(n.op_type in ("Conv", "QLinearConv") for n in model.graph.node)
    gemms = sum(n.op_type in ("Gemm", "MatMul", "QGemm", "QLinearMatMul")
                for n in model.graph.node)
    # every convolution and dense layer runs on integers (depthwise and grouped
    # convolutions: qlinear_conv_grouped) but those onnxruntime keeps in float (int8
    # activations it cannot run as uint8, kiln.ops.quant_ort: summed as it sums them)
    assert ops["qlinear_conv_packed"] + ops["qlinear_conv_grouped"] \
        + ops["conv2d_mlas"] == convs
    assert quantized["name"].endswith("-s8") or not ops["conv2d_mlas"]
    assert ops["qlinear_matmul_packed"] == gemms
    assert not ops.keys() & {"conv2d", "matmul", "qlinear_conv", "qlinear_matmul"}
    # the integer module prints and parses back unchanged
    assert_structural_equal(from_source(print_module(mod)), mod)


# The QOperator file imports to the QDQ one's integer ops (the same op counts, the
# ReLU fused as qmin/qmax instead of a clip): its c build would run the
# code of resnet-qdq-u8's again, so it runs on llvm only.
C_BUILDS = [name for name, config in CONFIGS.items() if config[1] == "QDQ"]


@pytest.mark.parametrize("target", [*TARGETS, DOT_TARGET])
def test_integer_outputs_match_onnxruntime(quantized: dict[str, Any], target: str) -> None:
    if not _host_runs(target):
        pytest.skip(f"{target}: KILN_FULL_MODELS=1 on a host that runs it")
    if target == "c" and quantized["name"] not in C_BUILDS:
        pytest.skip("the QOperator form runs the QDQ form's integer ops: its c code is "
                    "built and checked by the resnet-qdq-u8 case")
    got = _outputs(_compiled(quantized, target, "ints"), quantized["feeds"])
    for got_k, w in zip(got, quantized["want_int"], strict=True):
        check_integer(got_k, w, f"{quantized['name']} on {target}")


# The float outputs (the final DequantizeLinear fused in): the two QDQ models of the
# model set. The integer outputs of every configuration are checked exactly above; the
# float tail is the same op in each (about 15 s a build).
@pytest.mark.parametrize("quantized", ["resnet-qdq-u8", "mobilenet_v2-qdq-s8"],
                         indirect=True)
def test_dequantized_outputs_match_onnxruntime(quantized: dict[str, Any]) -> None:
    # the c backend runs the same integer graph (test_integer_outputs_match_onnxruntime)
    target = "llvm"
    got = _outputs(_compiled(quantized, target, "model"), quantized["feeds"])
    for got_k, w in zip(got, quantized["want_float"], strict=True):
        assert got_k.dtype == w.dtype and got_k.shape == w.shape
        error = rel_l2(got_k, w)
        assert error < MAX_REL_L2, f"{quantized['name']} on {target}: {error}"


@pytest.mark.parametrize("quantized", ["resnet-qdq-u8"], indirect=True)
@pytest.mark.parametrize(("target", "threads"), [("llvm", 1), ("llvm", 2), ("c", 2),
                                                 (DOT_TARGET, 1), (DOT_TARGET, 2)])
def test_exported_library_in_a_fresh_process(quantized: dict[str, Any], target: str,
                                             threads: int, tmp_path: Path) -> None:
    if not _host_runs(target):
        pytest.skip(f"{target}: KILN_FULL_MODELS=1 on a host that runs it")
    # one configuration is enough for export and thread counts
    ex = _compiled(quantized, target, "ints")
    got = outputs_in_fresh_process(ex, quantized["feeds"], tmp_path, threads)
    for got_k, w in zip(got, quantized["want_int"], strict=True):
        check_integer(got_k, w, f"{quantized['name']} exported for {target}, {threads} threads")


# --------------------------------------------------------------------------- dynamic

@pytest.fixture(scope="module")
def dynamic_encoder() -> tuple[onnx.ModelProto, dict[str, np.ndarray], np.ndarray]:
    model = quantize_dynamic_model(dynamic_models.encoder(batch=2, seq=16))
    feeds = dynamic_models.feeds(model, {}, seed=3)
    return model, feeds, onnxruntime_outputs(model, feeds)[0]


def test_dynamic_quantization_imports_integer_products(dynamic_encoder: Any) -> None:
    model, _, _ = dynamic_encoder
    ops = _op_counts(from_onnx(model))
    matmuls = sum(n.op_type == "MatMulInteger" for n in model.graph.node)
    assert matmuls > 0 and ops["matmul_integer"] == matmuls
    assert ops["dynamic_quantize_linear"] == sum(n.op_type == "DynamicQuantizeLinear"
                                                 for n in model.graph.node)
    # each product and its float epilogue fused, constant weights packed with their
    # column sums at compile time
    packed = _op_counts(QuantizeOps()(from_onnx(model)))
    assert packed["dynamic_quant_matmul_packed"] == matmuls and "matmul_integer" not in packed


@pytest.mark.parametrize("target", TARGETS)
def test_dynamic_encoder_matches_onnxruntime(dynamic_encoder: Any, target: str) -> None:
    model, feeds, want = dynamic_encoder
    got = _outputs(kiln.compile(from_onnx(model), like_onnxruntime(target)), feeds)[0]
    assert got.shape == want.shape
    assert rel_l2(got, want) < MAX_REL_L2, f"{target}: {rel_l2(got, want)}"
