"""Tests of the PyTorch dialect (graphamp.fx): modules, .pt2 programs."""
