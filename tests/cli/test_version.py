"""One version source: `kiln.__version__`, which pyproject reads and `kiln --version` prints."""

from __future__ import annotations

import tomllib
from importlib import metadata

from kiln_cli import ROOT

import kiln


def test_pyproject_reads_the_version_from_the_package() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"]
    assert "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "kiln.__version__"}


def test_installed_metadata_agrees() -> None:
    """The installed distribution (named in pyproject: `kiln` is taken on the package
    index) reports the package's version."""
    name = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["name"]
    assert name == "kiln-tensor"
    assert metadata.version(name) == kiln.__version__
