"""`kiln build-many MATRIX -o DIR`: a models x targets matrix, built as tasks."""

from __future__ import annotations

import json
from pathlib import Path


def cmd_build_many(matrix_path: str, out_dir: str, address: str | None, in_process: bool,
                   cache_dir: str | None) -> tuple[str, bool]:
    """The summary text, and whether every cell was built."""
    from kiln.distributed import (  # heavy: kept off the cli's startup (kiln --help)
        build_many,
        load_matrix,
        make_executor,
        summary_table,
    )
    from kiln.distributed.build import (
        SUMMARY_FILE,  # heavy: kept off the cli's startup (kiln --help)
    )

    matrix = load_matrix(matrix_path)
    executor = make_executor(address, in_process=in_process)
    try:
        results = build_many(matrix, out_dir, executor=executor, cache_dir=cache_dir)
    finally:
        executor.close()
    where = json.loads((Path(out_dir) / SUMMARY_FILE).read_text())["where"]
    return summary_table(results, where), all(r.ok for r in results)
