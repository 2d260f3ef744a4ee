"""Tests of the passes (passes/, installed as graphamp.passes)."""
