"""Policies: the op lists and rules a conversion follows, and the TOML they come from."""
