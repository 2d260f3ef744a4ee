"""Tests of the ONNX dialect (graphamp.onnx) on models nobody here wrote."""
