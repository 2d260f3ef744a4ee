"""The README shows the op lists as they are in graphamp/lists/*.toml."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_readme_op_tables_match_the_list_data():
    spec = importlib.util.spec_from_file_location(
        "lists_markdown", ROOT / "tools/lists_markdown.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    readme = (ROOT / "README.md").read_text()
    start = readme.index("<!-- lists:start -->") + len("<!-- lists:start -->\n")
    end = readme.index("<!-- lists:end -->")
    assert readme[start:end] == module.lists_markdown(), "run tools/lists_markdown.py"
