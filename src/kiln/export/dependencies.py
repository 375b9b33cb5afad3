"""External dependencies of a library: the code outside kiln that it links.

An `ExternalDependency` names one (a short name such as `cblas` or `libm`, where
it comes from and which versions work). They are collected from the tensor
IR's `call_extern` records (`kiln.ir.tensor.ExternDependency`, which the code
generators copy into artifact metadata as `extern_dependencies`) and from
artifacts that declare `external_dependencies` themselves. Exact duplicates are
dropped; two records with one short name that differ in any field are an
ExportError naming both sources. Model Library Format archives list them in
`metadata.json` (docs/mlf.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from kiln.errors import ExportError

URL_TYPES = ("path", "url", "git", "system")


@dataclass(frozen=True)
class ExternalDependency:
    """One external library: `url_type` is one of path, url, git, system."""

    short_name: str
    url: str = ""
    url_type: str = "system"
    version_spec: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.short_name, str) or not self.short_name.strip():
            raise ExportError(f"external dependency: short_name must be a non-empty string, "
                              f"got {self.short_name!r}")
        for name in ("url", "url_type", "version_spec"):
            if not isinstance(getattr(self, name), str):
                raise ExportError(f"external dependency '{self.short_name}': {name} must be "
                                  f"a string, got {getattr(self, name)!r}")
        if self.url_type not in URL_TYPES:
            raise ExportError(f"external dependency '{self.short_name}': url_type "
                              f"{self.url_type!r} is not one of {', '.join(URL_TYPES)}")

    def to_json(self) -> dict[str, str]:
        return asdict(self)

    @classmethod
    def from_json(cls, record: Mapping[str, Any], where: str) -> ExternalDependency:
        """From a metadata record (extra keys such as `libs` are ignored)."""
        if not isinstance(record, Mapping):
            raise ExportError(f"{where}: an external dependency must be an object, got "
                              f"{type(record).__name__}")
        return cls(short_name=record.get("short_name", ""), url=record.get("url", "") or "",
                   url_type=record.get("url_type", "") or "system",
                   version_spec=record.get("version_spec", "") or "")


def collect_dependencies(artifacts: Iterable[Any]) -> list[ExternalDependency]:
    """The external dependencies the artifacts record, deduplicated, in first-seen order."""
    found: dict[str, tuple[ExternalDependency, str]] = {}
    for a in artifacts:
        where = f"{a.codegen_id}/{a.file_name}"
        for key in ("extern_dependencies", "external_dependencies"):
            for record in a.metadata.get(key, ()) or ():
                dep = ExternalDependency.from_json(record, where)
                seen = found.get(dep.short_name)
                if seen is None:
                    found[dep.short_name] = (dep, where)
                elif seen[0] != dep:
                    raise ExportError(
                        f"external dependency '{dep.short_name}' is declared twice with "
                        f"different fields: {seen[0].to_json()} by {seen[1]} and "
                        f"{dep.to_json()} by {where}")
    return [dep for dep, _ in found.values()]


__all__ = ["URL_TYPES", "ExternalDependency", "collect_dependencies"]
