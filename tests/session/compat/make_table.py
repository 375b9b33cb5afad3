"""Write the table of what differs between onnxruntime and kiln on the compatibility
scripts into docs/session.md (between its ort-compat-table markers).

    PYTHONPATH=src:tests:tests/session/compat python tests/session/compat/make_table.py
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from compat_table import outcomes, render, write, write_mlp


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        table = render(outcomes(write_mlp(Path(tmp) / "compat_mlp.onnx")))
    write(table)
    print(table)


if __name__ == "__main__":
    main()
