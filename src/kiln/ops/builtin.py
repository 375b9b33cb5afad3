"""Imports every module that registers built-in operators."""

from kiln.ops import elementwise, image, indexing, logic, manip, nn, pool, reduce  # noqa: F401
