"""Tests that keep the scripts under tools/ working."""
