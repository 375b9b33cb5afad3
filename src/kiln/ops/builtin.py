"""Imports every module that registers built-in operators."""

from kiln.ops import elementwise, nn  # noqa: F401
