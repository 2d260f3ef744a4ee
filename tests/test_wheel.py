"""The package as built: the wheel builds without setuptools' deprecation warnings,
holds the viewer's static files and the op lists, and runs ``graphamp --version`` and
``graphamp demo`` from outside the source tree. (tools/ci/check_wheel.sh does the same with a
fresh virtual environment and the dependencies installed from the package index.)

Here the wheel is built without build isolation and installed without its dependencies, which
the test takes from this environment's site-packages; Python starts without ``site`` (-S), so
that the editable install of the source tree is not on the path."""

from __future__ import annotations

import site
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent


def test_the_wheel_builds_cleanly_and_runs_outside_the_tree(tmp_path):
    dist, target = tmp_path / "dist", tmp_path / "site"
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-v",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(dist),
            str(REPO),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    output = build.stdout + build.stderr
    assert "BuildBackendWarning" not in output and "deprecated" not in output.lower(), output
    wheel = next(dist.glob("graphamp-*.whl"))
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(target), str(wheel)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    for packaged in (
        "viewer/static/viewer.js",
        "viewer/static/viewer.css",
        "lists/onnx_float16.toml",
    ):
        assert (target / "graphamp" / packaged).is_file(), packaged
    dependencies = [*site.getsitepackages(), sysconfig.get_paths()["purelib"]]
    env = {"PYTHONPATH": ":".join([str(target), *dependencies]), "PATH": "/usr/bin:/bin"}
    script = (
        "import sys, graphamp, graphamp.passes, graphamp.models\n"
        f"assert graphamp.__file__.startswith({str(target)!r}), graphamp.__file__\n"
        f"assert graphamp.passes.__file__.startswith({str(target)!r})\n"
        "from graphamp.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    outside = tmp_path / "elsewhere"
    outside.mkdir()

    def graphamp(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-S", "-c", script, *argv],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=outside,
            env=env,
        )

    version = graphamp("--version")
    assert version.returncode == 0 and version.stdout.strip() == "graphamp 0.2.0", version
    demo = graphamp("demo", "--model", "simplenet", "--keep", str(outside / "kept"))
    assert demo.returncode == 0, demo.stdout[-2000:] + demo.stderr[-2000:]
    assert "verification" in demo.stdout
    page = graphamp("plan", str(outside / "kept" / "simplenet.onnx"), "--format", "html")
    assert page.returncode == 0 and "<script>" in page.stdout, page.stderr[-2000:]
