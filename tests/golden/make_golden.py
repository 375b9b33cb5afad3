"""Generate the dated golden files for the kiln blob and archive formats.

Run once per format version and check the output in; never regenerate an
existing file (it guards that newer kilns still read old files). Only the files
of the current versions that do not exist yet are written:

    .venv/bin/python tests/golden/make_golden.py 2026-11-22

tests/artifact/test_artifact_golden.py holds the expected contents, written
out by hand, and compares what the current reader finds in these files.
"""

from __future__ import annotations

import hashlib
import os
import sys

from kiln.artifact import Artifact, ArtifactSet, archive, blob

HERE = os.path.dirname(os.path.abspath(__file__))

# A library as the llvm codegen would lay it out, plus a JIT group and a
# nested loader so the import tree is more than one level deep.
LIBRARY_METADATA = {
    "format": "kiln.library", "version": 1, "kiln_version": "0.1.0", "prefix": "kiln_",
    "functions": {"add_one": {"name": "add_one", "symbol": "kiln_add_one", "kind": "tensor",
                              "params": [], "results": [], "tuple_result": False}},
    "note": "golden \u00e9\u2713",
}


def blob_contents() -> blob.BlobContents:
    arts = ArtifactSet([
        Artifact("host", "native", "host.c", b"int kiln__x = 1;\n", {"cflags": ["-O2"]}),
        Artifact("llvm", "native", "kernels.o", b"", {"linked": True, "size": 1234}),
        Artifact("llvm", "native", "constants.bin", b"",
                 {"symbol": "kiln__consts", "align": 64, "count": 2, "linked": True,
                  "size": 4096}),
        Artifact("llvm", "none", "kernels.bc", b"BC\xc0\xde\x00\x01\x02\x03"),
        Artifact("jit", "llvmjit", "kernels.bc", b"BC\xc0\xde\xff", {"opt": 3}),
        Artifact("jit", "llvmjit", "constants.bin", bytes(range(16)), {"align": 64}),
        # From blob version 3 the device artifact carries a target key.
        Artifact("dsp", "dsp_loader", "dsp-0123abcd_cmd.stream", b"\x01\x00\x00\x00RUN\x00",
                 {"device": "dsp0", "ratio": 0.5, "nested": {"a": [1, None, True]}},
                 target_key="dsp-0123abcd"),
    ])
    modules = (
        blob.ModuleNode("native", (0, 1, 2)),
        blob.ModuleNode("none", (3,)),
        blob.ModuleNode("llvmjit", (4, 5)),
        blob.ModuleNode("dsp_loader", (6,)),
    )
    # root imports none and llvmjit; llvmjit imports dsp_loader.
    row_ptr = (0, 2, 2, 3, 3)
    child_indices = (1, 2, 3)
    contents = blob.BlobContents(arts, modules, row_ptr, child_indices, LIBRARY_METADATA)
    # Version 2: the 4096 bytes of constants.bin (artifact 2; zeros here) follow the
    # blob, 64-byte aligned, hashed in one 4096-byte chunk.
    placed, _end = blob.place_linked(
        contents, [(2, 4096, 4096, hashlib.sha256(bytes(4096)).digest())], 64)
    return placed


def archive_artifacts() -> ArtifactSet:
    return ArtifactSet([
        Artifact("c", "native", "kernels.c", b"int kiln__kernel_f(float *x) { return 0; }\n",
                 {"cflags": ["-O2", "-ffast-math"]}),
        Artifact("host", "native", "host.c", b"/* host */\n"),
        Artifact("c", "native", "constants.bin", bytes([0, 0, 128, 63]) * 4,
                 {"symbol": "kiln__consts", "align": 64, "count": 1}),
        Artifact("llvm", "none", "kernels.bc", b"BC\xc0\xde\x35\x14\x00\x00"),
        # From archive version 2 artifacts carry a target key.
        Artifact("cuda", "cuda", "cuda-0123abcd_kernels.ptx", b"// PTX\n", {"arch": "sm_90"},
                 target_key="cuda-0123abcd"),
    ])


def main(date: str) -> None:
    blob_path = os.path.join(HERE, f"blob_v{blob.FORMAT_VERSION}_{date}.bin")
    tar_path = os.path.join(HERE, f"archive_v{archive.FORMAT_VERSION}_{date}.tar")
    blob_exists = any(n.startswith(f"blob_v{blob.FORMAT_VERSION}_") for n in os.listdir(HERE))
    tar_exists = any(n.startswith(f"archive_v{archive.FORMAT_VERSION}_")
                     for n in os.listdir(HERE))
    if blob_exists and tar_exists:
        sys.exit("golden files of the current versions exist; they are never regenerated")
    if not blob_exists:
        with open(blob_path, "wb") as f:
            f.write(blob.pack(blob_contents()))
        print(f"wrote {blob_path}")
    if not tar_exists:
        archive.write_tar(tar_path, archive_artifacts(), {"format": "kiln.library",
                                                          "version": 1, "prefix": "kiln_",
                                                          "functions": {}})
        print(f"wrote {tar_path}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "2026-11-22")
