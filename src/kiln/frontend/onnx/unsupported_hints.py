"""What to do about an operator kiln does not import: the lines the refusal ends with.

Every refusal points to docs/ops.md, "Adding an operator". onnxruntime's contrib
operators (domain com.microsoft) that its transformer optimizer
(`onnxruntime.transformers.optimizer.optimize_model`) writes in place of standard
subgraphs also name the way to avoid them: import the model as exported, or run
that optimizer with the `FusionOptions` field that keeps the standard ops. Contrib
ops kiln does import (the QLinear* family, QGemm, DynamicQuantizeLSTM) never reach
here: the refusal lists only ops without a converter.
"""

from __future__ import annotations

from collections.abc import Iterable

MS = "com.microsoft."
DOCS = 'docs/ops.md, "Adding an operator"'

# Contrib op -> the FusionOptions field of onnxruntime.transformers.fusion_options that,
# set False, keeps the standard ops it replaces (True for enable_gelu_approximation,
# which writes FastGelu when on; it is off by default).
FUSION_OPTIONS = {
    "Gelu": "enable_gelu=False",
    "FastGelu": "enable_gelu=False, enable_gelu_approximation=False",
    "BiasGelu": "enable_bias_gelu=False",
    "GemmFastGelu": "enable_gemm_fast_gelu=False",
    "QuickGelu": "enable_gelu=False",
    "SkipLayerNormalization": "enable_skip_layer_norm=False, enable_bias_skip_layer_norm=False",
    "SkipSimplifiedLayerNormalization": "enable_skip_layer_norm=False",
    "SimplifiedLayerNormalization": "enable_layer_norm=False",
    "EmbedLayerNormalization": "enable_embed_layer_norm=False",
    "Attention": "enable_attention=False",
    "MultiHeadAttention": "enable_attention=False",
    "PackedAttention": "enable_attention=False",
    "RotaryEmbedding": "enable_rotary_embeddings=False",
    "BiasAdd": "enable_bias_add=False",
    "BiasSplitGelu": "enable_bias_splitgelu=False",
    "GroupNorm": "enable_group_norm=False",
    "SkipGroupNorm": "enable_skip_group_norm=False",
    "NhwcConv": "enable_nhwc_conv=False",
}

# Contrib ops that onnxruntime's own graph optimizer writes (an InferenceSession's
# optimized_model_filepath at ORT_ENABLE_EXTENDED or ALL), not the transformer optimizer.
SESSION_FUSIONS = ("FusedMatMul", "FusedConv", "FusedGemm", "BiasSoftmax",
                   "BiasDropout", "MatMulIntegerToFloat", "NhwcMaxPool")


def next_steps(op_keys: Iterable[str]) -> list[str]:
    """The lines after the list of unsupported ops (`op_keys` as unsupported_ops
    names them: "Op" or "domain.Op")."""
    keys = sorted(op_keys)
    fused = [k for k in keys if k.startswith(MS) and k[len(MS):] in FUSION_OPTIONS]
    session = [k for k in keys if k.startswith(MS) and k[len(MS):] in SESSION_FUSIONS]
    lines = [f"to add an operator to kiln: {DOCS}"]
    if fused:
        fields = sorted({f for k in fused for f in FUSION_OPTIONS[k[len(MS):]].split(", ")})
        lines.append(
            f"{', '.join(fused)}: written by onnxruntime's transformer optimizer "
            "(onnxruntime.transformers.optimizer.optimize_model); give kiln the model as "
            "exported, before that optimizer, or keep standard ops with "
            f"FusionOptions {', '.join(fields)} (optimization_options=)")
    if session:
        lines.append(
            f"{', '.join(session)}: written by onnxruntime's graph optimizer (a model saved "
            "through SessionOptions.optimized_model_filepath); give kiln the model as "
            "exported, or save it at GraphOptimizationLevel.ORT_ENABLE_BASIC")
    return lines
