"""Tests of graphamp.numerics and the numerics commands (calibrate, debug, tune)."""
