"""Artifact.target_key: the device an artifact belongs to, with its file-name prefix."""

from __future__ import annotations

import pytest

from kiln.artifact import Artifact, ArtifactSet, InMemoryArtifact
from kiln.artifact.artifact import device_key, with_target_key


def test_with_target_key_prefixes_the_file_name() -> None:
    a = Artifact("cuda", "cuda", "kernels.ptx", b"// ptx\n", {"arch": "sm_90"})
    keyed = with_target_key(a, "cuda-0123abcd")
    assert (keyed.file_name, keyed.target_key) == ("cuda-0123abcd_kernels.ptx", "cuda-0123abcd")
    assert keyed.content == a.content and keyed.metadata == a.metadata
    # Same codegen and file, two devices: both fit in one set.
    other = with_target_key(a, "cuda-89abcdef")
    assert len(ArtifactSet([keyed, other, a])) == 3
    assert "target_key='cuda-0123abcd'" in repr(keyed)
    with pytest.raises(ValueError, match="already has target_key"):
        with_target_key(keyed, "cuda-89abcdef")
    mem = with_target_key(InMemoryArtifact("jit", "llvmjit", "k.bc", object()), "jit-1")
    assert mem.file_name == "jit-1_k.bc"


def test_bad_target_keys_are_value_errors() -> None:
    with pytest.raises(ValueError, match="must start with 'cuda-1_'"):
        Artifact("cuda", "cuda", "kernels.ptx", b"", target_key="cuda-1")
    with pytest.raises(ValueError, match="target_key '-x' is not a valid name"):
        Artifact("cuda", "cuda", "-x_k", b"", target_key="-x")
    with pytest.raises(ValueError, match="target_key must be a str"):
        Artifact("cuda", "cuda", "k", b"", target_key=3)  # type: ignore[arg-type]


def test_device_key_is_kind_and_fingerprint_prefix() -> None:
    assert device_key("cuda", "0123456789abcdef") == "cuda-01234567"
