"""The neutral dataflow graph and what every other part of graphamp shares: dtypes, the vocabulary,
names, atomic file writing, progress. Imports nothing of graphamp above it (but
:mod:`graphamp.errors`)."""
