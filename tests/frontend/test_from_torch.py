"""`kiln.from_torch`: a PyTorch module exported in memory through `torch.onnx.export`
(dynamo, or TorchScript as the fallback), imported with its batch symbolic, checked
against the module itself (and onnxruntime through the same export) at three sizes;
bad arguments are clear kiln errors; without torch it is a MissingDependencyError."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pytest

import kiln
from kiln.errors import FrontendError, UsageError
from kiln.ir.attrs import ATTR_TORCH_EXPORT

MISSING_TORCH = textwrap.dedent("""
    import sys
    sys.modules["torch"] = None   # an import of torch fails as if it were not installed
    import kiln
    try:
        kiln.from_torch(object(), ())
    except kiln.MissingDependencyError as exc:
        print(type(exc).__name__, exc)
""")


def test_without_torch_it_is_a_missing_dependency_error() -> None:
    proc = subprocess.run([sys.executable, "-c", MISSING_TORCH], capture_output=True,
                          text=True, timeout=120, check=True)
    assert proc.stdout.startswith("MissingDependencyError from_torch needs the 'torch' package")
    assert 'pip install "kiln-tensor[torch]"' in proc.stdout


torch = pytest.importorskip("torch", reason="from_torch needs torch")


class Block(torch.nn.Module):
    """A linear layer, a norm over the features and a row sum: batch-agnostic."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(6, 4)
        self.norm = torch.nn.LayerNorm(4)

    def forward(self, x: Any, bias: Any) -> Any:
        return self.norm(torch.relu(self.linear(x))) + bias.sum(-1, keepdim=True)


@pytest.fixture(scope="module")
def block() -> Block:
    torch.manual_seed(0)
    return Block().eval()


def _example() -> tuple[Any, Any]:
    generator = torch.Generator().manual_seed(1)
    return torch.randn(2, 6, generator=generator), torch.randn(2, 3, generator=generator)


def _check_sizes(mod: kiln.IRModule, block: Block) -> None:
    exe = kiln.compile(mod, "llvm")
    generator = torch.Generator().manual_seed(2)
    for batch in (1, 3, 8):
        x, bias = torch.randn(batch, 6, generator=generator), torch.randn(batch, 3,
                                                                         generator=generator)
        with torch.no_grad():
            want = block(x, bias).numpy()
        got = exe["main"](x.numpy(), bias.numpy())
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _batch_only(mod: kiln.IRModule) -> list[tuple[str, str]]:
    return [(p.name, kiln.ir.shape_expr.shape_text(p.type.shape))  # type: ignore[attr-defined]
            for p in mod["main"].params]  # type: ignore[union-attr]


SIMPLE = {"x": {0: "batch"}, "bias": {0: "batch"}}


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_module_with_a_dynamic_batch_matches_torch(block: Block, exporter: str) -> None:
    if exporter == "dynamo":
        pytest.importorskip("onnxscript", reason="the dynamo exporter needs onnxscript")
    mod = kiln.from_torch(block, _example(), SIMPLE, exporter=exporter)
    assert _batch_only(mod) == [("x", "[batch, 6]"), ("bias", "[batch, 3]")]
    assert mod.attrs[ATTR_TORCH_EXPORT] == {"exporter": exporter, "fallback_reason": None}
    _check_sizes(mod, block)


def test_torch_export_dims_and_keyword_inputs(block: Block) -> None:
    pytest.importorskip("onnxscript", reason="the dynamo exporter needs onnxscript")
    batch = torch.export.Dim("batch")
    x, bias = _example()
    mod = kiln.from_torch(block, {"x": x, "bias": bias}, {"x": {0: batch}, "bias": {0: batch}})
    assert _batch_only(mod) == [("x", "[batch, 6]"), ("bias", "[batch, 3]")]
    assert mod.attrs[ATTR_TORCH_EXPORT]["exporter"] == "dynamo"
    _check_sizes(mod, block)


def test_without_dynamic_shapes_every_axis_is_fixed(block: Block) -> None:
    mod = kiln.from_torch(block, _example(), exporter="torchscript")
    assert _batch_only(mod) == [("x", "[2, 6]"), ("bias", "[2, 3]")]


class DataDependent(torch.nn.Module):
    """Python control flow on a tensor's value: torch.export cannot trace it."""

    def forward(self, x: Any) -> Any:
        if x.sum() > 0:
            return x * 2
        return x - 1


def test_auto_falls_back_to_torchscript_and_records_why() -> None:
    pytest.importorskip("onnxscript", reason="the dynamo exporter needs onnxscript")
    x = torch.ones(2, 3)
    mod = kiln.from_torch(DataDependent(), (x,), {"x": {0: "batch"}})
    record = mod.attrs[ATTR_TORCH_EXPORT]
    assert record["exporter"] == "torchscript"
    assert record["fallback_reason"].startswith("the dynamo exporter failed: ")
    with pytest.raises(FrontendError, match="from_torch: the dynamo exporter failed"):
        kiln.from_torch(DataDependent(), (x,), {"x": {0: "batch"}}, exporter="dynamo")


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"exporter": "onnx"}, r"unknown exporter 'onnx'; known: auto, dynamo, torchscript"),
    ({"dynamic_shapes": {"y": {0: "batch"}}}, r"names input 'y'; the inputs are x, bias"),
    ({"dynamic_shapes": {"x": {"0": "batch"}}}, r"has axis '0'; axes are ints"),
    ({"dynamic_shapes": ({0: "batch"},)}, r"has 1 entries, the module takes 2 inputs"),
    ({"input_names": ["a"]}, r"input_names \['a'\] must be 2 distinct names"),
])
def test_bad_arguments_are_usage_errors(block: Block, kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(UsageError, match=match):
        kiln.from_torch(block, _example(), **kwargs)


def test_bad_inputs_are_usage_errors(block: Block) -> None:
    with pytest.raises(UsageError, match=r"example_inputs\[1\] is a list, not a tensor"):
        kiln.from_torch(block, (torch.ones(2, 6), [1.0]))
    with pytest.raises(UsageError, match=r"expected a torch\.nn\.Module, got function"):
        kiln.from_torch(lambda x: x, (torch.ones(2, 6),))
