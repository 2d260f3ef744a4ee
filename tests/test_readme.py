"""The README and the guides in docs/ run as written.

Every fenced code block of README.md and docs/*.md is an example that a test runs, unless its
info string says otherwise. The first word of the info string is the language, as GitHub reads
it; a second word names who runs the block:

* ```` ```python ````: run here, each block on its own (a fresh namespace), in document order;
* ```` ```sh ````: run here with bash (``-euo pipefail``), ``graphamp`` on the PATH;
* ```` ```toml ```` whose first line is ``# FILE``: written to FILE before the blocks after it
  (a policy file, say, that a later ``sh`` block names);
* ```` ```python torchrun ```` and ```` ```sh torchrun ````: a script and its command line,
  run on two processes by tests/training/test_distributed.py and tests/training/test_sharded.py;
* ```` ```python optimum ```` and ```` ```sh optimum ````: run in Optimum's environment by
  tests/onnx/test_optimum.py;
* ```` ```sh setup ````: the set-up commands at the top of the README (CI runs them);
* ```` ```python sketch ```` and ```` ```text ```` (or no language): a shape, a synopsis or
  an output, not an example.

The blocks of one file run in one fresh folder holding ``model.onnx`` (the zoo's small BERT),
so a later block may read what an earlier one wrote.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.helpers import doc_blocks, fenced_blocks

ROOT = Path(__file__).resolve().parent.parent
DOCS = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
OP_LISTS = "docs/policies.md"  # the page that shows the default op lists

RUN_HERE = {"python", "sh", "toml"}
NOT_EXAMPLES = {"", "text"}
RUN_ELSEWHERE = {"torchrun", "optimum", "setup"}


def test_the_op_tables_match_the_list_data():
    spec = importlib.util.spec_from_file_location(
        "lists_markdown", ROOT / "tools/lists/lists_markdown.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    page = (ROOT / OP_LISTS).read_text()
    start = page.index("<!-- lists:start -->") + len("<!-- lists:start -->\n")
    end = page.index("<!-- lists:end -->")
    assert page[start:end] == module.lists_markdown(), "run tools/lists/lists_markdown.py"


def readme_blocks(language: str, runner: str = "") -> list[str]:
    return doc_blocks("README.md", language, runner)


def test_every_code_block_is_an_example_someone_runs_or_says_it_is_not():
    for document in DOCS:
        for language, runner, text in fenced_blocks(document):
            where = f"{document}: a ```{language} {runner} block starting {text[:60]!r}"
            if runner:
                assert runner in RUN_ELSEWHERE | {"sketch"}, where
                assert language in {"python", "sh"}, where
            else:
                assert language in RUN_HERE | NOT_EXAMPLES, where
            if language == "toml":
                assert re.fullmatch(r"# [\w.-]+\.toml", text.splitlines()[0]), (
                    f"{where}: a TOML example starts with '# NAME.toml', the file it is"
                )
    # the blocks run elsewhere are the ones those tests look for
    assert len(doc_blocks("docs/distributed.md", "python", "torchrun")) == 2
    assert len(doc_blocks("docs/distributed.md", "sh", "torchrun")) == 2
    assert len(doc_blocks("docs/onnx.md", "python", "optimum")) == 1
    assert len(doc_blocks("docs/onnx.md", "sh", "optimum")) == 1


def run_blocks(document: str, folder: Path) -> int:
    """Run the blocks of ``document`` that this module runs, in order, in ``folder``; the
    number run."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])
    env = {**os.environ, "PATH": path}
    count = 0
    for index, (language, runner, text) in enumerate(fenced_blocks(document)):
        if runner:
            continue
        where = f"{document} block {index + 1} ({language})"
        if language == "python":
            exec(compile(text, where, "exec"), {})
        elif language == "sh":
            done = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", text],
                cwd=folder,
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
            )
            assert done.returncode == 0, f"{where}: exit {done.returncode}\n{done.stderr[-3000:]}"
        elif language == "toml":
            name = text.splitlines()[0].removeprefix("# ")
            (folder / name).write_text(text + "\n")
        else:
            continue
        count += 1
    return count


@pytest.mark.slow
@pytest.mark.parametrize("document", [d for d in DOCS if d != "docs/ARCHITECTURE.md"])
def test_the_examples_run_as_written(document, tmp_path, monkeypatch):
    """Every example of the page runs as written, next to the ``model.onnx`` the examples
    name (the small BERT of the zoo)."""
    from graphamp.models import export_onnx

    export_onnx("bert", tmp_path / "model.onnx", "small")
    monkeypatch.chdir(tmp_path)
    ran = run_blocks(document, tmp_path)
    elsewhere = [b for b in fenced_blocks(document) if b[1] in RUN_ELSEWHERE]
    assert ran or elsewhere, f"{document} has no example"


def test_the_architecture_page_holds_no_example():
    """docs/ARCHITECTURE.md shows shapes (the data flow, the Pass contract), not examples."""
    blocks = fenced_blocks("docs/ARCHITECTURE.md")
    assert blocks and all(lang in NOT_EXAMPLES or who == "sketch" for lang, who, _ in blocks)


def anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_every_link_between_the_pages_leads_somewhere():
    """A relative link of README.md or docs/*.md names a file that exists and, after '#', a
    heading of it."""
    for document in DOCS:
        page = ROOT / document
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # not inside code
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue  # a URL
            path, _, fragment = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            assert linked.exists(), f"{document}: link to {target}: no such file"
            if fragment:
                headings = re.findall(r"^#+ (.+)$", linked.read_text(), flags=re.M)
                assert fragment in {anchor(h) for h in headings}, (
                    f"{document}: link to {target}: no such heading"
                )


def test_benchmarks_open_with_one_current_table_per_area():
    """BENCHMARKS.md opens with the current figure of each area beside the peer's, each row
    with its ratio, command, machine (one of the machines it lists) and date; the history
    follows."""
    text = (ROOT / "BENCHMARKS.md").read_text()
    current = text[text.index("## Current figures") : text.index("## History")]
    machines = set(re.findall(r"^\| ([\w-]+) \| .+ \|$", text[: text.index("## Current")], re.M))
    areas = re.split(r"^### ", current, flags=re.M)[1:]
    assert len(areas) >= 5 and machines
    for area in areas:
        rows = [line for line in area.splitlines() if line.startswith("|")]
        header = [cell.strip() for cell in rows[0].strip("|").split("|")]
        title = area.splitlines()[0]
        assert header[-3:] == ["command", "machine", "date"] and "/" in header[-4], title
        for row in rows[2:]:
            cells = [cell.strip() for cell in row.strip("|").split("|")]
            assert len(cells) == len(header), f"{title}: {row}"
            assert cells[-2].split(",")[0] in machines, f"{title}: machine of {row}"
            assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", cells[-1]), f"{title}: date of {row}"


EVERYDAY = re.compile(r'pytest -m "([^"]+)"')


def registered_markers() -> set[str]:
    with open(ROOT / "pyproject.toml", "rb") as file:
        settings = tomllib.load(file)["tool"]["pytest"]["ini_options"]
    assert "--strict-markers" in settings["addopts"].split()
    return {line.split(":")[0] for line in settings["markers"]}


def test_the_everyday_subset_leaves_out_every_registered_marker():
    """The README's and ARCHITECTURE's everyday command says ``not M`` for each marker that
    pyproject.toml registers (and only those, joined by ``and``)."""
    markers = registered_markers()
    assert markers == {"slow", "compile", "dist", "browser"}
    for document in ("README.md", "docs/ARCHITECTURE.md"):
        commands = EVERYDAY.findall((ROOT / document).read_text())
        assert commands, f"{document}: no everyday test command (pytest -m \"...\")"
        for expression in commands:
            terms = expression.split(" and ")
            assert all(term.startswith("not ") for term in terms), (document, expression)
            assert {term.removeprefix("not ") for term in terms} == markers, (document, expression)


MARKER_CENSUS = '''
import json, os
import pytest

@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    census = {item.nodeid: sorted({m.name for m in item.iter_markers()}) for item in items}
    with open(os.environ["MARKER_CENSUS"], "w") as out:
        json.dump(census, out)
'''


@pytest.mark.slow
def test_the_everyday_subset_keeps_most_tests_and_each_marker_marks_some(tmp_path):
    """Collected with a plugin that records every test's markers before -m deselects any:
    the README's expression keeps the tests that carry none of them, at least half the suite,
    and each marker marks some test."""
    (tmp_path / "marker_census.py").write_text(MARKER_CENSUS)
    expression = EVERYDAY.findall((ROOT / "README.md").read_text())[0]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
        "MARKER_CENSUS": str(tmp_path / "census.json"),
    }
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "marker_census",
         "-p", "no:cacheprovider", "-m", expression, str(ROOT / "tests")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    census = json.loads((tmp_path / "census.json").read_text())
    markers = registered_markers()
    kept = {test for test, names in census.items() if not markers & set(names)}
    selected = {line for line in done.stdout.splitlines() if "::" in line}
    assert selected == kept
    assert len(kept) >= len(census) / 2, f"{len(kept)} of {len(census)}"
    for marker in markers:
        assert any(marker in names for names in census.values()), marker
