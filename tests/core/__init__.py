"""Tests of graphamp.core: the neutral graph, its scopes, names."""
