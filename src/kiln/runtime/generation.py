"""Token generation over a compiled decoder with a key/value cache: `kiln.generate`.

A decoder exported with past key/values (torch.onnx with either exporter, Hugging
Face-style exports, onnxruntime-genai's builder) is one function

    (input_ids, [attention_mask], [position_ids], past_*...) -> (logits, present_*...)

whose `past_*` inputs carry one symbolic axis, the cached length. `generate` finds each
role from the function's signature (by name, docs/llm.md), starts from an empty cache
(the cached length 0), and feeds each step's `present_*` back as the next `past_*`. The
loop is numpy only, so a deploy host generates from a loaded library without the compiler;
the prompt's call runs the decoder's companion that computes only each row's last
logits, where its library has one (`last_position`, `prompt_function`);
greedy generation from a library that has its own loop in C runs that one instead
(kiln.runtime.generation_c), with the same tokens.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.errors import KilnError, UsageError
from kiln.runtime.abi import numpy_dtype
from kiln.runtime.generation_buffers import StepBuffers
from kiln.runtime.generation_c import c_generate_entry, c_loop

# Input names (lower case) that carry a role: what Hugging Face, torch exports and
# onnxruntime-genai's builder write.
_IDS = ("input_ids", "ids", "tokens", "decoder_input_ids")
_MASK = ("attention_mask", "decoder_attention_mask")
_POSITIONS = ("position_ids",)
_CACHE_POSITION = ("cache_position",)
_PAST = re.compile(r"past")
_PRESENT = re.compile(r"present")
_LOGITS = ("logits",)


@dataclass(frozen=True)
class Sampling:
    """How a step's token is chosen from its logits (Hugging Face's meanings):
    `temperature` divides the logits, `top_k` keeps the k most likely tokens (0: all),
    `top_p` keeps the smallest set whose probability reaches p, `repetition_penalty`
    divides a positive logit (multiplies a negative one) of every token already in the
    sequence. Greedy (`do_sample=False`) applies only the repetition penalty."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0

    def check(self) -> None:
        """Refuse values with no meaning (a UsageError naming the parameter)."""
        if not self.temperature > 0:
            raise UsageError(f"generate: temperature must be > 0, not {self.temperature}")
        if self.top_k < 0:
            raise UsageError(f"generate: top_k must be >= 0 (0: every token), not {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise UsageError(f"generate: top_p must be in (0, 1], not {self.top_p}")
        if not self.repetition_penalty > 0:
            raise UsageError("generate: repetition_penalty must be > 0, not "
                             f"{self.repetition_penalty}")

    def choose(self, logits: np.ndarray, seen: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """One token per row of `logits` [batch, vocab]; `seen` [batch, n] the ids so far."""
        if not self.do_sample and self.repetition_penalty == 1.0:
            return np.argmax(logits, axis=-1)  # widening to float64 reorders nothing
        scores = logits.astype(np.float64)
        if self.repetition_penalty != 1.0:
            rows = np.arange(scores.shape[0])[:, None]
            picked = scores[rows, seen]
            scores[rows, seen] = np.where(picked > 0, picked / self.repetition_penalty,
                                          picked * self.repetition_penalty)
        if not self.do_sample:
            return np.argmax(scores, axis=-1)
        scores = scores / self.temperature
        if 0 < self.top_k < scores.shape[-1]:
            kth = np.sort(scores, axis=-1)[:, -self.top_k][:, None]
            scores = np.where(scores < kth, -np.inf, scores)
        probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
        if self.top_p < 1.0:
            probs = _nucleus(probs, self.top_p)
        return np.array([rng.choice(probs.shape[-1], p=row) for row in probs])


def _nucleus(probs: np.ndarray, top_p: float) -> np.ndarray:
    """`probs` with every token outside the smallest most-likely set reaching `top_p`
    zeroed, renormalised (the most likely token always stays)."""
    order = np.argsort(-probs, axis=-1, kind="stable")
    ranked = np.take_along_axis(probs, order, axis=-1)
    before = np.cumsum(ranked, axis=-1) - ranked       # the mass ranked above each token
    keep = np.zeros_like(probs, dtype=bool)
    np.put_along_axis(keep, order, before < top_p, axis=-1)
    kept = np.where(keep, probs, 0.0)
    return kept / kept.sum(axis=-1, keepdims=True)


@dataclass(frozen=True)
class DecoderRoles:
    """Which parameter and result of a decoder function plays which part in a loop."""

    ids: Mapping[str, Any]
    pasts: tuple[Mapping[str, Any], ...]
    past_axes: tuple[int, ...]        # each past's cached-length axis
    presents: tuple[int, ...]         # result indices, in the pasts' order
    logits: int
    mask: Mapping[str, Any] | None
    positions: Mapping[str, Any] | None
    cache_position: Mapping[str, Any] | None
    others: tuple[str, ...]           # inputs the caller gives (encoder states, ...)

    @classmethod
    def of(cls, function: Any) -> DecoderRoles:
        """The roles of `function`'s parameters and results, or a UsageError saying what
        is missing (`function` a compiled graph function: `exe["main"]`, `lib["main"]`)."""
        name = getattr(function, "name", "function")
        params = [p for p in getattr(function, "params", []) if p.get("kind") == "tensor"]
        results = list(getattr(function, "results", []))
        if not params or not results:
            raise UsageError(f"generate: {name} is not a compiled graph function "
                             "(pass an Executable, a loaded module or its function)")
        ids = _find(params, _IDS) or next(
            (p for p in params if "int" in p["dtype"] and len(p["shape"]) == 2), None)
        if ids is None:
            raise UsageError(f"generate: {name} has no token-ids input (an integer "
                             f"[batch, seq] input named one of {', '.join(_IDS)}); it takes "
                             + ", ".join(p["name"] for p in params))
        pasts = tuple(p for p in params if _PAST.search(p["name"].lower()))
        if not pasts:
            raise UsageError(f"generate: {name} has no past key/value inputs (inputs named "
                             "past...): generate feeds one new token per step and needs a "
                             "decoder exported with its cache")
        presents = tuple(i for i, r in enumerate(results) if _PRESENT.search(r["name"].lower()))
        if len(pasts) != len(presents):
            raise UsageError(f"generate: {name} takes {len(pasts)} past inputs but returns "
                             f"{len(presents)} present outputs; a loop feeds each present back "
                             "as the past of the same position")
        logits = next((i for i, r in enumerate(results) if r["name"].lower() in _LOGITS),
                      next(i for i in range(len(results)) if i not in presents))
        named = {ids["name"], *(p["name"] for p in pasts)}
        roles = {key: _find(params, names) for key, names in
                 (("mask", _MASK), ("positions", _POSITIONS), ("cache_position", _CACHE_POSITION))}
        named |= {p["name"] for p in roles.values() if p is not None}
        return cls(ids=ids, pasts=pasts, past_axes=tuple(_past_axis(p, ids, name) for p in pasts),
                   presents=presents, logits=logits, others=tuple(
                       p["name"] for p in params if p["name"] not in named), **roles)


def prompt_function(fn: Any) -> Any:
    """The function a generation's prompt call runs: `fn`'s companion in its library
    (metadata "last_position", docs/abi.md), which returns the logits of each row's last
    position only, [batch, 1, vocab], and the same presents; `fn` itself when its library
    has none (an older library, an in-process function)."""
    name = getattr(fn, "signature", {}).get("last_position")
    lookup = getattr(getattr(fn, "owner", None), "get_function", None)
    companion = lookup(name, query_imports=False) if isinstance(name, str) and lookup else None
    return fn if companion is None else companion


def _find(params: Sequence[Mapping[str, Any]], names: Sequence[str]) -> Mapping[str, Any] | None:
    return next((p for p in params if p["name"].lower() in names), None)


def _past_axis(past: Mapping[str, Any], ids: Mapping[str, Any], name: str) -> int:
    """The axis of `past` holding the cached length: its one symbolic dimension that
    the token ids do not have (the batch is the ids' too)."""
    batch = {d for d in ids["shape"] if isinstance(d, str)}
    axes = [k for k, d in enumerate(past["shape"]) if isinstance(d, str) and d not in batch]
    if len(axes) != 1:
        raise UsageError(
            f"generate: {name}'s input {past['name']} has shape {list(past['shape'])}: a loop "
            "needs exactly one symbolic axis besides the batch for the cached length; "
            "compile the decoder with its past length dynamic")
    return axes[0]


def _function(lib: Any, function: str) -> Any:
    if hasattr(lib, "params") and hasattr(lib, "results"):
        return lib
    try:
        return lib[function]
    except (KilnError, KeyError, TypeError, AttributeError) as exc:
        raise UsageError(f"generate: {type(lib).__name__} has no function {function!r} "
                         "(pass an Executable, a loaded module, or one of their functions)"
                         ) from exc


def _shape(param: Mapping[str, Any], batch: int, axis: int, cached: int = 0) -> tuple[int, ...]:
    """A past's shape: `param`'s with the batch filled in and the cached length `cached`
    (0: the empty cache a generation starts from)."""
    dims = []
    for k, d in enumerate(param["shape"]):
        dims.append(cached if k == axis else d if isinstance(d, int) else batch)
    return tuple(dims)


def _step_feeds(roles: DecoderRoles, ids: np.ndarray, past: Sequence[np.ndarray],
                cached: int, fixed: Mapping[str, Any]) -> dict[str, Any]:
    """The inputs of one call: `ids` [batch, seq] after `cached` cached positions."""
    batch, seq = ids.shape
    feeds: dict[str, Any] = {roles.ids["name"]: ids, **fixed}
    feeds.update({p["name"]: v for p, v in zip(roles.pasts, past, strict=True)})
    where = np.arange(cached, cached + seq)
    if roles.mask is not None:
        feeds[roles.mask["name"]] = np.ones((batch, cached + seq), roles.mask["dtype"])
    if roles.positions is not None:
        rows = batch if roles.positions["shape"][0] != 1 else 1
        feeds[roles.positions["name"]] = np.broadcast_to(
            where.astype(roles.positions["dtype"]), (rows, seq)).copy()
    if roles.cache_position is not None:
        feeds[roles.cache_position["name"]] = where.astype(roles.cache_position["dtype"])
    return feeds


def generate(lib: Any, input_ids: Any, max_new_tokens: int, *,
             on_token: Callable[[np.ndarray], object] | None = None,
             do_sample: bool = False, temperature: float = 1.0, top_k: int = 0,
             top_p: float = 1.0, repetition_penalty: float = 1.0, seed: int | None = None,
             stop_tokens: Sequence[int] = (), pad_token: int | None = None,
             inputs: Mapping[str, Any] | None = None, function: str = "main",
             native: bool = True) -> np.ndarray:
    """Generate up to `max_new_tokens` tokens after each row of `input_ids`.

    `lib` is an Executable, a loaded module (`kiln.runtime.load_module`) or one of their
    functions: a decoder with past key/values (module docstring). `input_ids` is an int
    array [batch, prompt]. The first call runs the whole prompt from an empty cache (one
    prefill), each later call one token per row. `on_token(tokens)` receives each step's
    tokens ([batch] int64) as they are chosen; a true result ends the loop after that
    step. Greedy unless `do_sample` (then
    `temperature`, `top_k`, `top_p`, with a numpy generator seeded by `seed`);
    `repetition_penalty` applies to both. A row that produced one of `stop_tokens` is
    finished and continues with `pad_token` (default: the first stop token); the loop ends
    when every row is finished. `inputs` gives the decoder's other inputs, the same at every
    step (an encoder's hidden states). Greedy generation from a library with its own loop
    (`{prefix}_generate_{fn}`, docs/llm.md) runs that loop, calling `on_token` from C;
    `native=False` keeps the loop in Python. Returns the new tokens, int64 [batch, steps].
    """
    sampling = Sampling(do_sample, float(temperature), int(top_k), float(top_p),
                        float(repetition_penalty))
    sampling.check()
    if not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 0:
        raise UsageError(f"generate: max_new_tokens must be an int >= 0, not {max_new_tokens!r}")
    fn = _function(lib, function)
    roles = DecoderRoles.of(fn)
    fixed = dict(inputs or {})
    missing = [n for n in roles.others if n not in fixed]
    unknown = [n for n in fixed if n not in roles.others]
    if missing or unknown:
        raise UsageError(f"generate: {fn.name} also takes {', '.join(roles.others) or 'nothing'}"
                         f" (give them as inputs=...); missing: {', '.join(missing) or 'none'}, "
                         f"not an input of the loop: {', '.join(unknown) or 'none'}")
    ids = np.asarray(input_ids)
    if ids.ndim != 2 or ids.shape[1] == 0 or ids.dtype.kind not in "iu":
        raise UsageError("generate: input_ids must be an int array [batch, prompt] with a "
                         f"prompt of at least one token, not {ids.dtype}{list(ids.shape)}")
    ids = ids.astype(roles.ids["dtype"])
    stops = np.asarray(list(stop_tokens), np.int64)
    pad = int(pad_token if pad_token is not None else (stops[0] if stops.size else 0))
    greedy = not sampling.do_sample and sampling.repetition_penalty == 1.0
    entry = c_generate_entry(fn) if native and greedy and not fixed else None
    if entry is not None:
        return c_loop(fn, entry, ids, int(max_new_tokens), stops, pad, on_token)
    return _loop(fn, roles, ids, int(max_new_tokens), fixed, sampling,
                 np.random.default_rng(seed), stops, pad, on_token)


def _buffers(fn: Any, roles: DecoderRoles, batch: int, positions: int,
             shared: bool = False) -> StepBuffers:
    """The calls' result arrays for a generation of `positions` positions in all: each
    present at most its past's shape with every position cached."""
    caches = [(_shape(p, batch, a, positions), numpy_dtype(p["dtype"]))
              for p, a in zip(roles.pasts, roles.past_axes, strict=True)]
    return StepBuffers(roles.presents, caches,
                       [numpy_dtype(r["dtype"]) for r in getattr(fn, "results", [])],
                       shared=shared)


#: The new positions a shared cache (below) holds at first; it doubles when full.
SHARED_STEPS = 256


def shared_cache(fn: Any, roles: DecoderRoles) -> bool:
    """Whether `fn` writes each present in place of its own past (the results' marks,
    kiln.runtime.in_place) and reads how much is cached from its attention mask:
    GroupQueryAttention's shared buffer, which a loop keeps at a fixed length."""
    params = [p["name"] for p in getattr(fn, "params", [])]
    results = list(getattr(fn, "results", []))
    marks = [results[r].get("in_place_of") for r in roles.presents]
    return roles.mask is not None and all(
        isinstance(i, int) and 0 <= i < len(params) and params[i] == p["name"]
        for i, p in zip(marks, roles.pasts, strict=True))


def _call(fn: Any, names: Sequence[str], feeds: Mapping[str, Any],
          buffers: StepBuffers) -> Sequence[Any]:
    """One step's results, written into `buffers`' arrays where they fit."""
    # positionally, in the signature's order: a library's fast call path takes no keywords
    args = [feeds[name] for name in names] if set(names) == set(feeds) else None
    shapes = fn.output_shapes(*args) if args is not None else fn.output_shapes(**feeds)
    out = buffers.outputs(shapes)
    results = fn(*args, out=out) if args is not None else fn(**feeds, out=out)
    return results if isinstance(results, (tuple, list)) else (results,)


def _loop(fn: Any, roles: DecoderRoles, ids: np.ndarray, steps: int, fixed: Mapping[str, Any],
          sampling: Sampling, rng: np.random.Generator, stops: np.ndarray, pad: int,
          on_token: Callable[[np.ndarray], object] | None) -> np.ndarray:
    batch = ids.shape[0]
    seen, cached, step_ids = ids.astype(np.int64), 0, ids
    finished = np.zeros(batch, bool)
    new: list[np.ndarray] = []
    names = [p["name"] for p in getattr(fn, "params", [])]
    pairs = list(zip(roles.pasts, roles.past_axes, strict=True))
    shared = shared_cache(fn, roles)
    prompt = prompt_function(fn)  # the first call reads only each row's last logits
    if shared:  # one buffer per past, written in place (generation_buffers)
        length = ids.shape[1] + min(steps, SHARED_STEPS)
        buffers = _buffers(fn, roles, batch, length + ids.shape[1], shared=True)
        past = buffers.pasts([_shape(p, batch, a, length) for p, a in pairs])
    else:
        buffers = _buffers(fn, roles, batch, ids.shape[1] + steps)
        past = [np.zeros(_shape(p, batch, a), p["dtype"]) for p, a in pairs]
    for _ in range(steps):
        if shared and cached + step_ids.shape[1] > length:
            length = max(2 * length, cached + step_ids.shape[1])
            past = buffers.grow(past, [_shape(p, batch, a, length + 1) for p, a in pairs],
                                [_shape(p, batch, a, length) for p, a in pairs],
                                roles.past_axes, cached)
        results = _call(prompt if cached == 0 else fn, names,
                        _step_feeds(roles, step_ids, past, cached, fixed), buffers)
        cached += step_ids.shape[1]
        if not shared:
            past = [np.asarray(results[i]) for i in roles.presents]
        tokens = sampling.choose(np.asarray(results[roles.logits])[:, -1, :], seen, rng)
        tokens = np.where(finished, pad, tokens).astype(np.int64)
        finished |= np.isin(tokens, stops)
        new.append(tokens)
        if (on_token is not None and on_token(tokens.copy())) or finished.all():
            break
        seen = np.concatenate([seen, tokens[:, None]], axis=1)
        step_ids = tokens[:, None].astype(roles.ids["dtype"])
    return np.stack(new, axis=1) if new else np.zeros((batch, 0), np.int64)
