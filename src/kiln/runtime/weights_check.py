"""The weights' check at memory bandwidth: `kiln_hash64.c` and `kiln_check.c`, linked
into every library with weights, used by the Python loader and by a plain C host alike.

Export (`check_artifact`): the kiln.lane64 hash (kiln.artifact.integrity.lane64,
`kiln_hash64.c`) of each 4 MiB chunk of every native data artifact (the weights),
written as a table into `kiln_check.c`, which the library links; they export
`{prefix}_check_weights(first, count)` (-1: those chunks match),
`{prefix}_weights_chunks()`, `{prefix}_hash64` and `{prefix}_rehash_weights(data, size,
phase)` (the table follows a swap: the chunks it rewrote that were intact before get
their new hashes; the library's own C swap calls its hidden twin
`{prefix}_check_rewritten`, kiln_swap_run.c; the numpy swap, kiln.runtime.swap, this).
The blob's metadata gets `weights_check` (docs/format.md "The weights check record"):
the hash's name, the chunk size, the chunk count and the regions in table order.

Load (`lane_regions`): the loader checks chunk by chunk through
`{prefix}_check_weights`, from the background thread and the waiting call
(kiln.runtime.weights.ChunkCheck; ctypes releases the GIL, so both hash at once).
A library without the record (exported before it) is checked against the SHA-256s
as before. The SHA-256s stay the weights' content hash (cache keys, the weights
file's identity); this hash only finds damage.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from kiln.artifact.artifact import Artifact
from kiln.artifact.integrity import CHUNK_SIZE, LANE64, LANE64_SIZE, chunk_count, lane64_digests
from kiln.errors import FormatError
from kiln.runtime import ctypes_abi
from kiln.runtime.native import include_dir

# Their signatures are kiln.runtime.ctypes_abi.SIGNATURES.
CHECK_EXPORTS = ("hash64", "check_weights", "weights_chunks", "rehash_weights")


def rewritten_symbol(prefix: str) -> str:
    """The hidden entry of `kiln_check.c` that the library's own C swap calls after it
    installed constants (kiln_swap_run.c: KILN_SWAP_REWRITTEN)."""
    return f"{prefix}_check_rewritten"


def check_symbols(prefix: str) -> list[str]:
    """The entries `kiln_check.c` adds to a library's exports."""
    return [f"{prefix}_{name}" for name in CHECK_EXPORTS]


def check_artifact(data: Sequence[Artifact], prefix: str
                   ) -> tuple[list[Artifact], dict[str, Any]] | None:
    """`kiln_hash64.c` (the same for every library of `prefix`: compiled once per
    process) and `kiln_check.c` with the chunk hashes of the data artifacts `data` (in
    the blob's order), and the blob metadata entry `weights_check`; None without data."""
    data = [a for a in data if a.size > 0]
    if not data:
        return None
    digests = [lane64_digests(a.content, CHUNK_SIZE) for a in data]
    words = [f"0x{int.from_bytes(d[i:i + LANE64_SIZE], 'little'):016x}ULL"
             for d in digests for i in range(0, len(d), LANE64_SIZE)]
    symbols = [str(a.metadata["symbol"]) for a in data]
    lines = [f"#define KILN_CHECK_HASH {prefix}_hash64",
             f"#define KILN_CHECK_WEIGHTS {prefix}_check_weights",
             f"#define KILN_CHECK_CHUNKS {prefix}_weights_chunks",
             f"#define KILN_CHECK_REHASH {prefix}_rehash_weights",
             f"#define KILN_CHECK_REWRITTEN {rewritten_symbol(prefix)}",
             f"#define KILN_CHECK_COUNT {len(data)}",
             "#define KILN_CHECK_REGIONS " + " ".join(
                 f"X({s}, {a.size}ULL)" for s, a in zip(symbols, data)),
             f"#define KILN_CHECK_CHUNK {CHUNK_SIZE}ULL",
             f"#define KILN_CHECK_TOTAL {len(words)}",
             "#define KILN_CHECK_DIGESTS {" + ", ".join(words) + "}", ""]
    folder = Path(include_dir()) / "kiln"
    hash_source = lines[0] + "\n" + (folder / "kiln_hash64.c").read_text()
    source = "\n".join(lines) + (folder / "kiln_check.c").read_text()
    artifacts = [Artifact("weights", "native", "kiln_hash64.c", hash_source.encode(),
                          {"exports": [f"{prefix}_hash64"]}),
                 Artifact("weights", "native", "kiln_check.c", source.encode(),
                          {"exports": check_symbols(prefix)[1:]})]
    entry = {"hash": LANE64, "chunk_size": CHUNK_SIZE, "chunks": len(words),
             "check_symbol": f"{prefix}_check_weights",
             "regions": [{"artifact": f"{a.codegen_id}/{a.file_name}", "symbol": s,
                          "size": a.size} for s, a in zip(symbols, data)]}
    return artifacts, entry


# A region of the record, its chunk size, and whether its chunk k is intact.
LaneRegion = tuple[Mapping[str, Any], int, Callable[[int], bool]]


def lane_regions(cdll: Any, entry: Any, where: str) -> list[LaneRegion] | None:
    """Per region of a `weights_check` record: (its record, its chunk size, a function
    telling whether its chunk k is intact, through `{prefix}_check_weights`). None if
    the record names another hash (a newer library: the SHA-256s are checked instead);
    FormatError if it is malformed or the entry is missing."""
    if not isinstance(entry, Mapping) or entry.get("hash") != LANE64:
        return None
    regions, chunk, symbol = entry.get("regions"), entry.get("chunk_size"), entry.get(
        "check_symbol")
    if not (isinstance(regions, list) and isinstance(chunk, int) and chunk > 0
            and isinstance(symbol, str)
            and all(isinstance(r, Mapping) and isinstance(r.get("size"), int) for r in regions)):
        raise FormatError(f"{where}: the blob's 'weights_check' record is malformed")
    try:
        check = ctypes_abi.bind(cdll, symbol, "check_weights")
    except AttributeError:
        raise FormatError(f"{where}: its weights check record names {symbol}, which the "
                          "library does not export; the file is damaged") from None
    out = []
    first = 0
    for r in regions:
        out.append((r, chunk, _chunk_checker(check, first)))
        first += chunk_count(int(r["size"]), chunk)
    if first != entry.get("chunks"):
        raise FormatError(f"{where}: the blob's 'weights_check' record counts "
                          f"{entry.get('chunks')} chunks, its regions {first}")
    return out


def _chunk_checker(check: Any, first: int) -> Callable[[int], bool]:
    def intact(k: int) -> bool:
        return bool(check(first + k, 1) == -1)
    return intact


__all__ = ["CHECK_EXPORTS", "LaneRegion", "check_artifact", "check_symbols", "lane_regions",
           "rewritten_symbol"]
