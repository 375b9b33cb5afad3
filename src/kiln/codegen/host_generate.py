"""host.c's generation entries: `{prefix}_generate_{fn}` for every decoder function.

A graph function whose signature is a decoder with a key/value cache (the roles
kiln.generate finds by name: token ids, past/present pairs, logits, and optionally an
attention mask, position ids and cache positions; kiln.runtime.generation.DecoderRoles)
gets a C entry that runs kiln.generate's greedy loop without Python:

    int32_t {prefix}_generate_{fn}(const int64_t* prompt, int64_t batch, int64_t prompt_len,
                                   int64_t max_new_tokens, const int64_t* stop_tokens,
                                   int32_t n_stop, int64_t pad_token, int64_t* out_ids,
                                   int64_t* out_steps, KilnTokenFunc on_token, void* user);

The loop itself is kiln_generate.c (part of kiln_host.c, compiled in by
KILN_HOST_GENERATE); this module writes the tables that describe the function's roles
(kiln.codegen.decoder_layout decides which functions get one).
"""

from __future__ import annotations

from collections.abc import Sequence

from kiln.codegen.decoder_layout import DecoderLayout
from kiln.codegen.naming import entry_symbol, generate_symbol, output_shapes_symbol, symbol_name
from kiln.escape import c_string_literal
from kiln.runtime.abi import dl_type


def generate_entry(prefix: str, ns: str, name: str, layout: DecoderLayout,
                   prompt: str | None = None) -> list[str]:
    """The C of `{prefix}_generate_{name}`: the role tables and the entry; `prompt` names
    the function the prompt's call runs (the decoder's companion computing only the last
    position's logits, kiln.transform.last_position), None: `name` itself."""
    base = f"{ns}gen_{symbol_name(name)}"
    args = [*layout.params, *layout.results]
    dtypes = ", ".join(f"{{{t.code}, {t.bits}, 1}}" for t in (dl_type(a["dtype"]) for a in args))
    dims = ",\n    ".join(", ".join(str(d) for d in row) for row in layout.dims)
    symbol = generate_symbol(prefix, name)
    prompt_entries = ("NULL, NULL" if prompt is None else
                      f"{entry_symbol(prefix, prompt)}, {output_shapes_symbol(prefix, prompt)}")

    def ints(values: Sequence[int]) -> str:
        return ", ".join(str(v) for v in values) or "0"

    return [
        f"/* Greedy generation over {name}'s cache (docs/abi.md, \"Generation\"). */",
        f"static const DLDataType {base}_dtypes[] = {{{dtypes}}};",
        f"static const int32_t {base}_ranks[] = {{{ints([len(a['shape']) for a in args])}}};",
        f"static const int64_t {base}_dims[] = {{\n    {dims}}};",
        f"static const int32_t {base}_pasts[] = {{{ints(layout.pasts)}}};",
        f"static const int32_t {base}_presents[] = {{{ints(layout.presents)}}};",
        f"KILN_EXPORT int32_t {symbol}(const int64_t* prompt, int64_t batch,",
        "    int64_t prompt_len, int64_t max_new_tokens, const int64_t* stop_tokens,",
        "    int32_t n_stop, int64_t pad_token, int64_t* out_ids, int64_t* out_steps,",
        "    kiln_host_token_fn on_token, void* user) {",
        f"  static const kiln_host_decoder decoder = {{{c_string_literal(name)},",
        f"      {entry_symbol(prefix, name)}, {output_shapes_symbol(prefix, name)},",
        f"      {len(layout.params)}, {len(layout.results)}, {base}_dtypes, {base}_ranks,",
        f"      {base}_dims, {layout.ids}, {layout.mask}, {layout.positions},",
        f"      {layout.cache_position}, {layout.logits}, {len(layout.pasts)}, {base}_pasts,",
        f"      {base}_presents, {int(layout.shared)}, {prompt_entries}}};",
        "  return kiln_host_generate(&decoder, prompt, batch, prompt_len, max_new_tokens,",
        "      stop_tokens, n_stop, pad_token, out_ids, out_steps, on_token, user);",
        "}",
        "",
    ]


__all__ = ["generate_entry"]
