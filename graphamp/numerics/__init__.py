"""Numerics: value ranges and calibration batches, random inputs, verification against the float32
model, and the search behind ``tune``."""
