"""The per-microarchitecture knobs of kiln's kernel rules, in one place.

Most of a kernel's choices follow from the ISA's facts (lanes, registers, caches, FMA,
dot products). The rest are rules measured on one kind of CPU and kept only where they
were measured: they live here, named for what they decide, keyed by the vector width
they were measured at, and reach the kernels as `ISA.profile` (kiln.target.isa). A
vector width with no entry takes `UNMEASURED`: none of the measured rules.
docs/performance.md holds the measurements behind each.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KernelProfile:
    """The knobs of the kernel rules on one vector width (see the module docstring)."""

    #: The blocked convolution copies an unpadded strided 1x1 layer's input values before
    #: it reads them, even where the input is within the L2; runs strided KxK layers band
    #: by band; K-blocks by weight size and small images; the NCHWc pointwise kernel
    #: K-blocks as the blocked kernel does; the GEMM convolution narrows its row tiles
    #: on narrow outputs (kiln.kernels.conv: direct, nchwc, gemm).
    avx2_conv_rules: bool
    #: The row-tiled convolution narrows its row tiles to a divisor of a narrow output's
    #: channels (kiln.kernels.conv.rows).
    narrow_conv_rows: bool
    #: The blocked convolution may K-block its sums (kiln.kernels.conv.direct).
    conv_k_blocking: bool
    #: The fewest row tiles that must read a 1x1 layer's panel for it to be copied to
    #: the stack first (kiln.kernels.conv.gemm.copies_panels); None: never copied.
    panel_copy_readers: int | None
    #: The int8 convolution keeps its positions tile unless the transposed one is
    #: estimated this much cheaper: a margin for the cost estimate's error
    #: (kiln.kernels.int8.conv_tile).
    int8_transpose_gain: float = 0.92
    #: The same where one instruction accumulates (VNNI, kiln.kernels.int8.dot.
    #: EXACT_FAMILIES); 0: `int8_transpose_gain`. Above 1 the transposed tile is taken
    #: where it is estimated a little dearer: the estimate counts a byte store per
    #: output where that tile stores words of 4 channels.
    int8_vnni_transpose_gain: float = 0.0
    #: The fewest accumulators a positions tile of the int8 convolution on VNNI holds
    #: (its width, kiln.kernels.int8.dot.tile_cols_for): a narrower tile's dot products
    #: wait on one another's latency.
    int8_min_accumulators: int = 0
    #: The widest positions tile of the int8 convolution on VNNI, in vectors
    #: (kiln.kernels.int8.dot.position_tile_cols; 0: as many as `dot.tile_cols`): 2 or 3
    #: vectors hold 8 rows, a multiple of 4, so every positions tile stores its output
    #: as words of 4 channels and the activations between convolutions stay in them
    #: (kiln.transform.quant_layout); 4 vectors hold 6 rows, which would not.
    int8_position_vectors: int = 0
    #: The fewest accumulators a tile of the bfloat16 NCHWc convolution holds on a layer
    #: that is not 1x1 (kiln.kernels.conv.bf16.bf16_tile): `vdpbf16ps` waits longer on
    #: its accumulator than a float32 multiply-add, and the float32 rule's 2 vectors x 6
    #: positions leave the sums waiting on it.
    bf16_min_accumulators: int = 0
    #: The fewest output channels of a 3x3 layer the rule takes to float32 Winograd on a
    #: `precision=bf16` target (kiln.kernels.conv.winograd): a narrower one (DenseNet's
    #: 128 -> 32) runs faster on the bfloat16 direct kernel, whose products Winograd's
    #: input transform does not share out over enough output channels.
    bf16_winograd_min_outputs: int = 0
    #: The fewest output positions (height x width) of a 3x3 layer the rule takes to
    #: float32 Winograd on a `precision=bf16` target, unless it has
    #: `bf16_winograd_wide_channels` input and output channels: on smaller images
    #: (ResNet's 28x28 and 14x14 stages, GoogLeNet's and SqueezeNet's layers past their
    #: stems) the bfloat16 direct kernel's tiles of 20+ accumulators run faster than
    #: Winograd's transforms and products, which VGG's 512-channel layers share out
    #: over enough channels to stay level (at a float32 layer's lower error).
    bf16_winograd_min_positions: int = 0
    bf16_winograd_wide_channels: int = 0


#: The rules measured on AVX2 (256-bit vectors) and AVX-512 (512-bit vectors).
PROFILES: dict[int, KernelProfile] = {
    256: KernelProfile(avx2_conv_rules=True, narrow_conv_rows=True, conv_k_blocking=True,
                       panel_copy_readers=2),
    512: KernelProfile(avx2_conv_rules=False, narrow_conv_rows=True, conv_k_blocking=True,
                       panel_copy_readers=40, int8_vnni_transpose_gain=1.02,
                       int8_min_accumulators=16,
                       int8_position_vectors=3,
                       bf16_min_accumulators=20,
                       bf16_winograd_min_outputs=64,
                       bf16_winograd_min_positions=56 * 56,
                       bf16_winograd_wide_channels=512),
}
#: Vector widths none of the rules was measured on (NEON, SSE, no vectors).
UNMEASURED = KernelProfile(avx2_conv_rules=False, narrow_conv_rows=False,
                           conv_k_blocking=False, panel_copy_readers=None)


def profile_for(vector_bits: int) -> KernelProfile:
    """The kernel profile of `vector_bits`-wide vectors."""
    return PROFILES.get(vector_bits, UNMEASURED)
