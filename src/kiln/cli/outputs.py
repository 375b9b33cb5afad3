"""The files `kiln compile -o` writes, by suffix.

`export_library`'s suffixes (kiln.runtime.library.SUFFIXES) plus `.wasm`, which
kiln.export.wasm writes: the one list the refusal of another suffix shows, checked
before anything compiles. `kiln build-many` writes the same suffixes
(kiln.distributed.build.cell_suffix).
"""

from __future__ import annotations

from pathlib import Path

from kiln.errors import UsageError

WASM = ".wasm"
#: What each suffix `kiln compile` accepts besides export_library's holds.
EXTRA_OUTPUTS = {WASM: "WebAssembly module"}


def compile_outputs() -> dict[str, str]:
    """Every suffix `kiln compile -o` writes, with what the file holds."""
    from kiln.runtime.library import (
        SUFFIXES,  # heavy: kept off the cli's startup (kiln --help)
    )

    return {**SUFFIXES, **EXTRA_OUTPUTS}


def check_output(path: str) -> None:
    """Raise UsageError naming every valid suffix when `kiln compile` cannot write
    `path` (before the model is compiled, so a typo costs no compile)."""
    suffix = Path(path).suffix.lower()
    outputs = compile_outputs()
    if suffix not in outputs:
        valid = ", ".join(f"{s} ({what})" for s, what in outputs.items())
        raise UsageError(f"-o {path!r}: kiln compile cannot write a "
                         f"{suffix or 'suffix-less'} file; valid suffixes: {valid}")
