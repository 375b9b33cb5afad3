"""Generate the dated golden file of the external weights file format.

Run once per format version and check the output in; never regenerate an
existing file. Only the file of the current version is written, if missing:

    .venv/bin/python tests/golden/make_weights_golden.py 2026-11-27

tests/artifact/test_weights_file.py holds the expected header, written out by
hand, and compares what the current reader finds in it.
"""

from __future__ import annotations

import os
import sys

from kiln.artifact import weights_file
from kiln.artifact.integrity import chunk_digests

HERE = os.path.dirname(os.path.abspath(__file__))
CHUNK = 4096
TENSORS = [("constants.bin", bytes(range(256)) * 20), ("extra.bin", b"\x01" * 100)]


def main(date: str) -> None:
    path = os.path.join(HERE, f"weights_v{weights_file.FORMAT_VERSION}_{date}.weights")
    if os.path.exists(path):
        print(f"{path} exists; golden files are never regenerated")
        return
    weights_file.write_weights(path, [(name, data, CHUNK, chunk_digests(data, CHUNK))
                                      for name, data in TENSORS])
    print(f"wrote {path}")


if __name__ == "__main__":
    main(sys.argv[1])
