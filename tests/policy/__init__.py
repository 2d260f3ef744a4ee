"""Tests of graphamp.policy.policy."""
