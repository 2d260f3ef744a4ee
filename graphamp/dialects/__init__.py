"""Dialects: one interface per kind of model, and the registry that finds them."""

from __future__ import annotations

from graphamp.dialects.base import Dialect, ReadGraph
from graphamp.dialects.registry import for_file, for_object, for_source, named, register

__all__ = ["Dialect", "ReadGraph", "for_file", "for_object", "for_source", "named", "register"]
