"""One version, said the same everywhere: pyproject.toml, graphamp.__version__, ``graphamp
--version`` and the newest release in CHANGELOG.md."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

import graphamp
from graphamp.cli import main

ROOT = Path(__file__).resolve().parent.parent


def test_the_package_the_command_and_the_changelog_name_one_version(capsys):
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert graphamp.__version__ == project["version"]
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"graphamp {graphamp.__version__}"
    releases = re.findall(r"^## (\d+\.\d+\.\d+) ", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert releases[0] == graphamp.__version__, "CHANGELOG.md's newest release"
    assert "0.1.0" in releases
