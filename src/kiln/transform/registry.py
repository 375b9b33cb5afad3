"""The pass registry: pass name -> pass class, so pipelines can be spelled by names.

    parse_passes("legalize-ops,dead-code-elimination,lower-graph-to-tensor{alignment=128}")

A spec is a comma-separated list of pass names, each optionally followed by
`{key=value ...}` options (space- or comma-separated inside the braces); values
are converted to the type of the pass's dataclass field.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from typing import Any

from kiln._registry import Registry, RegistryError
from kiln.errors import CompileError
from kiln.transform.pass_base import Pass

PASSES: Registry[type[Pass]] = Registry("pass")
for _name, _path in {
    "quantize-ops": "kiln.transform.quantize_ops:QuantizeOps",
    "quant-layout": "kiln.transform.quant_layout:QuantLayout",
    "quant-residual": "kiln.transform.quant_residual:QuantResidual",
    "fold-constants": "kiln.transform.fold_constants:FoldConstants",
    "fold-batchnorm": "kiln.transform.fold_batchnorm:FoldBatchNorm",
    "merge-copies": "kiln.transform.merge_copies:MergeCopies",
    "pool-before-pointwise": "kiln.transform.pool_before_pointwise:PoolBeforePointwise",
    "recognize-composites": "kiln.transform.composite_ops:RecognizeComposites",
    "block-convolutions": "kiln.transform.conv_blocking:BlockConvolutions",
    "nchwc-layout": "kiln.transform.nchwc_layout:NchwcLayout",
    "block-matmuls": "kiln.transform.matmul_blocking:BlockMatmuls",
    "block-attention": "kiln.transform.attention_blocks:BlockAttention",
    "last-position": "kiln.transform.last_position:LastPosition",
    "use-cblas": "kiln.transform.use_cblas:UseCBLAS",
    "fuse-ops": "kiln.transform.fuse_ops:FuseOps",
    "legalize-ops": "kiln.transform.legalize_ops:LegalizeOps",
    "dead-code-elimination": "kiln.transform.dead_code:DeadCodeElimination",
    "lower-graph-to-tensor": "kiln.transform.lower_graph:LowerGraphToTensor",
    "simplify": "kiln.transform.simplify:Simplify",
    "partition-loops": "kiln.transform.partition_loops:PartitionLoops",
    "flatten-loops": "kiln.transform.flatten_loops:FlattenLoops",
    "interchange-reductions": "kiln.transform.interchange_reductions:InterchangeReductions",
    "parallelize": "kiln.transform.parallelize:Parallelize",
    "expand-math": "kiln.transform.expand_math:ExpandMath",
    "vectorize-loops": "kiln.transform.vectorize_loops:VectorizeLoops",
    "bind-gpu-threads": "kiln.transform.gpu_schedule:BindGpuThreads",
    "profile-kernel-calls": "kiln.transform.profile:ProfileKernelCalls",
    "outline-parallel-loops": "kiln.transform.outline:OutlineParallelLoops",
}.items():
    PASSES.register(_name, lazy=_path)


def register_pass(cls: type[Pass], *, override: bool = False) -> type[Pass]:
    """Register a pass class under its `name`; usable as a class decorator."""
    if not (isinstance(cls, type) and issubclass(cls, Pass)):
        raise CompileError(f"register_pass expects a Pass subclass, got {cls!r}")
    if not cls.name:
        raise CompileError(f"pass class {cls.__name__} has no `name`")
    try:
        PASSES.register(cls.name, cls, override=override)
    except RegistryError as err:
        raise CompileError(str(err)) from None
    return cls


def get_pass(name: str, **options: Any) -> Pass:
    """An instance of the pass registered as `name`, with `options`."""
    cls = _pass_class(name)
    try:
        return cls(**options)
    except TypeError as exc:
        fields = list(_field_types(cls))
        raise CompileError(
            f"bad options {options!r} for pass '{name}': {exc}. "
            f"Options: {', '.join(fields) or '(none)'}") from None


def list_passes() -> list[str]:
    """Names of every registered pass."""
    return PASSES.names()


_ITEM = re.compile(r"\s*([A-Za-z0-9_.-]+)\s*(?:\{([^{}]*)\})?\s*(?:,|$)")


def parse_passes(spec: str) -> list[Pass]:
    """Pass instances from a textual pipeline spec (see the module docstring)."""
    passes: list[Pass] = []
    pos = 0
    text = spec.strip()
    while pos < len(text):
        m = _ITEM.match(text, pos)
        if m is None or m.end() == pos:
            raise CompileError(
                f"cannot parse pipeline spec {spec!r} at offset {pos}: expected "
                "'name' or 'name{key=value ...}', separated by commas")
        name, opts = m.group(1), m.group(2)
        passes.append(get_pass(name, **_parse_options(name, opts or "")))
        pos = m.end()
    return passes


def _pass_class(name: str) -> type[Pass]:
    """The class registered as `name`; CompileError (listing the known ones) if none."""
    try:
        return PASSES.get(name)
    except RegistryError as err:
        raise CompileError(str(err)) from None


def _parse_options(name: str, text: str) -> dict[str, Any]:
    types = _field_types(_pass_class(name))
    out: dict[str, Any] = {}
    for item in re.split(r"[\s,]+", text.strip()):
        if not item:
            continue
        key, eq, raw = item.partition("=")
        if not eq:
            raise CompileError(f"pass '{name}': option {item!r} must look like key=value")
        if key not in types:
            raise CompileError(
                f"pass '{name}' has no option '{key}'. Options: {', '.join(types) or '(none)'}")
        out[key] = _convert(name, key, raw, types[key])
    return out


def _field_types(cls: type) -> dict[str, Any]:
    if not dataclasses.is_dataclass(cls):
        return {}
    hints = typing.get_type_hints(cls)
    return {f.name: hints.get(f.name, str) for f in dataclasses.fields(cls)}


def _convert(name: str, key: str, raw: str, typ: Any) -> Any:
    if typ is bool:
        low = raw.lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise CompileError(f"pass '{name}': option '{key}': not a boolean: {raw!r}")
    try:
        if typ is int:
            return int(raw)
        if typ is float:
            return float(raw)
        return raw
    except ValueError as exc:
        raise CompileError(f"pass '{name}': option '{key}': {exc}") from None
