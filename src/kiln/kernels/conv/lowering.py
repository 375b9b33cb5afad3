"""The lowerings of the convolution ops whose kernel a family of kiln.kernels.conv builds
(`conv2d_blocked`, `conv2d_depthwise`, `conv2d_rows`, `conv2d_nchwc`, `conv2d_gemm`,
`conv2d_group_gemm`: kiln.ops.conv_direct; `conv2d_winograd`, `conv2d_winograd_nchwc`:
kiln.ops.winograd), registered by op name in kiln.kernels.lowering.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kiln.ir import graph as g
from kiln.ir.tensor import PrimFunc
from kiln.kernels.registry import build_call, family_of
from kiln.ops import conv_direct as cd
from kiln.ops import te
from kiln.ops import winograd as wg
from kiln.target.isa import ISA


@dataclass(frozen=True)
class FamilyLowering:
    """The kernel of a float32 call of `op`, built by the kernel family that lowers `op`
    (kiln.kernels.registry.family_of) with the parallel split, K blocking and K
    unroll the call records; the batch may be symbolic (channels and image sizes
    static). `weights`: the dtypes its weight (the second argument) may have, float32
    or, for a family that widens a narrower one as it loads it, that one too."""

    op: str
    weights: tuple[str, ...] = ("float32",)
    #: What the group key of a kernel over run-time sizes leaves to `width_key`
    #: (kiln.transform.fuse_ops): the NCHW{b}c call's output channel count, which its
    #: key holds unless the kernel takes it at run time.
    width_attrs: tuple[str, ...] = ()
    supports_symbolic = True
    fuses_producers = False

    def builds(self, call: g.Call) -> bool:
        """Every call: the family decides when it builds (`lower_fused`)."""
        return True

    def lower_fused(self, params: Sequence[te.Tensor], args: Sequence[te.Tensor],
                    attrs: Mapping[str, Any], anchor: te.Tensor | None,
                    result: te.Tensor | None, name: str, isa: ISA) -> PrimFunc | None:
        """The family's kernel (see kiln.kernels.lowering.Lowering.lower_fused)."""
        if args[1].dtype not in self.weights or any(
                t.dtype != "float32" for t in (args[0], *params) if t is not args[1]):
            return None
        return build_call(family_of(self.op), params, args, attrs, anchor, result, isa)

    def width_key(self, call: g.Call, isa: ISA) -> Hashable | None:
        """The family's key of a kernel of `call` taking its input channel count at run
        time (kiln.kernels.conv.run_time_width; its `width_key`), or None."""
        key = getattr(family_of(self.op), "width_key", None)
        return key(call, isa) if key is not None else None


BLOCKED = FamilyLowering(cd.BLOCKED)
DEPTHWISE = FamilyLowering(cd.DEPTHWISE)
ROWS = FamilyLowering(cd.ROWS)
NCHWC = FamilyLowering(cd.NCHWC, width_attrs=("channels",))
GEMM = FamilyLowering(cd.GEMM)
GROUP_GEMM = FamilyLowering(cd.GROUP_GEMM)
WINOGRAD = FamilyLowering(wg.WINOGRAD)
# float16 panels on a precision=bf16 target (kiln.kernels.conv.winograd_nchwc.weight_dtype)
WINOGRAD_NCHWC = FamilyLowering(wg.WINOGRAD_NCHWC, ("float32", "float16"))
