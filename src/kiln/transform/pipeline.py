"""Named pipelines: what `kiln.compile(graph_pipeline=..., tensor_pipeline=...)` accepts.

A pipeline spec is one of:
- `"default"`: the target kind's own pipeline (kind attribute `"graph_pipeline"`
  or `"tensor_pipeline"`, itself any spec below) or else kiln's default for the level;
- `None` or `"none"`: no passes (the caller ran what it needed beforehand);
- a registered pipeline name (`register_pipeline`), or a pass list spelled by
  names, e.g. `"legalize-ops,dead-code-elimination"`;
- a `Pass`, a list of passes/names, or any callable `IRModule -> IRModule`.

Levels: "graph" pipelines run first, on the whole module, and normally end by
lowering every graph function to a PrimFunc; "tensor" pipelines run next, on
the lowered module.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from kiln._registry import Registry, RegistryError
from kiln.errors import CompileError
from kiln.transform.pass_base import ModulePassFromCallable, Pass, Sequential
from kiln.transform.registry import get_pass, list_passes, parse_passes

if TYPE_CHECKING:
    from kiln.target import Target

LEVELS = ("graph", "tensor")

PipelineFactory = Callable[[], Pass]
PipelineSpec = Any  # str | None | Pass | Sequence[Pass | str] | Callable[[IRModule], IRModule]

PIPELINES: Registry[PipelineFactory] = Registry("pipeline")


def _check_level(level: str) -> None:
    if level not in LEVELS:
        raise CompileError(f"pipeline level must be one of {LEVELS}, got {level!r}")


def register_pipeline(name: str, factory: PipelineFactory, *, level: str,
                      override: bool = False) -> None:
    """Register `factory() -> Pass` as the pipeline `name` of `level`."""
    _check_level(level)
    try:
        PIPELINES.register(f"{level}/{name}", factory, override=override)
    except RegistryError as err:
        raise CompileError(str(err)) from None


def list_pipelines(level: str) -> list[str]:
    """Names of the pipelines registered for `level`."""
    _check_level(level)
    return [n.split("/", 1)[1] for n in PIPELINES.names() if n.startswith(f"{level}/")]


# Whether the default graph pipeline keeps every convolution chain that pays in NCHW{b}c
# (kiln.transform.nchwc_layout; without, only chains with a depthwise convolution, on
# AVX2 and AVX-512); the "nchwc" pipeline always does.
NCHWC_BY_DEFAULT = False


def nchwc_graph_pipeline() -> Sequential:
    """The default graph pipeline with the `nchwc-layout` pass after block-convolutions."""
    return default_graph_pipeline(nchwc=True)


def default_graph_pipeline(nchwc: bool = NCHWC_BY_DEFAULT) -> Sequential:
    """Fuse quantized QDQ patterns into integer ops (before fold-constants turns dequantized
    weights into float constants) and keep the int8 activations between their dot-form
    convolutions in words of 4 channels (kiln.transform.quant_layout) and fuse their
    residual adds into the convolutions (kiln.transform.quant_residual), fold constants,
    recognize spelled-out GELU and layer norm (recognize-composites), fold BatchNorm,
    merge reshape/transpose chains into one copy and read transposed matmul operands in
    place (merge-copies), average-pool a 1x1 convolution's input rather than its output
    (pool-before-pointwise), pick the convolution and matrix-product kernels, compute
    attention by blocks of query rows where its scores pass the L2 cache (block-attention), give
    a decoder a companion computing only its last position's logits (last-position, after
    the passes that rewrite weights, before fusion so both share kernels), fuse
    elementwise chains, legalize operators, drop dead code, lower to PrimFuncs. BatchNorm
    folding must precede fusion, which would otherwise swallow the multiply/add it folds
    into the convolution. `nchwc`: keep convolution chains in the blocked activation
    layout (kiln.transform.nchwc_layout) between picking kernels and fusing; without it
    only chains holding a depthwise convolution are (on ISAs with 8 float32 lanes or more:
    `NchwcLayout(depthwise_only=True)`), and on AVX2 and AVX-512 every chain that pays
    (`pointwise_regions=True`)."""
    from kiln.transform.attention_blocks import (
        BlockAttention,  # lazy: kiln.transform.registry loads it on first use
    )
    from kiln.transform.composite_ops import (
        RecognizeComposites,  # lazy: kiln.transform.registry loads it on first use
    )
    from kiln.transform.conv_blocking import (
        BlockConvolutions,  # lazy: kiln.transform.registry loads it on first use
    )
    from kiln.transform.dead_code import (
        DeadCodeElimination,  # lazy: kiln.transform.registry loads it on first use
    )
    from kiln.transform.fold_batchnorm import (
        FoldBatchNorm,  # lazy: kiln.transform.registry loads it on first use
    )
    from kiln.transform.fold_constants import (
        FoldConstants,  # lazy: kiln.transform.registry loads it on first use
    )
    from kiln.transform.fuse_ops import (
        FuseOps,  # lazy: kiln.transform.registry loads it on first use
    )
    from kiln.transform.last_position import (
        LastPosition,  # lazy: kiln.transform.registry loads it on first use
    )
    from kiln.transform.legalize_ops import (
        LegalizeOps,  # lazy: kiln.transform.registry loads it on first use
    )
    from kiln.transform.lower_graph import (
        LowerGraphToTensor,  # lazy: kiln.transform.registry loads it on first use
    )
    from kiln.transform.matmul_blocking import (
        BlockMatmuls,  # lazy: kiln.transform.registry loads it on first use
    )
    from kiln.transform.merge_copies import (
        MergeCopies,  # lazy: kiln.transform.registry loads it on first use
    )
    from kiln.transform.pool_before_pointwise import (
        PoolBeforePointwise,  # lazy: kiln.transform.registry loads it on first use
    )
    from kiln.transform.quantize_ops import (
        QuantizeOps,  # lazy: kiln.transform.registry loads it on first use
    )
    from kiln.transform.use_cblas import (  # lazy: kiln.transform.registry loads it on first use
        UseCBLAS,
        target_wants_cblas,
    )

    # On a target with libs: ["cblas"], matrix products call CBLAS (kiln.ops.cblas).
    blas = [UseCBLAS()] if target_wants_cblas() else []
    from kiln.transform.nchwc_layout import (
        NchwcLayout,  # lazy: kiln.transform.registry loads it on first use
    )

    # without `nchwc`, only regions with a depthwise convolution (MobileNet-style networks),
    # and on AVX2 and AVX-512 every region that pays (`pointwise_regions`)
    layout = [NchwcLayout()] if nchwc else [NchwcLayout(depthwise_only=True,
                                                        pointwise_regions=True)]
    from kiln.transform.quant_layout import (
        QuantLayout,  # lazy: kiln.transform.registry loads it on first use
    )
    from kiln.transform.quant_residual import (
        QuantResidual,  # lazy: kiln.transform.registry loads it on first use
    )

    return Sequential([QuantizeOps(), QuantLayout(), QuantResidual(), FoldConstants(),
                       RecognizeComposites(), FoldBatchNorm(), MergeCopies(),
                       PoolBeforePointwise(), *blas, BlockConvolutions(), *layout,
                       BlockMatmuls(), BlockAttention(), LastPosition(), FuseOps(),
                       LegalizeOps(), DeadCodeElimination(), LowerGraphToTensor()],
                      name="graph-default")


def default_tensor_pipeline() -> Sequential:
    """Simplify tensor-level arithmetic, split loops at the constants their index is
    compared with (a concatenation's inputs: kiln.transform.partition_loops), collapse
    nests of contiguous elementwise loops into one loop (kiln.transform.flatten_loops), put
    reductions' output loops innermost, run
    independent loop iterations in parallel, spell float32 exp/tanh/sigmoid/erf as
    arithmetic the vectorizer widens (on CPU targets; kiln.transform.expand_math), then
    decide which lane loops become vector code (kiln.transform.vectorize_loops)."""
    from kiln.transform.expand_math import (
        ExpandMath,  # lazy: kiln.transform.registry loads it on first use
    )
    from kiln.transform.flatten_loops import (
        FlattenLoops,  # lazy: kiln.transform.registry loads it on first use
    )
    from kiln.transform.interchange_reductions import (
        InterchangeReductions,  # lazy: kiln.transform.registry loads it on first use
    )
    from kiln.transform.parallelize import (
        Parallelize,  # lazy: kiln.transform.registry loads it on first use
    )
    from kiln.transform.partition_loops import (
        PartitionLoops,  # lazy: kiln.transform.registry loads it on first use
    )
    from kiln.transform.simplify import (
        Simplify,  # lazy: kiln.transform.registry loads it on first use
    )
    from kiln.transform.vectorize_loops import (
        VectorizeLoops,  # lazy: kiln.transform.registry loads it on first use
    )

    return Sequential([Simplify(), PartitionLoops(), FlattenLoops(), InterchangeReductions(),
                       Parallelize(), ExpandMath(), VectorizeLoops()],
                      name="tensor-default")


def gpu_graph_pipeline() -> Sequential:
    """The default graph pipeline without the CPU convolution kernels (BlockConvolutions
    and CBLAS pick register-tiled CPU kernels with heap scratch buffers)."""
    from kiln.transform.dead_code import (
        DeadCodeElimination,  # lazy: kiln.transform.registry loads it on first use
    )
    from kiln.transform.fold_batchnorm import (
        FoldBatchNorm,  # lazy: kiln.transform.registry loads it on first use
    )
    from kiln.transform.fold_constants import (
        FoldConstants,  # lazy: kiln.transform.registry loads it on first use
    )
    from kiln.transform.fuse_ops import (
        FuseOps,  # lazy: kiln.transform.registry loads it on first use
    )
    from kiln.transform.legalize_ops import (
        LegalizeOps,  # lazy: kiln.transform.registry loads it on first use
    )
    from kiln.transform.lower_graph import (
        LowerGraphToTensor,  # lazy: kiln.transform.registry loads it on first use
    )

    return Sequential([FoldConstants(), FoldBatchNorm(), FuseOps(), LegalizeOps(),
                       DeadCodeElimination(), LowerGraphToTensor()], name="graph-gpu")


def gpu_tensor_pipeline() -> Sequential:
    """Simplify, mark every independent loop whatever its work (a GPU thread is cheap),
    then bind loops to blocks and threads (kiln.transform.gpu_schedule). Unlike the CPU
    pipeline, reductions keep their output loops outermost: each output element is then
    one thread's (a register accumulator), instead of a row of accumulators per thread."""
    from kiln.transform.gpu_schedule import (
        BindGpuThreads,  # lazy: kiln.transform.registry loads it on first use
    )
    from kiln.transform.parallelize import (
        Parallelize,  # lazy: kiln.transform.registry loads it on first use
    )
    from kiln.transform.simplify import (
        Simplify,  # lazy: kiln.transform.registry loads it on first use
    )

    return Sequential([Simplify(), Parallelize(min_work=1), BindGpuThreads()],
                      name="tensor-gpu")


def _empty(level: str) -> Callable[[], Pass]:
    return lambda: Sequential([], name=f"{level}-none")


register_pipeline("default", default_graph_pipeline, level="graph")
register_pipeline("default", default_tensor_pipeline, level="tensor")
register_pipeline("nchwc", nchwc_graph_pipeline, level="graph")
register_pipeline("gpu", gpu_graph_pipeline, level="graph")
register_pipeline("gpu", gpu_tensor_pipeline, level="tensor")
for _level in LEVELS:
    register_pipeline("none", _empty(_level), level=_level)


def get_pipeline(spec: PipelineSpec = "default", level: str = "graph", *,
                 target: Target | None = None) -> Pass:
    """The pass that `spec` names at `level` (see the module docstring)."""
    _check_level(level)
    if spec is None:
        return Sequential([], name=f"{level}-none")
    if isinstance(spec, Pass):
        return spec
    if isinstance(spec, str):
        if spec == "default" and target is not None:
            own = target.kind.get_attr(f"{level}_pipeline")
            if own is not None and own != "default":
                return get_pipeline(own, level)
        key = f"{level}/{spec}"
        if key in PIPELINES:
            return _call_factory(spec, PIPELINES.get(key))
        if any(ch in spec for ch in ",{") or spec in _pass_names():
            return Sequential(parse_passes(spec), name=spec)
        known = ", ".join(list_pipelines(level))
        raise CompileError(
            f"unknown {level} pipeline '{spec}'. Pipelines: {known}; or give a Pass, a "
            "callable IRModule -> IRModule, None, or pass names such as 'simplify'")
    if isinstance(spec, Sequence):
        return Sequential([get_pass(p) if isinstance(p, str) else p for p in spec],
                          name=f"{level}-custom")
    if callable(spec):
        return ModulePassFromCallable(spec)
    raise CompileError(
        f"{level}_pipeline must be 'default', None, a pipeline name, a Pass or a callable "
        f"IRModule -> IRModule; got {type(spec).__name__} {spec!r}")


def _call_factory(name: str, factory: PipelineFactory) -> Pass:
    p = factory()
    if not isinstance(p, Pass):
        raise CompileError(f"pipeline factory '{name}' returned {type(p).__name__}, not a Pass")
    return p


def _pass_names() -> list[str]:
    return list_passes()

