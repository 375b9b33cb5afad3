"""Exporting Hugging Face `transformers` models to ONNX in memory, for the model tests.

The API, shared by every test that exports a torch model:

- `export(model, inputs, dynamic_axes, exporter="torchscript"|"dynamo", opset=17)`:
  the `onnx.ModelProto` of `model` called with the named `inputs` (keyword arguments,
  in order) and returning its first output (`last_hidden_state`, `logits`, ...), every
  axis named in `dynamic_axes` (`{"input_ids": {0: "batch", 1: "seq"}}`) left
  symbolic under that name. `torch.manual_seed(0)` is set before, so an export is
  deterministic; nothing touches the network.
- `SIZES`: the three `(batch, seq)` sizes each model runs at.
- `compare_with_onnxruntime(run, session, feeds)`: the relative L2 error of
  `run(*feeds)` against the first output of `session` (an onnxruntime session of the
  model, `support.reference.ort_session`, made once for every size; the tests
  require < 1e-4), with the shapes checked.
- `rel_l2(actual, expected)`.

Tests in tests/models import it as `hf_export` (pytest puts a test file's folder on the path)
and skip with `pytest.importorskip("torch")` / `("transformers")` first.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx

from support.numerics import rel_l2

EXPORTERS = ("torchscript", "dynamo")

# (batch, seq) sizes each model runs at: a single short row, a small batch, and a
# batch whose sequence is longer than the export's example.
SIZES: tuple[tuple[int, int], ...] = ((1, 5), (2, 16), (3, 37))


def _first_output(names: Sequence[str], model: Any) -> Any:
    import torch

    class FirstOutput(torch.nn.Module):
        """`model(**dict(zip(names, args)))[0]`: positional inputs, one tensor out."""

        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *args: Any) -> Any:
            out = self.model(**dict(zip(names, args, strict=True)))
            return out[0] if isinstance(out, (tuple, list)) or hasattr(out, "to_tuple") \
                else out

    return FirstOutput().eval()


def export(model: Any, inputs: Mapping[str, Any], dynamic_axes: Mapping[str, Mapping[int, str]],
           exporter: str = "torchscript", opset: int = 17) -> onnx.ModelProto:
    """The ONNX model of `model(**inputs)[0]`, axes of `dynamic_axes` symbolic (module
    docstring). `exporter` is "torchscript" (`dynamo=False`, `dynamic_axes`) or "dynamo"
    (`dynamo=True`, `dynamic_shapes` naming each axis)."""
    import torch

    check_exporter(exporter)
    torch.manual_seed(0)
    names = list(inputs)
    # Axis names as strings: the dynamo exporter makes each axis dynamic and names it so.
    shapes = tuple(dict(dynamic_axes[n]) if n in dynamic_axes else None for n in names)
    with torch.no_grad():
        return export_module(_first_output(names, model), tuple(inputs.values()), names,
                             ["output"], exporter,
                             dynamic_axes={k: dict(v) for k, v in dynamic_axes.items()},
                             dynamic_shapes=(shapes,), opset=opset, dynamo_opset=max(opset, 18))


def check_exporter(exporter: str) -> None:
    """Raises ValueError unless `exporter` is one of EXPORTERS."""
    if exporter not in EXPORTERS:
        raise ValueError(f"unknown exporter {exporter!r}; known: {', '.join(EXPORTERS)}")


def export_module(module: Any, args: tuple[Any, ...], names: list[str], outputs: list[str],
                  exporter: str, dynamic_axes: Mapping[str, Mapping[int, str]],
                  dynamic_shapes: tuple[Any, ...], opset: int = 17,
                  dynamo_opset: int | None = None) -> onnx.ModelProto:
    """`module(*args)` exported in memory: TorchScript (`dynamo=False`) with
    `dynamic_axes` at `opset`, or dynamo with `dynamic_shapes` at `dynamo_opset` (None:
    the exporter's default). The exporters' own warnings (deprecation, tracer notes about
    Python values) are silenced: they are about torch, not the model."""
    import torch

    check_exporter(exporter)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "torchscript":
            buf = io.BytesIO()
            torch.onnx.export(module, args, buf, input_names=names, output_names=outputs,
                              dynamic_axes=dict(dynamic_axes), opset_version=opset,
                              dynamo=False)
            return onnx.load_from_string(buf.getvalue())
        program = torch.onnx.export(module, args, input_names=names, output_names=outputs,
                                    dynamic_shapes=dynamic_shapes, opset_version=dynamo_opset,
                                    dynamo=True, verbose=False)
        assert program is not None
        return program.model_proto




def compare_with_onnxruntime(run: Callable[..., Any], session: Any,
                             feeds: Mapping[str, np.ndarray]) -> float:
    """The rel. L2 error of `run(*feeds.values())` against the first output of the
    onnxruntime `session`; AssertionError when the shapes differ."""
    want = np.asarray(session.run(None, dict(feeds))[0])
    got = np.asarray(run(*feeds.values()))
    assert got.shape == want.shape, f"shape {got.shape}, onnxruntime {want.shape}"
    return rel_l2(got, want)
