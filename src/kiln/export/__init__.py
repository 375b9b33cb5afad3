"""Exporting compiled code: `export_library` (.so / .tar / .a) and its inverse `load_module`."""

from kiln.runtime.library import SUFFIXES, export_library
from kiln.runtime.loading import load_module

__all__ = ["SUFFIXES", "export_library", "load_module"]
