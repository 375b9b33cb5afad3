"""Which graph functions are decoders the C generation loop can drive.

A graph function whose signature is a decoder with a key/value cache (the roles
kiln.generate finds by name: token ids, past/present pairs, logits, and optionally an
attention mask, position ids and cache positions; kiln.runtime.generation.DecoderRoles)
gets the entry `{prefix}_generate_{fn}` (kiln.codegen.host_generate). A function the
loop cannot drive (other inputs such as encoder states, results other than the presents'
cached lengths sized by their data, logits other than float32 [batch, seq, vocab]) gets
none: `decoder_layout` says why.

A present whose cached length is a run-time dimension is driven: onnxruntime-genai's
builder passes GroupQueryAttention a total_sequence_length computed from the attention
mask's shape, which kiln reads while the call runs (its present's length is
max(past, total), checked against past + new). The loop allocates the bound (past + new,
from `{prefix}_output_shapes_{fn}`), and after each call takes the length the packed
entry wrote back into the present's shape as the next past's (kiln_generate.c): with
the mask all ones over cached + new positions, as the loop gives it, that is cached +
new, the length kiln.generate's Python loop gets.
Read from the library metadata's signature alone, so the metadata (which names the
entry) and host.c (which defines it) agree.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from kiln.errors import UsageError
from kiln.runtime.generation import DecoderRoles, shared_cache

# kiln_generate.c's codes for a parameter's dimension that is not a fixed size.
RANK = 8  # KILN_HOST_GEN_RANK
BATCH, CACHED, NEW, TOTAL = -1, -2, -3, -4
_INTS = ("int32", "int64")


@dataclass(frozen=True)
class DecoderLayout:
    """A decoder function's roles as kiln_generate.c's kiln_host_decoder holds them."""

    params: tuple[Mapping[str, Any], ...]
    results: tuple[Mapping[str, Any], ...]
    dims: tuple[tuple[int, ...], ...]      # per parameter: a size or a code above
    ids: int
    mask: int
    positions: int
    cache_position: int
    logits: int
    pasts: tuple[int, ...]
    presents: tuple[int, ...]
    shared: bool = False  # each present in place of its past (kiln.runtime.generation)


def decoder_layout(signature: Mapping[str, Any]) -> DecoderLayout | str:
    """The layout of the function with metadata `signature`, or why it has no entry."""
    params, results = list(signature.get("params", [])), list(signature.get("results", []))
    if any(p.get("kind") != "tensor" for p in params + results):
        return "it has scalar parameters or results"
    try:
        roles = DecoderRoles.of(SimpleNamespace(name=signature.get("name", "function"),
                                                params=params, results=results))
    except UsageError as exc:
        return str(exc)
    if roles.others:
        return f"it also takes {', '.join(roles.others)}"
    why = _presents(params, results, roles)
    if why:
        return why
    if not _sized_by_data_only_in_cache(signature, roles):
        return "it has results sized by their data other than its presents' cached lengths"
    logits = results[roles.logits]
    if logits["dtype"] != "float32" or len(logits["shape"]) != 3:
        return "its logits are not float32 [batch, seq, vocab]"
    index = {p["name"]: i for i, p in enumerate(params)}
    role = {key: index[r["name"]] if r is not None else -1 for key, r in (
        ("ids", roles.ids), ("mask", roles.mask), ("positions", roles.positions),
        ("cache_position", roles.cache_position))}
    pasts = tuple(index[p["name"]] for p in roles.pasts)
    dims = _dims(params, role, dict(zip(pasts, roles.past_axes, strict=True)))
    if isinstance(dims, str):
        return dims
    shared = shared_cache(SimpleNamespace(params=params, results=results), roles)
    return DecoderLayout(tuple(params), tuple(results), dims, logits=roles.logits,
                         pasts=pasts, presents=roles.presents, shared=shared, **role)


def _presents(params: Sequence[Mapping[str, Any]], results: Sequence[Mapping[str, Any]],
              roles: DecoderRoles) -> str:
    """Why a present cannot be fed back as its past (the loop passes each present with
    the shape the call gave it), or ""."""
    for past, k in zip(roles.pasts, roles.presents, strict=True):
        present = results[k]
        if present["dtype"] != past["dtype"] or len(present["shape"]) != len(past["shape"]):
            return (f"its result {present['name']} is not of its past {past['name']}'s "
                    "dtype and rank")
    return ""


def _sized_by_data_only_in_cache(signature: Mapping[str, Any], roles: DecoderRoles) -> bool:
    """Whether every run-time dimension (docs/abi.md, "Data-dependent output sizes")
    sizes only presents' cached-length axes, which the loop reads back after each call."""
    axes = dict(zip(roles.presents, roles.past_axes, strict=True))
    return all(place.get("result") in axes and place.get("axis") == axes[place["result"]]
               for dim in signature.get("runtime_dims", []) for place in dim.get("places", []))


def _dims(params: Sequence[Mapping[str, Any]], role: Mapping[str, int],
          past_axes: Mapping[int, int]) -> tuple[tuple[int, ...], ...] | str:
    """Each parameter's dimensions as sizes or codes, or why one cannot be given."""
    ids = params[role["ids"]]
    if ids["dtype"] not in _INTS or not isinstance(ids["shape"][1], str):
        return "its token ids are not int32/int64 [batch, seq] with seq symbolic"
    batch = ids["shape"][0]
    want = {role["ids"]: (batch, NEW), role["mask"]: (batch, TOTAL),
            role["cache_position"]: (NEW,)}
    if role["positions"] >= 0:
        rows = params[role["positions"]]["shape"][0]
        want[role["positions"]] = (1 if rows == 1 else batch, NEW)
    out: list[tuple[int, ...]] = []
    for i, p in enumerate(params):
        shape = list(p["shape"])
        if len(shape) > RANK:
            return f"its input {p['name']} has more than {RANK} dimensions"
        if i in past_axes:
            shape[past_axes[i]] = CACHED
            codes = [BATCH if d == batch and isinstance(d, str) else d for d in shape]
        else:
            if i not in want or len(shape) != len(want[i]) or p["dtype"] not in _INTS:
                return f"its input {p['name']} is not an int tensor of the shape its role needs"
            codes = [BATCH if d == batch and isinstance(d, str) else d for d in want[i]]
        if any(isinstance(d, str) for d in codes):
            return f"its input {p['name']} has a dimension the loop does not know"
        out.append(tuple(int(d) for d in codes) + (0,) * (RANK - len(codes)))
    return tuple(out)


__all__ = ["BATCH", "CACHED", "NEW", "RANK", "TOTAL", "DecoderLayout", "decoder_layout"]
