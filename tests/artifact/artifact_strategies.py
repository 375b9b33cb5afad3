"""Hypothesis strategies and small helpers shared by the kiln.artifact tests."""

from __future__ import annotations

import hashlib
import struct
from typing import Any

from hypothesis import strategies as st

from kiln.artifact import Artifact, ArtifactSet

NAME_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.+-"

names = st.text(alphabet=NAME_CHARS, min_size=1, max_size=12).filter(
    lambda s: s[0] not in ".+-")
loaders = st.sampled_from(["native", "none", "llvmjit", "cuda", "dsp_loader"])
file_names = st.text(
    alphabet=st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp"),
                           blacklist_characters="/\\"),
    min_size=1, max_size=20,
).filter(lambda s: ".." not in s and s != "." and s.isprintable())

json_scalars = (st.none() | st.booleans() | st.integers(-(2**63), 2**63)
                | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=10))
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=12,
)
metadata = st.dictionaries(st.text(max_size=8), json_values, max_size=4)

artifacts = st.builds(Artifact, names, loaders, file_names, st.binary(max_size=64), metadata)


@st.composite
def artifact_sets(draw: Any, max_size: int = 8) -> ArtifactSet:
    items = draw(st.lists(artifacts, max_size=max_size, unique_by=lambda a: a.key))
    return ArtifactSet(items)


def reseal(blob: bytes | bytearray) -> bytes:
    """Recompute the SHA-256 trailer of a (possibly edited) blob, per docs/format.md."""
    body = bytes(blob[:-32])
    return body + hashlib.sha256(body).digest()


def assemble(sections: list[tuple[int, bytes]], *, version: int = 1, flags: int = 0,
             reserved: int = 0) -> bytes:
    """Build a blob from raw section bodies, following docs/format.md by hand."""
    header_size, entry_size = 32, 24
    offset = header_size + entry_size * len(sections)
    table = b""
    payload = b""
    for kind, body in sections:
        table += struct.pack("<IIQQ", kind, 0, offset + len(payload), len(body))
        payload += body
    total = offset + len(payload) + 32
    header = b"KILNBLOB" + struct.pack("<IIQII", version, flags, total, len(sections), reserved)
    body = header + table + payload
    return body + hashlib.sha256(body).digest()


def u32(*values: int) -> bytes:
    return b"".join(struct.pack("<I", v) for v in values)


def string(s: str | bytes) -> bytes:
    raw = s.encode() if isinstance(s, str) else s
    return u32(len(raw)) + raw
