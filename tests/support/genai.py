"""onnxruntime-genai as a reference: its model builder's files for tiny transformers
decoders, and its own greedy generator over them (tests/models/test_genai_builder.py,
bench/llm.py). onnxruntime-genai is a test dependency (requirements.txt); callers skip
where `import onnxruntime_genai` fails."""

from __future__ import annotations

import contextlib
import io
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

#: transformers config classes and the fields that make them tiny: one layer, hidden 64
#: over 4 query heads and 2 key/value heads (head size 16), the FFN twice the width.
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
        "tie_word_embeddings": False}
CONFIGS = {"llama": "LlamaConfig", "qwen2": "Qwen2Config", "phi3": "Phi3Config",
           "mistral": "MistralConfig", "gemma": "GemmaConfig"}
#: per family: Phi-3 without LongRoPE (the builder's Phi3MiniModel, not the LongRoPE one);
#: Gemma's head size is its own field (256 by default), set to the others' 16
EXTRA = {"phi3": {"original_max_position_embeddings": TINY["max_position_embeddings"]},
         "gemma": {"head_dim": 16}}
#: the end-of-sequence token: onnxruntime-genai stops at it, so the tests stop there too
EOS = 2
CAUSAL_LM = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
             "phi3": "Phi3ForCausalLM", "mistral": "MistralForCausalLM",
             "gemma": "GemmaForCausalLM"}


def save_hf_model(family: str, where: Path, vocab: int = 256, seed: int = 0,
                  **sizes: Any) -> Path:
    """A `family` decoder (CONFIGS) with random weights drawn after `torch.manual_seed
    (seed)`, saved with `save_pretrained` under `where`; `sizes` override TINY."""
    import torch  # heavy: only where a model is built
    import transformers  # heavy: only where a model is built

    config = getattr(transformers, CONFIGS[family])(
        vocab_size=vocab, **{**TINY, **EXTRA.get(family, {}), **sizes}, pad_token_id=0,
        bos_token_id=1, eos_token_id=EOS)
    torch.manual_seed(seed)
    model = getattr(transformers, CAUSAL_LM[family])(config).eval()
    with torch.no_grad():  # random weights at transformers' 0.02 leave the logits flat
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.2)
    model.save_pretrained(where)
    _save_tokenizer(where, vocab)
    return where


def _save_tokenizer(where: Path, vocab: int) -> None:
    """A word-level tokenizer over `t0` ... `t{vocab-1}`: the builder loads one (its
    processing files) though the tests feed token ids."""
    import transformers  # heavy: only where a model is built
    from tokenizers import Tokenizer, models, pre_tokenizers  # heavy: with transformers

    words = {f"t{i}": i for i in range(vocab)}
    tokenizer = Tokenizer(models.WordLevel(vocab=words, unk_token="t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="t0",
                                         pad_token="t0", bos_token="t1",
                                         eos_token="t2").save_pretrained(where)


def build(hf_dir: Path, out: Path, precision: str) -> Path:
    """onnxruntime-genai's model builder on `hf_dir` for the CPU (`precision` "fp32" or
    "int4"), in this process (its output quieted); the folder holding model.onnx."""
    with _builders_quantization():
        from onnxruntime_genai.models import builder  # heavy: torch and the builder

        extra = builder.parse_extra_options("", str(hf_dir), str(out), precision, "cpu",
                                            str(out / "cache"), [])
        with contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()):
            builder.create_model("", str(hf_dir), str(out), precision, "cpu",
                                 str(out / "cache"), **extra)
    return out


@contextlib.contextmanager
def _builders_quantization() -> Iterator[None]:
    """The builder imports its own top-level `quantization` package (its folder is on
    sys.path); in a suite that imported tests/quantization's modules first, that name is
    taken. While the builder runs, the name is the builder's; the suite's comes back
    after (each keeps its own modules)."""
    def taken() -> dict[str, Any]:
        return {k: sys.modules.pop(k) for k in list(sys.modules)
                if k == "quantization" or k.startswith("quantization.")}

    suites = taken()
    mine = _BUILDER_MODULES
    sys.modules.update(mine)
    try:
        yield
    finally:
        mine.clear()
        mine.update(taken())
        sys.modules.update(suites)


#: The builder's `quantization` modules between builds (_builders_quantization).
_BUILDER_MODULES: dict[str, Any] = {}


def genai_greedy(model_dir: Path, prompt: np.ndarray, new: int, threads: int = 2) -> np.ndarray:
    """onnxruntime-genai's own greedy generation of `new` tokens after `prompt` ([1,
    prompt]) from the builder's folder: og.Model, og.Generator; [1, new] int64."""
    import onnxruntime_genai as og  # optional: the reference runtime

    set_threads(model_dir, threads)
    model = og.Model(str(model_dir))
    params = og.GeneratorParams(model)
    # no min_length: genai would mask the EOS logit until then, not greedy any more
    params.set_search_options(do_sample=False, max_length=prompt.shape[1] + new)
    generator = og.Generator(model, params)
    generator.append_tokens(prompt.astype(np.int32))
    while not generator.is_done():
        generator.generate_next_token()
    return np.asarray(generator.get_sequence(0), np.int64)[None, prompt.shape[1]:]


def set_threads(model_dir: Path, threads: int) -> None:
    """genai_config.json's session options: `threads` intra-op threads."""
    path = model_dir / "genai_config.json"
    config = json.loads(path.read_text())
    options = config["model"]["decoder"].setdefault("session_options", {})
    if options.get("intra_op_num_threads") != threads:
        options["intra_op_num_threads"] = threads
        path.write_text(json.dumps(config, indent=4))
