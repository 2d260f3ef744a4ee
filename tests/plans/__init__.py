"""Tests of graphamp.plans: plan files, their checks, reviewed plans applied."""
