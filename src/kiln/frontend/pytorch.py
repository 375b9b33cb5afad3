"""`kiln.from_torch`: a PyTorch module in, an IRModule out, through ONNX in memory.

The module is exported with `torch.onnx.export` into memory (no file) and imported
with `kiln.frontend.from_onnx`. Two exporters:

- "dynamo" (`torch.onnx.export(..., dynamo=True, dynamic_shapes=...)`): traces with
  `torch.export`, needs the `onnxscript` package; writes opset 18 or later.
- "torchscript" (`dynamo=False, dynamic_axes=...`): the tracing exporter; opset 17.

`exporter="auto"` tries dynamo and falls back to TorchScript when dynamo fails, when
onnxscript is absent, or when kiln cannot import dynamo's model; the module records
which exporter ran and why it fell back in its attribute `kiln.torch_export`
(`{"exporter": "torchscript", "fallback_reason": "..."}`). torch is an optional
dependency: the extra `kiln-tensor[torch]`.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from kiln.errors import FrontendError, MissingDependencyError, UsageError
from kiln.frontend import from_onnx
from kiln.ir.attrs import ATTR_TORCH_EXPORT
from kiln.ir.module import IRModule

EXPORTERS = ("auto", "dynamo", "torchscript")

# The opset each exporter writes: TorchScript's most tested one, and the lowest the
# dynamo exporter supports.
_TORCHSCRIPT_OPSET = 17
_DYNAMO_OPSET = 18


def from_torch(module: Any, example_inputs: Any, dynamic_shapes: Any = None, *,
               exporter: str = "auto", input_names: Sequence[str] | None = None,
               opset: int | None = None, shape_dict: Mapping[str, Any] | None = None,
               **options: Any) -> IRModule:
    """Import the PyTorch `module` called on `example_inputs` as an IRModule.

    `example_inputs` is a tensor, a tuple of tensors (positional arguments) or a dict
    of tensors (keyword arguments, in order). The graph function `main` takes the
    inputs under `input_names` (default: the dict's keys, or the names of `forward`'s
    parameters) and returns the module's outputs in order.

    `dynamic_shapes` names the axes that stay symbolic, in either form:

    - kiln's: `{"input_ids": {0: "batch", 1: "seq"}}` by input name; axes that share
      a name share one dimension variable;
    - torch.export's: a tuple in argument order, or a dict by input name, of
      `{axis: torch.export.Dim("batch")}` (or per-axis lists); a Dim gives its name
      (its min/max are not kept: bound a size with `shape_dict={"seq": range(1, 513)}`),
      a hint without one (`Dim.DYNAMIC`) is named `input_axis`.

    Every other axis is fixed at its size in `example_inputs`. `exporter` is "auto"
    (dynamo, else TorchScript, the reason recorded in the module attribute
    `kiln.torch_export`), "dynamo" or "torchscript"; `opset` overrides the exporter's
    default (17 TorchScript, 18 dynamo). `shape_dict` and `options` go to
    `kiln.frontend.from_onnx`.

    Raises MissingDependencyError without torch (or without onnxscript for
    `exporter="dynamo"`), UsageError for bad arguments, and FrontendError when the
    export fails (the exporter's message quoted) or kiln cannot import its result.
    """
    torch = _import_torch()
    if exporter not in EXPORTERS:
        raise UsageError(f"from_torch: unknown exporter {exporter!r}; known: "
                         f"{', '.join(EXPORTERS)}")
    if not isinstance(module, torch.nn.Module):
        raise UsageError(f"from_torch: expected a torch.nn.Module, got {type(module).__name__}")
    args, kwargs = _split_inputs(torch, example_inputs)
    names = _input_names(module, args, kwargs, input_names)
    axes = _named_axes(dynamic_shapes, names)

    record: dict[str, Any] = {"exporter": exporter, "fallback_reason": None}
    if exporter in ("auto", "dynamo"):
        try:
            proto = _export_dynamo(torch, module, args, kwargs, names, axes,
                                   opset or _DYNAMO_OPSET)
            record["exporter"] = "dynamo"
        except MissingDependencyError as exc:
            if exporter == "dynamo":
                raise
            record.update(exporter="torchscript", fallback_reason=str(exc))
        except Exception as exc:
            if exporter == "dynamo":
                raise FrontendError(f"from_torch: the dynamo exporter failed: "
                                    f"{_first_line(exc)}") from exc
            record.update(exporter="torchscript",
                          fallback_reason=f"the dynamo exporter failed: {_first_line(exc)}")

    pins = dict(shape_dict) if shape_dict else None
    if record["exporter"] == "dynamo":
        try:
            mod = from_onnx(proto, pins, **options)
        except FrontendError as exc:
            if exporter == "dynamo":
                raise
            # kiln cannot import what dynamo wrote: the TorchScript export may differ.
            record.update(exporter="torchscript",
                          fallback_reason=f"kiln could not import the dynamo export: {exc}")
    if record["exporter"] == "torchscript":
        proto = _export_torchscript(torch, module, args, kwargs, names, axes,
                                    opset or _TORCHSCRIPT_OPSET, record)
        mod = from_onnx(proto, pins, **options)
    assert isinstance(mod, IRModule)
    return mod.with_attrs(**{ATTR_TORCH_EXPORT: record})


def _import_torch() -> Any:
    try:
        import torch  # optional: torch (the torch extra)
    except ImportError as exc:
        raise MissingDependencyError(
            "from_torch needs the 'torch' package, which is not installed here (pip install "
            "\"kiln-tensor[torch]\", or pip install torch onnxscript)") from exc
    return torch


def _forward_params(module: Any) -> list[str]:
    """The names of `module.forward`'s positional parameters ([] when unknown)."""
    try:
        return [p.name for p in inspect.signature(module.forward).parameters.values()
                if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        return []


def _split_inputs(torch: Any, example_inputs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """(positional, keyword) example inputs; UsageError for anything but tensors."""
    if isinstance(example_inputs, torch.Tensor):
        args: tuple[Any, ...] = (example_inputs,)
        kwargs: dict[str, Any] = {}
    elif isinstance(example_inputs, Mapping):
        args, kwargs = (), dict(example_inputs)
    elif isinstance(example_inputs, (tuple, list)):
        args, kwargs = tuple(example_inputs), {}
    else:
        raise UsageError("from_torch: example_inputs must be a tensor, a tuple of tensors or a "
                         f"dict of tensors, got {type(example_inputs).__name__}")
    for where, value in [*((f"example_inputs[{k}]", v) for k, v in enumerate(args)),
                         *((f"example_inputs[{k!r}]", v) for k, v in kwargs.items())]:
        if not isinstance(value, torch.Tensor):
            raise UsageError(f"from_torch: {where} is a {type(value).__name__}, not a tensor")
    return args, kwargs


def _input_names(module: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any],
                 given: Sequence[str] | None) -> list[str]:
    """The ONNX input names: `given`, else forward's parameter names, then the kwargs."""
    count = len(args) + len(kwargs)
    if given is not None:
        names = [str(n) for n in given]
        if len(names) != count or len(set(names)) != count:
            raise UsageError(f"from_torch: input_names {names} must be {count} distinct names, "
                             "one per example input")
        return names
    params = _forward_params(module)
    positional = params[:len(args)] if len(params) >= len(args) else \
        [f"input_{k}" for k in range(len(args))]
    return [*positional, *kwargs]


def _named_axes(dynamic_shapes: Any, names: Sequence[str]) -> dict[str, dict[int, str]]:
    """kiln's form `{input: {axis: "name"}}` of `dynamic_shapes`, either form (the
    docstring of `from_torch`). A `torch.export.Dim` gives its name; a hint without one
    (`Dim.DYNAMIC`, `Dim.AUTO`) is named after its place, `input_axis`."""
    if dynamic_shapes is None:
        return {}
    if isinstance(dynamic_shapes, (tuple, list)):
        if len(dynamic_shapes) != len(names):
            raise UsageError(f"from_torch: dynamic_shapes has {len(dynamic_shapes)} entries, "
                             f"the module takes {len(names)} inputs ({', '.join(names)})")
        dynamic_shapes = dict(zip(names, dynamic_shapes, strict=True))
    if not isinstance(dynamic_shapes, Mapping):
        raise UsageError("from_torch: dynamic_shapes must be a dict {input_name: {axis: name}} "
                         f"or torch.export's form, got {type(dynamic_shapes).__name__}")
    out: dict[str, dict[int, str]] = {}
    for name, axes in dynamic_shapes.items():
        if name not in names:
            raise UsageError(f"from_torch: dynamic_shapes names input {name!r}; the inputs are "
                             f"{', '.join(names)}")
        if axes is None:
            continue
        if isinstance(axes, (tuple, list)):  # torch.export's per-axis list
            axes = {k: d for k, d in enumerate(axes) if d is not None}
        if not isinstance(axes, Mapping):
            raise UsageError(f"from_torch: dynamic_shapes[{name!r}] must be a dict "
                             f"{{axis: name}}, got {type(axes).__name__}")
        out[name] = {}
        for axis, dim in axes.items():
            if isinstance(axis, bool) or not isinstance(axis, int):
                raise UsageError(f"from_torch: dynamic_shapes[{name!r}] has axis {axis!r}; "
                                 "axes are ints")
            label = dim if isinstance(dim, str) else getattr(dim, "__name__", None)
            if not isinstance(label, str) or not label.isidentifier():
                label = f"{name}_{axis}" if name.isidentifier() else f"input_{axis}"
            out[name][axis] = label
    return out


def _export_dynamo(torch: Any, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                   names: Sequence[str], axes: Mapping[str, Mapping[int, str]],
                   opset: int) -> Any:
    try:
        import onnxscript  # optional: onnxscript (the torch extra)  # noqa: F401  (the dynamo exporter's translator)
    except ImportError as exc:
        raise MissingDependencyError(
            "from_torch with the dynamo exporter needs the 'onnxscript' package, which is not "
            "installed here (pip install \"kiln-tensor[torch]\", or pip install onnxscript)"
        ) from exc
    # torch.export's structure: a tuple for positional inputs, a dict by keyword. The
    # axis names as strings: the exporter makes each dynamic and names it so.
    per_input = [dict(axes[n]) if n in axes else None for n in names]
    shapes: Any = None
    if axes:
        shapes = tuple(per_input) if not kwargs else \
            {**dict(zip(_forward_params(module)[:len(args)], per_input, strict=False)),
             **dict(zip(kwargs, per_input[len(args):], strict=True))}
    # The exporter prints its progress, and dumps the traced graph when it fails: the
    # reason kiln records is the exception's first line.
    with warnings.catch_warnings(), torch.no_grad(), \
            contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")  # deprecation chatter
        program = torch.onnx.export(module, args, kwargs=kwargs or None, input_names=list(names),
                                    dynamic_shapes=shapes, opset_version=opset, dynamo=True,
                                    verbose=False, report=False)
    if program is None:
        raise FrontendError("from_torch: the dynamo exporter returned no program")
    return program.model_proto


def _export_torchscript(torch: Any, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                        names: Sequence[str], axes: Mapping[str, Mapping[int, str]], opset: int,
                        record: Mapping[str, Any]) -> Any:
    import onnx  # optional: onnx (the compiler extra)

    buf = io.BytesIO()
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # tracer warnings about Python control flow
            torch.onnx.export(module, args, buf, kwargs=kwargs or None, input_names=list(names),
                              dynamic_axes={n: dict(a) for n, a in axes.items()},
                              opset_version=opset, dynamo=False)
    except Exception as exc:
        raise FrontendError(f"from_torch: the TorchScript exporter failed: {_first_line(exc)}"
                            + _because(record)) from exc
    return onnx.load_from_string(buf.getvalue())


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def _because(record: Mapping[str, Any]) -> str:
    reason = record.get("fallback_reason")
    return f" (tried after {reason})" if reason else ""
