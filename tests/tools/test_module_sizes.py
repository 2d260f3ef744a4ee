"""tools/ci/module_sizes.py, the module-size report that replaced the 400-line cap: it counts
what it says, lists every module, longest first, and filters as asked."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def sizes():
    spec = importlib.util.spec_from_file_location("module_sizes", ROOT / "tools/ci/module_sizes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_code_lines_leave_out_blanks_comments_and_docstrings(sizes):
    source = '''"""A module
docstring."""

# a comment
def f(x):
    """f's docstring."""
    return (x +  # a trailing comment: its line is code
            1)
'''
    assert sizes.code_lines(source) == 3  # def, return, the continued expression


@pytest.mark.slow
def test_every_module_is_listed_longest_first(sizes, capsys):
    assert sizes.main([]) == 0
    rows = capsys.readouterr().out.splitlines()
    body, total = rows[:-1], rows[-1]
    names = [row.split()[2] for row in body]
    assert sorted(names) == sorted(sizes.modules())
    assert "graphamp.engine" in names and "graphamp.passes.base" in names
    lines = [int(row.split()[0]) for row in body]
    assert lines == sorted(lines, reverse=True)
    engine = (ROOT / "graphamp" / "engine.py").read_text()
    assert f"{len(engine.splitlines()):6d}" in body[names.index("graphamp.engine")]
    assert total.endswith(f"{len(body)} modules") and int(total.split()[0]) == sum(lines)


@pytest.mark.slow
def test_over_and_top_filter(sizes, capsys):
    sizes.main(["--over", "300", "--top", "3"])
    body = capsys.readouterr().out.splitlines()[:-1]
    assert 0 < len(body) <= 3
    assert all(int(row.split()[0]) > 300 for row in body)
