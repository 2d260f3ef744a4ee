"""Tests of the command line (graphamp.cli)."""
