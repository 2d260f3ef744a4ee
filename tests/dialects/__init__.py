"""Tests of the dialect registry (graphamp.dialects) with a third, toy dialect."""
