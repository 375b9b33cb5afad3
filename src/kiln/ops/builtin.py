"""Imports every module that registers built-in operators."""

from kiln.ops import elementwise, manip, nn, pool, reduce  # noqa: F401
