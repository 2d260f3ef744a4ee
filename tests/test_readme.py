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


def readme_blocks(language: str) -> list[str]:
    """The README's fenced code blocks in ``language``, in order."""
    blocks, current = [], None
    for line in (ROOT / "README.md").read_text().splitlines():
        if current is None and line.strip() == f"```{language}":
            current = []
        elif current is not None and line.strip() == "```":
            blocks.append("\n".join(current))
            current = None
        elif current is not None:
            current.append(line)
    return blocks


OPTIMUM_ENVIRONMENT = "# (in Optimum's environment)"  # tests/test_optimum.py runs these


def test_readme_python_examples_run(tmp_path, monkeypatch):
    """Every Python example in the README runs as written, each on its own, next to the
    `model.onnx` the ONNX example names (the small BERT of the zoo); those that run in
    Optimum's environment run in tests/test_optimum.py."""
    from graphamp.models import export_onnx

    blocks = [b for b in readme_blocks("python") if not b.startswith(OPTIMUM_ENVIRONMENT)]
    assert len(blocks) >= 4
    export_onnx("bert", tmp_path / "model.onnx", "small")
    monkeypatch.chdir(tmp_path)
    for index, block in enumerate(blocks):
        exec(compile(block, f"README.md python block {index + 1}", "exec"), {})
    assert (tmp_path / "model.fp16.onnx").exists() and (tmp_path / "optimizer.pt").exists()
