"""Artifact, InMemoryArtifact and ArtifactSet: what a codegen hands back.

An artifact is plain data (docs/artifacts.md): which codegen made it, which
loader loads it, a file name unique within the codegen, the bytes, and a small
read-only JSON metadata mapping. Nothing here knows a codegen or a runtime.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, TypeAlias

from kiln.artifact._json import FrozenDict, freeze_object, thaw
from kiln.artifact.segments import Content, Segments, content_parts
from kiln.errors import ArgumentTypeError, ArtifactError, ExportError

# codegen ids and loader names end up as directory names (archives) and in
# error messages: keep them short, printable and free of path syntax.
_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+\-]*")
MAX_NAME_LEN = 64
MAX_FILE_NAME_LEN = 255

# Loader names with a fixed meaning (common.md): code linked into the host
# library, and artifacts carried for inspection only.
NATIVE = "native"
NONE = "none"


def check_name(field_name: str, value: object) -> str:
    """Validate a codegen id or loader name; ArtifactError naming the field otherwise."""
    if not isinstance(value, str):
        raise ArtifactError(f"{field_name} must be a str, got {type(value).__name__} {value!r}")
    if not value:
        raise ArtifactError(f"{field_name} must not be empty")
    if len(value) > MAX_NAME_LEN or not _NAME_RE.fullmatch(value):
        raise ArtifactError(
            f"{field_name} {value!r} is not a valid name: use at most {MAX_NAME_LEN} "
            "letters, digits, '_', '.', '+' or '-', not starting with '.', '+' or '-'")
    return value


def check_file_name(value: object) -> str:
    """Validate a file name: one path component, no `..`, no NUL, valid UTF-8."""
    if not isinstance(value, str):
        raise ArtifactError(f"file_name must be a str, got {type(value).__name__} {value!r}")
    if not value:
        raise ArtifactError("file_name must not be empty")
    problem = None
    if "/" in value or "\\" in value:
        problem = "contains a path separator; it must be a single file name"
    elif "\0" in value:
        problem = "contains a NUL character"
    elif value == "." or ".." in value:
        problem = "must not be '.' or contain '..'"
    elif len(value) > MAX_FILE_NAME_LEN:
        problem = f"is longer than {MAX_FILE_NAME_LEN} characters"
    else:
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            problem = "is not encodable as UTF-8"
        else:
            if not value.isprintable():
                problem = "contains a control character"
    if problem:
        raise ArtifactError(f"file_name {value!r} {problem}")
    return value


def check_target_key(key: object, file_name: str) -> str:
    """Validate a target key ("" or a short name) and the file-name prefix it implies."""
    if key == "":
        return ""
    check_name("target_key", key)
    assert isinstance(key, str)
    if not file_name.startswith(f"{key}_"):
        raise ArtifactError(f"file_name {file_name!r} of an artifact with target_key {key!r} "
                         f"must start with '{key}_' (see with_target_key)")
    return key


def device_key(kind: str, fingerprint: str) -> str:
    """The target key of a device target: its kind and 8 hex digits of its fingerprint."""
    return f"{kind}-{fingerprint[:8]}"


def with_target_key(artifact: AnyArtifact, key: str) -> AnyArtifact:
    """`artifact` marked as generated for device target `key`, its file name prefixed."""

    if artifact.target_key:
        raise ArtifactError(f"artifact {artifact.codegen_id}/{artifact.file_name} already has "
                         f"target_key {artifact.target_key!r}")
    return replace(artifact, file_name=f"{key}_{artifact.file_name}", target_key=key)


def _check_metadata(value: object) -> FrozenDict:
    return freeze_object(value, "metadata")


def extension(file_name: str) -> str:
    """The lower-cased last suffix of a file name ('.o', '.bc', '' if none)."""
    dot = file_name.rfind(".")
    return file_name[dot:].lower() if dot > 0 else ""


@dataclass(frozen=True)
class Artifact:
    """One piece of generated code or data, as plain bytes plus metadata.

    `content` is bytes, a read-only memoryview of bytes kept as is, or
    `Segments` (pieces never joined): a large weight blob is not copied for its
    artifact. Write content with `kiln.artifact.segments.write_content`.

    `codegen_id` names the codegen that made it, `loader` the loader that turns
    it into runnable code (`"native"`: linked into the host library; `"none"`:
    carried for inspection only; any other name: a runtime loader), and
    `file_name` is unique within the codegen. Invalid fields raise ArtifactError (a
    ValueError).

    `target_key` names the device target the artifact was generated for in a
    heterogeneous build ("" for the host's, or a single-target build's): a short
    stable name such as `cuda-1a2b3c4d` (`device_key`). The file name then starts
    with `<target_key>_`, so two devices' artifacts stay distinct in every
    container (blob, archive, MLF); `with_target_key` adds both.
    """

    codegen_id: str
    loader: str
    file_name: str
    content: Content = field(repr=False)
    metadata: Mapping[str, Any] = field(default_factory=FrozenDict)
    target_key: str = ""

    serializable: ClassVar[bool] = True

    def __post_init__(self) -> None:
        check_name("codegen_id", self.codegen_id)
        check_name("loader", self.loader)
        check_file_name(self.file_name)
        check_target_key(self.target_key, self.file_name)
        content = self.content
        if isinstance(content, str):
            raise ArtifactError("content must be bytes, got str; encode text with .encode()")
        if isinstance(content, Segments):
            object.__setattr__(self, "metadata", _check_metadata(self.metadata))
            return
        if not isinstance(content, (bytes, bytearray, memoryview)):
            raise ArtifactError(f"content must be bytes, got {type(content).__name__}")
        # A read-only byte view is kept as it is (the weights of a large model are
        # not copied for their artifact, see ConstantPool); anything else is frozen
        # into bytes.
        if not (isinstance(content, memoryview) and content.readonly and
                content.contiguous and content.format == "B" and content.ndim == 1):
            object.__setattr__(self, "content", bytes(content))
        object.__setattr__(self, "metadata", _check_metadata(self.metadata))

    @property
    def key(self) -> tuple[str, str]:
        """(codegen_id, file_name): unique within an ArtifactSet."""
        return (self.codegen_id, self.file_name)

    @property
    def size(self) -> int:
        """Number of content bytes."""
        return len(self.content)

    @property
    def extension(self) -> str:
        return extension(self.file_name)

    def sha256(self) -> str:
        """Hex SHA-256 of the content."""
        h = hashlib.sha256()
        for part in content_parts(self.content):
            h.update(part)
        return h.hexdigest()

    def __repr__(self) -> str:
        key = f", target_key={self.target_key!r}" if self.target_key else ""
        return (f"Artifact({self.codegen_id!r}, {self.loader!r}, {self.file_name!r}, "
                f"<{self.size} bytes>, metadata={dict(self.metadata)!r}{key})")


@dataclass(frozen=True, eq=False)
class InMemoryArtifact:
    """An artifact that is a live Python object (a JIT module, a Python callable).

    It can be loaded in this process by its loader but never written to disk:
    `.content` raises ExportError. Equality is identity.
    """

    codegen_id: str
    loader: str
    file_name: str
    value: object = field(repr=False)
    metadata: Mapping[str, Any] = field(default_factory=FrozenDict)
    target_key: str = ""

    serializable: ClassVar[bool] = False

    def __post_init__(self) -> None:
        check_name("codegen_id", self.codegen_id)
        check_name("loader", self.loader)
        check_file_name(self.file_name)
        check_target_key(self.target_key, self.file_name)
        object.__setattr__(self, "metadata", _check_metadata(self.metadata))

    @property
    def key(self) -> tuple[str, str]:
        return (self.codegen_id, self.file_name)

    @property
    def size(self) -> None:
        """In-memory artifacts have no byte size."""
        return None

    @property
    def extension(self) -> str:
        return extension(self.file_name)

    @property
    def content(self) -> bytes:
        """Always raises ExportError: an in-memory artifact has no bytes."""
        raise ExportError(
            f"artifact {self.codegen_id}/{self.file_name} lives in memory (loader "
            f"'{self.loader}') and cannot be exported; run it in this process with "
            "Executable.jit(), or compile for a target whose codegen writes files "
            "(e.g. 'llvm' or 'c') to export a library")

    def __repr__(self) -> str:
        return (f"InMemoryArtifact({self.codegen_id!r}, {self.loader!r}, {self.file_name!r}, "
                f"value={type(self.value).__name__}, metadata={dict(self.metadata)!r})")


AnyArtifact: TypeAlias = Artifact | InMemoryArtifact


def require_serializable(artifact: AnyArtifact) -> Artifact:
    """`artifact` if it is plain data; ExportError (from `.content`) otherwise."""
    if isinstance(artifact, Artifact):
        return artifact
    artifact.content  # noqa: B018  (raises the ExportError that explains why)
    raise AssertionError("unreachable")


class ArtifactSet:
    """An ordered collection of artifacts, unique by (codegen_id, file_name)."""

    def __init__(self, artifacts: Iterable[AnyArtifact] = ()) -> None:
        self._items: dict[tuple[str, str], AnyArtifact] = {}
        self.extend(artifacts)

    # -- building ---------------------------------------------------------
    def add(self, artifact: AnyArtifact) -> None:
        """Append `artifact`; a second one with the same (codegen_id, file_name) is an
        ArtifactError."""
        if not isinstance(artifact, (Artifact, InMemoryArtifact)):
            raise ArgumentTypeError(
                f"an ArtifactSet holds Artifact or InMemoryArtifact, got {type(artifact).__name__}")
        if artifact.key in self._items:
            raise ArtifactError(
                f"duplicate artifact {artifact.codegen_id}/{artifact.file_name}: file names "
                "must be unique within a codegen")
        self._items[artifact.key] = artifact

    def extend(self, artifacts: Iterable[AnyArtifact]) -> None:
        for a in artifacts:
            self.add(a)

    # -- access -----------------------------------------------------------
    def __iter__(self) -> Iterator[AnyArtifact]:
        return iter(self._items.values())

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, item: object) -> bool:
        """`artifact in s` (an equal artifact is present) or `(codegen_id, file_name) in s`."""
        if isinstance(item, (Artifact, InMemoryArtifact)):
            return self._items.get(item.key) == item
        if isinstance(item, tuple) and len(item) == 2:
            return item in self._items
        return False

    def __getitem__(self, index: int) -> AnyArtifact:
        return list(self._items.values())[index]

    def get(self, codegen_id: str, file_name: str,
            default: AnyArtifact | None = None) -> AnyArtifact | None:
        """The artifact `codegen_id/file_name`, or `default`."""
        return self._items.get((codegen_id, file_name), default)

    def by_loader(self) -> dict[str, list[AnyArtifact]]:
        """Artifacts grouped by loader, groups in order of first appearance."""
        out: dict[str, list[AnyArtifact]] = {}
        for a in self:
            out.setdefault(a.loader, []).append(a)
        return out

    def by_codegen(self) -> dict[str, list[AnyArtifact]]:
        """Artifacts grouped by codegen_id, groups in order of first appearance."""
        out: dict[str, list[AnyArtifact]] = {}
        for a in self:
            out.setdefault(a.codegen_id, []).append(a)
        return out

    def filter(self, *, loader: str | None = None, codegen_id: str | None = None) -> ArtifactSet:
        """A new set with the artifacts matching every given criterion, order kept."""
        return ArtifactSet(
            a for a in self
            if (loader is None or a.loader == loader)
            and (codegen_id is None or a.codegen_id == codegen_id))

    @property
    def serializable(self) -> bool:
        """True if every artifact is plain data (the set can be exported)."""
        return all(a.serializable for a in self)

    def to_manifest(self) -> list[dict[str, Any]]:
        """One JSON-able dict per artifact: names, loader, size, sha256, metadata.

        In-memory artifacts appear with `"serializable": false` and no size/hash.
        """
        out = []
        for a in self:
            entry: dict[str, Any] = {
                "codegen_id": a.codegen_id, "loader": a.loader, "file_name": a.file_name,
                "serializable": a.serializable,
                "size": a.size,
                "sha256": a.sha256() if isinstance(a, Artifact) else None,
                "metadata": thaw(a.metadata),
            }
            if a.target_key:
                entry["target_key"] = a.target_key
            out.append(entry)
        return out

    def inspect(self) -> str:
        """A plain-text table: codegen_id, loader, file_name, size, metadata summary."""
        from kiln.artifact.inspect import (
            summary_table,  # cycle: kiln.artifact.inspect imports this module
        )

        return summary_table(self)

    # -- comparison -------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ArtifactSet):
            return NotImplemented
        return list(self._items.values()) == list(other._items.values())

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        names = ", ".join(f"{a.codegen_id}/{a.file_name}" for a in self)
        return f"ArtifactSet([{names}])"

