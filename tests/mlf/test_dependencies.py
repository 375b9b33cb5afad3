"""External dependencies: collected from artifacts, deduplicated, conflicts named."""

from __future__ import annotations

import pytest

from kiln.artifact import Artifact
from kiln.errors import ExportError
from kiln.export.dependencies import ExternalDependency, collect_dependencies

CBLAS = {"short_name": "cblas", "url": "https://www.openblas.net", "url_type": "url",
         "version_spec": ">=0.3", "libs": ["-lopenblas"]}


def _art(name: str, key: str, *records: dict[str, object]) -> Artifact:
    return Artifact("llvm", "native", name, b"\0", {key: list(records)})


def test_duplicates_dropped_and_fields_kept() -> None:
    deps = collect_dependencies([_art("a.o", "extern_dependencies", CBLAS),
                                 _art("b.o", "external_dependencies", CBLAS,
                                      {"short_name": "libm", "url_type": "system"})])
    assert deps == [ExternalDependency("cblas", "https://www.openblas.net", "url", ">=0.3"),
                    ExternalDependency("libm", "", "system", "")]
    assert deps[0].to_json() == {"short_name": "cblas", "url": "https://www.openblas.net",
                                 "url_type": "url", "version_spec": ">=0.3"}


def test_conflict_names_both_sources() -> None:
    other = {**CBLAS, "version_spec": ">=0.2"}
    with pytest.raises(ExportError, match=r"'cblas' is declared twice .*llvm/a\.o.*llvm/b\.o"):
        collect_dependencies([_art("a.o", "extern_dependencies", CBLAS),
                              _art("b.o", "extern_dependencies", other)])


@pytest.mark.parametrize("bad", [{"short_name": ""}, {"short_name": "x", "url_type": "ftp"},
                                 {"short_name": "x", "url": 3}])
def test_bad_records(bad: dict[str, object]) -> None:
    with pytest.raises(ExportError):
        collect_dependencies([_art("a.o", "extern_dependencies", bad)])
