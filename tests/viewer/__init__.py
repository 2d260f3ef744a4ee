"""Tests of the plan viewer (graphamp.viewer)."""
