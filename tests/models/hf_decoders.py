"""Hugging Face `transformers` decoders exported to ONNX with every axis dynamic (issue 23).

Each `Decoder` builds a model from its published configuration with random weights
(`torch.manual_seed`, never `from_pretrained`: no network), wraps it in a module whose
`forward` takes and returns plain tensors, and exports it with either exporter:

- `"torchscript"`: `torch.onnx.export(..., dynamo=False, dynamic_axes=...)`, opset 17;
- `"dynamo"`: `torch.onnx.export(..., dynamo=True, dynamic_shapes=...)`.

Dimension names: `batch`, `seq` (the decoder's new tokens), `past_seq` (tokens already
in the key/value cache) and `enc_seq` (the encoder's output length). `layers` overrides
the number of decoder layers (the CI tests use 2: every op pattern is kept, one layer
repeated fewer times) and `vocab` the vocabulary (the CI tests use a small one: the
embedding table and the LM head keep their ops and width, with far fewer rows and
columns); `None` keeps the published value.

`feeds(decoder, sizes, seed)` draws inputs for given dimension values.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import hf_export
import numpy as np
import onnx

EXPORTERS = hf_export.EXPORTERS


@dataclass(frozen=True)
class Input:
    """One model input: `kind` is "ids" (int64 token ids below `vocab`), "mask" (int64
    ones) or "float" (standard normal float32); `dims` names or fixes each axis."""

    name: str
    dims: tuple[str | int, ...]
    kind: str
    vocab: int = 0


@dataclass(frozen=True)
class Decoder:
    """A model to export: `build()` returns the wrapped torch module (weights drawn after
    `torch.manual_seed(0)`), `inputs` its positional inputs, `outputs` its result names."""

    name: str
    build: Callable[[], Any]
    inputs: tuple[Input, ...]
    outputs: tuple[str, ...]


def _eager(config: Any) -> Any:
    # The attention written out in ops (MatMul, Softmax) rather than a fused SDPA call:
    # what both exporters trace the same way.
    config._attn_implementation = "eager"
    return config


def _set_vocab(config: Any, vocab: int | None) -> None:
    """A vocabulary of `vocab` tokens (None: the published one); special token ids past
    it (Whisper's padding index is 50257) move to its last token."""
    if vocab is None:
        return
    config.vocab_size = vocab
    for key in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"):
        if isinstance(getattr(config, key, None), int) and getattr(config, key) >= vocab:
            setattr(config, key, vocab - 1)


def _wrapped(model: Any, call: Callable[..., Any]) -> Any:
    """A torch module whose `forward(*inputs)` is `call(model, *inputs)`: plain tensors
    in and out, as both exporters want them."""
    import torch

    class Wrapped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *inputs: Any) -> Any:
            return call(self.model, *inputs)

    return Wrapped()


def _cache(tensors: Sequence[Any], layers: int) -> Any:
    """A DynamicCache holding `tensors` as (key_0, value_0, key_1, value_1, ...)."""
    from transformers import DynamicCache

    return DynamicCache(ddp_cache_data=[(tensors[2 * i], tensors[2 * i + 1])
                                        for i in range(layers)])


def _flat_cache(cache: Any) -> tuple[Any, ...]:
    out: list[Any] = []
    for layer in cache.layers:
        out += [layer.keys, layer.values]
    return tuple(out)


def _cross_cache(self_kv: Sequence[Any], layers: int) -> Any:
    """An encoder-decoder cache: the self-attention one holding `self_kv` (as `_cache`),
    the cross-attention one empty, so every step computes it from the encoder's states."""
    from transformers import DynamicCache, EncoderDecoderCache

    return EncoderDecoderCache(_cache(self_kv, layers), DynamicCache())


def _past_inputs(layers: int, heads: int, head_dim: int) -> tuple[Input, ...]:
    """Each layer's `past_key_i`/`past_value_i` `[batch, heads, past_seq, head_dim]`."""
    return tuple(Input(f"past_{kind}_{i}", ("batch", heads, "past_seq", head_dim), "float")
                 for i in range(layers) for kind in ("key", "value"))


def _present_names(layers: int) -> tuple[str, ...]:
    return tuple(f"present_{kind}_{i}" for i in range(layers) for kind in ("key", "value"))


def gpt2(layers: int | None = None, past: bool = False, vocab: int | None = None,
         width: tuple[int, int] | None = None, eager: bool = True) -> Decoder:
    """GPT-2 (the published 124M configuration, `GPT2Config()` defaults) with its LM head.

    Without a cache the inputs are `input_ids` and `attention_mask` `[batch, seq]`. With
    `past=True` they are `input_ids` and each layer's `past_key_i`/`past_value_i`
    `[batch, 12, past_seq, 64]`, and the model also returns the present key/values
    `[batch, 12, past_seq + seq, 64]`. `width=(n_embd, n_head)` overrides the published
    (768, 12); `eager=False` keeps transformers' default attention (SDPA, which the
    dynamo exporter writes as reshapes to `[-1, past_seq + seq, head_dim]`)."""
    import torch
    import transformers

    config = transformers.GPT2Config()
    if eager:
        _eager(config)
    if layers is not None:
        config.n_layer = layers
    if width is not None:
        config.n_embd, config.n_head = width
    _set_vocab(config, vocab)
    n_layer, heads = config.n_layer, config.n_head
    head_dim = config.n_embd // heads

    def no_cache(model: Any, input_ids: Any, attention_mask: Any) -> Any:
        return model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits

    def with_cache(model: Any, input_ids: Any, *past: Any) -> Any:
        out = model(input_ids=input_ids, past_key_values=_cache(past, n_layer), use_cache=True)
        return (out.logits, *_flat_cache(out.past_key_values))

    def build() -> Any:
        torch.manual_seed(0)
        model = transformers.GPT2LMHeadModel(config).eval()
        return _wrapped(model, with_cache if past else no_cache)

    ids = Input("input_ids", ("batch", "seq"), "ids", config.vocab_size)
    if not past:
        return Decoder("gpt2", build, (ids, Input("attention_mask", ("batch", "seq"), "mask")),
                       ("logits",))
    return Decoder("gpt2_past", build, (ids, *_past_inputs(n_layer, heads, head_dim)),
                   ("logits", *_present_names(n_layer)))


def t5_decoder(layers: int | None = None, vocab: int | None = None, past: bool = False,
               width: tuple[int, int] | None = None) -> Decoder:
    """The decoder stack of T5-small (`T5Config()` defaults are t5-small: d_model 512,
    6 layers, 8 heads, relative position buckets) over `encoder_hidden_states`
    `[batch, enc_seq, 512]`; returns the last hidden state.

    With `past=True` the inputs are `input_ids`, `encoder_hidden_states` and each
    layer's self-attention `past_key_i`/`past_value_i` `[batch, heads, past_seq, d_kv]`,
    and the model returns the LM head's logits and the present self-attention
    key/values; the cross-attention keys/values are computed from the encoder's states
    at every step (an empty cross-attention cache), so one graph serves the first step
    and the next. `width=(d_model, heads)` overrides (512, 8) (d_kv = d_model / heads,
    the FFN twice d_model)."""
    import torch
    import transformers

    config = _eager(transformers.T5Config())
    config.is_decoder, config.use_cache = True, past
    if layers is not None:
        config.num_decoder_layers = layers
    if width is not None:
        config.d_model, config.num_heads = width
        config.d_kv, config.d_ff = width[0] // width[1], 2 * width[0]
    _set_vocab(config, vocab)
    n_layer, heads, d_kv = config.num_decoder_layers, config.num_heads, config.d_kv

    def call(model: Any, input_ids: Any, encoder_hidden_states: Any) -> Any:
        return model(input_ids=input_ids, encoder_hidden_states=encoder_hidden_states,
                     use_cache=False).last_hidden_state

    def with_cache(model: Any, input_ids: Any, encoder_hidden_states: Any, *kv: Any) -> Any:
        out = model(encoder_outputs=(encoder_hidden_states,), decoder_input_ids=input_ids,
                    past_key_values=_cross_cache(kv, n_layer), use_cache=True)
        return (out.logits, *_flat_cache(out.past_key_values.self_attention_cache))

    def build() -> Any:
        torch.manual_seed(0)
        model = transformers.T5ForConditionalGeneration(config).eval()
        return _wrapped(model, with_cache) if past else _wrapped(model.get_decoder(), call)

    ids = Input("input_ids", ("batch", "seq"), "ids", config.vocab_size)
    states = Input("encoder_hidden_states", ("batch", "enc_seq", config.d_model), "float")
    if not past:
        return Decoder("t5_decoder", build, (ids, states), ("last_hidden_state",))
    return Decoder("t5_decoder_past", build, (ids, states, *_past_inputs(n_layer, heads, d_kv)),
                   ("logits", *_present_names(n_layer)))


def whisper_decoder(layers: int | None = None, vocab: int | None = None, past: bool = False,
                    width: tuple[int, int] | None = None) -> Decoder:
    """The decoder of Whisper-tiny (its published hyper-parameters: d_model 384, 4 layers,
    6 heads, FFN 1536, vocabulary 51865, 448 positions) over `encoder_hidden_states`
    `[batch, enc_seq, 384]`, with the decoder's `attention_mask` `[batch, seq]`; returns
    the last hidden state.

    With `past=True` the inputs are `input_ids`, `encoder_hidden_states` and each
    layer's self-attention `past_key_i`/`past_value_i` `[batch, heads, past_seq,
    head_dim]` (no mask: the positions start at `past_seq`), and the model returns the
    logits (the output projection tied to the token embedding) and the present
    self-attention key/values; cross-attention is recomputed from the encoder's states
    at every step, as in `t5_decoder`. `width=(d_model, heads)` overrides (384, 6) (the
    FFN twice d_model)."""
    import torch
    import transformers

    d_model, heads = width or (384, 6)
    ffn = 2 * d_model if width else 1536
    config = _eager(transformers.WhisperConfig(
        vocab_size=51865, num_mel_bins=80, d_model=d_model, encoder_layers=4, decoder_layers=4,
        encoder_attention_heads=heads, decoder_attention_heads=heads, encoder_ffn_dim=ffn,
        decoder_ffn_dim=ffn, max_source_positions=1500, max_target_positions=448,
        use_cache=past))
    if layers is not None:
        config.decoder_layers = layers
    _set_vocab(config, vocab)
    n_layer = config.decoder_layers

    def call(model: Any, input_ids: Any, attention_mask: Any, encoder_hidden_states: Any) -> Any:
        return model(input_ids=input_ids, attention_mask=attention_mask,
                     encoder_hidden_states=encoder_hidden_states, use_cache=False).last_hidden_state

    def with_cache(model: Any, input_ids: Any, encoder_hidden_states: Any, *kv: Any) -> Any:
        out = model(encoder_outputs=(encoder_hidden_states,), decoder_input_ids=input_ids,
                    past_key_values=_cross_cache(kv, n_layer), use_cache=True)
        return (out.logits, *_flat_cache(out.past_key_values.self_attention_cache))

    def build() -> Any:
        torch.manual_seed(0)
        if past:
            return _wrapped(transformers.WhisperForConditionalGeneration(config).eval(),
                            with_cache)
        return _wrapped(transformers.WhisperModel(config).eval().get_decoder(), call)

    ids = Input("input_ids", ("batch", "seq"), "ids", config.vocab_size)
    states = Input("encoder_hidden_states", ("batch", "enc_seq", config.d_model), "float")
    if past:
        return Decoder("whisper_decoder_past", build,
                       (ids, states, *_past_inputs(n_layer, heads, d_model // heads)),
                       ("logits", *_present_names(n_layer)))
    return Decoder("whisper_decoder", build,
                   (ids, Input("attention_mask", ("batch", "seq"), "mask"), states),
                   ("last_hidden_state",))


# The Llama family `llama(arch=...)` builds: transformers' configuration and causal-LM
# class names. Each keeps rotary embeddings, RMSNorm and grouped-query attention and adds
# its own spelling: Qwen2 biases on the q/k/v projections, Phi-3 one fused qkv_proj and
# one fused gate_up_proj, Mistral a sliding window, Gemma a scaled embedding, GELU gates
# and (1 + weight) norms.
LLAMA_FAMILY = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "phi3": ("Phi3Config", "Phi3ForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
    "gemma": ("GemmaConfig", "GemmaForCausalLM"),
}


def llama(layers: int | None = None, vocab: int | None = None, past: bool = False,
          width: tuple[int, int, int] | None = None, eager: bool = True,
          arch: str = "llama") -> Decoder:
    """A Llama-architecture causal LM from a small configuration (hidden 256, FFN 512,
    2 layers, 8 query heads over 2 key/value heads: rotary embeddings, RMSNorm,
    grouped-query attention), with `input_ids` and `attention_mask` `[batch, seq]`.

    With `past=True` the inputs are `input_ids` and each layer's
    `past_key_i`/`past_value_i` `[batch, kv_heads, past_seq, head_dim]` (the rotary
    positions start at `past_seq`), and the model also returns the present key/values.
    `width=(hidden, heads, kv_heads)` overrides (256, 8, 2) (the FFN is twice the
    hidden size); `eager=False` keeps transformers' default attention (SDPA). `arch`
    picks another member of the family (`LLAMA_FAMILY`) at the same sizes; the model's
    name is then `arch` (`qwen2_past`, ...)."""
    import torch
    import transformers

    config_class, model_class = (getattr(transformers, n) for n in LLAMA_FAMILY[arch])
    hidden, heads, kv_heads = width or (256, 8, 2)
    config = config_class(
        vocab_size=32000, hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=2, num_attention_heads=heads, num_key_value_heads=kv_heads,
        max_position_embeddings=2048, head_dim=hidden // heads)
    if eager:
        _eager(config)
    if layers is not None:
        config.num_hidden_layers = layers
    _set_vocab(config, vocab)
    n_layer = config.num_hidden_layers

    def no_cache(model: Any, input_ids: Any, attention_mask: Any) -> Any:
        return model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits

    def with_cache(model: Any, input_ids: Any, *past: Any) -> Any:
        out = model(input_ids=input_ids, past_key_values=_cache(past, n_layer), use_cache=True)
        return (out.logits, *_flat_cache(out.past_key_values))

    def build() -> Any:
        torch.manual_seed(0)
        return _wrapped(model_class(config).eval(), with_cache if past else no_cache)

    ids = Input("input_ids", ("batch", "seq"), "ids", config.vocab_size)
    if not past:
        return Decoder(arch, build, (ids, Input("attention_mask", ("batch", "seq"), "mask")),
                       ("logits",))
    return Decoder(f"{arch}_past", build,
                   (ids, *_past_inputs(n_layer, kv_heads, hidden // heads)),
                   ("logits", *_present_names(n_layer)))


def feeds(decoder: Decoder, sizes: dict[str, int], seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs for `decoder` at the dimension values `sizes` (token ids below the
    vocabulary, masks of ones, standard normal floats)."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for inp in decoder.inputs:
        shape = tuple(d if isinstance(d, int) else sizes[d] for d in inp.dims)
        if inp.kind == "ids":
            out[inp.name] = rng.integers(0, inp.vocab, size=shape).astype(np.int64)
        elif inp.kind == "mask":
            out[inp.name] = np.ones(shape, np.int64)
        else:
            out[inp.name] = rng.standard_normal(shape).astype(np.float32)
    return out


# The sizes torch traces at: every dynamic axis at a distinct value above 1, so neither
# exporter specialises a dimension to 1 or ties two of them together.
EXAMPLE_SIZES = {"batch": 2, "seq": 5, "past_seq": 3, "enc_seq": 7}


def export(decoder: Decoder, exporter: str, plain_names: bool = False) -> onnx.ModelProto:
    """`decoder` exported in memory by `exporter` ("torchscript" or "dynamo") with every
    named axis dynamic (hf_export.export_module). The dynamo exporter gets each axis as
    `torch.export.Dim(name)`, or with `plain_names` as its name alone (`{0: "batch"}`, as
    users write it: torch then simplifies less of the shape arithmetic, and the export
    holds sizes such as `batch*seq // batch`)."""
    import torch

    hf_export.check_exporter(exporter)
    module = decoder.build()
    example = tuple(torch.from_numpy(a) for a in feeds(decoder, EXAMPLE_SIZES).values())
    axes = {i.name: {k: d for k, d in enumerate(i.dims) if isinstance(d, str)}
            for i in decoder.inputs}
    dims: dict[str, Any] = {}

    def axis(name: str) -> Any:
        return name if plain_names else dims.setdefault(name, torch.export.Dim(name, min=1,
                                                                               max=4096))

    shapes = [{k: axis(d) for k, d in enumerate(inp.dims) if isinstance(d, str)}
              for inp in decoder.inputs]
    # forward(*inputs): torch.export wants the shapes of the inputs as one nested tuple.
    return hf_export.export_module(module, example, [i.name for i in decoder.inputs],
                                   list(decoder.outputs), exporter, dynamic_axes=axes,
                                   dynamic_shapes=(tuple(shapes),))
