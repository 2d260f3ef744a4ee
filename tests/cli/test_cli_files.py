"""The user's files are sacred: every path a command writes is checked, before any
work, against every path it reads and every other path it writes, by identity (symbolic and
hard links included); all outputs of one command land together or none does; a folder that
cannot be written and a file that cannot be read are the user's mistake (exit 2, naming it);
a temporary file that a killed run left behind is removed by the next run into its folder.

Permission cases run as an unprivileged user when the tests run as root (root reads and writes
anything): the effective user is switched for the command, in folders everyone may enter."""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import onnx
import pytest

from graphamp.cli import main
from graphamp.core.io import temp_prefix
from tests.helpers import chain

NOBODY = 65534


@pytest.fixture()
def folder() -> Iterator[Path]:
    """A folder every user may enter and write (for the unprivileged cases)."""
    path = Path(tempfile.mkdtemp(prefix="graphamp-files-"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture()
def small(folder: Path) -> Path:
    path = folder / "m.onnx"
    onnx.save(chain(["MatMul", "Softmax", "MatMul", "Exp"]), str(path))
    path.chmod(0o644)
    return path


@pytest.fixture()
def data(folder: Path) -> Path:
    path = folder / "x.npz"
    np.savez(path, x=np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32))
    path.chmod(0o644)
    return path


@functools.cache
def warm_imports() -> None:
    """Convert and plan a model once as root: the interpreter's standard library may lie where
    the unprivileged user cannot read it (a Python under /root), so what the commands import
    lazily is imported first; the user's own Python is readable to them."""
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "m.onnx"
        onnx.save(chain(["MatMul", "Softmax", "MatMul"]), str(model))
        assert main(["convert", str(model), "-o", str(Path(tmp) / "o.onnx")]) == 0
        assert main(["plan", str(model), "-o", str(Path(tmp) / "p.txt")]) == 0


@contextmanager
def unprivileged() -> Iterator[None]:
    """Run the block as a user without root's right to read and write anything."""
    if os.geteuid() != 0:
        yield
        return
    warm_imports()
    os.setegid(NOBODY)
    os.seteuid(NOBODY)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)


def digest(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (hidden ones too) and its content's hash."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def refused(capsys: pytest.CaptureFixture[str], argv: list[str], *fragments: str) -> str:
    """Run ``argv``: exit 2, one line on stderr holding every fragment."""
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


@pytest.fixture()
def converted(small: Path, folder: Path) -> Path:
    out = folder / "out.onnx"
    assert main(["convert", str(small), "-o", str(out)]) == 0
    return out


# ---- never write over a file read or written ----------------------------------------------


def clobbering_commands(folder: Path, small: Path, data: Path, converted: Path) -> list:
    m, out, d = str(small), str(converted), str(data)
    config = folder / "ok.toml"
    config.write_text("[graphamp]\ndeny = ['Exp']\n")
    plan = folder / "reviewed.json"
    assert main(["plan", m, "--format", "json", "-o", str(plan)]) == 0
    new = str(folder / "new.onnx")
    return [
        (["convert", m, "-o", new, "--plan", m], "--plan would overwrite the model IN"),
        (["convert", m, "-o", new, "--plan", new], "-o and --plan name the same file"),
        (["convert", m, "-o", d, "--verify", "--inputs", d], "-o would overwrite --inputs"),
        (["convert", m, "-o", str(config), "--config", str(config)], "would overwrite --config"),
        (["convert", m, "-o", str(plan), "--from-plan", str(plan)], "overwrite --from-plan"),
        (["convert", m, "-o", d, "--calibrate", str(folder)], "-o would overwrite --calibrate"),
        (["plan", m, "-o", m], "-o would overwrite the model MODEL"),
        (["debug", m, out, "--inputs", d, "-o", m], "-o would overwrite the model IN"),
        (["debug", m, out, "--inputs", d, "-o", out], "would overwrite the model CONVERTED"),
        (["debug", m, out, "--inputs", d, "--plan", str(plan), "-o", str(plan)], "--plan"),
        (["diff", m, out, "-o", out], "-o would overwrite B"),
        (["check", m, "--baseline", m, "--update"], "baseline would overwrite the model"),
        (["tune", m, "-o", new, "--inputs", d, "--rtol", "0.1", "--plan", m], "the model IN"),
        (["tune", m, "-o", d, "--inputs", d, "--rtol", "0.1"], "-o would overwrite --inputs"),
    ]


def test_no_command_writes_over_a_file_it_reads_or_another_output(
    capsys, folder, small, data, converted
):
    cases = clobbering_commands(folder, small, data, converted)
    before = digest(folder)
    for argv, message in cases:
        refused(capsys, argv, message, "nothing was written")
        assert digest(folder) == before, argv  # nothing written, nothing left behind


def test_a_symbolic_or_hard_link_to_a_file_read_is_that_file(capsys, folder, small):
    (folder / "link.onnx").symlink_to(small)
    os.link(small, folder / "hard.onnx")
    before = digest(folder)
    refused(
        capsys,
        ["convert", str(small), "-o", str(folder / "link.onnx")],
        "would overwrite the model IN",
        "through a symbolic link",
    )
    refused(
        capsys,
        [
            "convert",
            str(small),
            "-o",
            str(folder / "out.onnx"),
            "--plan",
            str(folder / "hard.onnx"),
        ],
        "through a hard link",
    )
    # a folder reached through a link: the same file under another path
    (folder / "via").symlink_to(folder, target_is_directory=True)
    refused(capsys, ["plan", str(small), "-o", str(folder / "via" / "m.onnx")], "m.onnx")
    assert digest(folder) == before


def test_external_data_files_are_read_files_too(capsys, folder):
    proto = chain(["MatMul", "Relu", "MatMul"])
    source = folder / "model.onnx"
    onnx.save(proto, str(source), save_as_external_data=True, location="w.bin", size_threshold=0)
    before = digest(folder)
    refused(capsys, ["convert", str(source), "-o", str(folder / "w.bin")], "data file")
    # the output's own data file (OUT.data) would be the input's
    (folder / "w.bin").rename(folder / "out.onnx.data")
    proto = chain(["MatMul", "Relu", "MatMul"])  # (saving set the first one's locations)
    onnx.save(
        proto, str(source), save_as_external_data=True, location="out.onnx.data", size_threshold=0
    )
    before = digest(folder)
    line = refused(capsys, ["convert", str(source), "-o", str(folder / "out.onnx")])
    assert "-o's data file would overwrite the model IN's data file" in line
    assert digest(folder) == before


def test_check_update_refuses_two_entries_with_one_baseline(capsys, folder, small):
    config = folder / "graphamp.toml"
    config.write_text(
        '[[graphamp.check]]\nmodel = "m.onnx"\nbaseline = "b.json"\n'
        '[[graphamp.check]]\nmodel = "m.onnx"\nbaseline = "./b.json"\n'
    )
    refused(capsys, ["check", "--config", str(config), "--update"], "name the same file")
    assert not (folder / "b.json").exists()


# ---- all outputs or none ------------------------------------------------------------------


def test_outputs_land_together_or_not_at_all(capsys, folder, small, monkeypatch):
    """The model is staged until the plan is written too: a failure writing the plan leaves
    neither, not OUT without its plan."""
    from graphamp.plans.plan import Plan

    def broken(self, path):  # type: ignore[no-untyped-def]
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Plan, "save", broken)
    before = digest(folder)
    argv = ["convert", str(small), "-o", str(folder / "o.onnx"), "--plan", str(folder / "p")]
    assert main(argv) == 3  # not the user's mistake: an internal error, and nothing written
    assert digest(folder) == before


def test_an_unwritable_plan_folder_writes_no_model(capsys, folder, small):
    locked = folder / "ro"
    locked.mkdir(mode=0o555)
    locked.chmod(0o555)
    out = folder / "out3.onnx"
    with unprivileged():
        line = refused(
            capsys,
            ["convert", str(small), "-o", str(out), "--plan", str(locked / "plan.json")],
            "permission denied",
            str(locked),
        )
    assert "--plan" in line and not out.exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["convert", "{m}", "-o", "{ro}/out.onnx"],
        ["plan", "{m}", "-o", "{ro}/plan.txt"],
        ["check", "{m}", "--baseline", "{ro}/b.json", "--update"],
        ["demo", "--model", "simplenet", "--keep", "{ro}/kept"],
        ["tune", "{m}", "-o", "{ro}/t.onnx", "--inputs", "{d}", "--rtol", "0.1"],
    ],
)
def test_an_unwritable_folder_is_the_users_mistake(capsys, folder, small, data, argv):
    locked = folder / "ro"
    locked.mkdir()
    locked.chmod(0o555)
    argv = [a.format(m=small, ro=locked, d=data) for a in argv]
    with unprivileged():
        refused(capsys, argv, "permission denied", str(locked), "nothing was written")
    assert list(locked.iterdir()) == []


def test_an_unreadable_model_or_data_file_says_permission_denied(capsys, folder, small, data):
    out = str(folder / "out.onnx")
    small.chmod(0o000)
    with unprivileged():
        refused(capsys, ["convert", str(small), "-o", out], "permission denied", str(small))
        refused(capsys, ["plan", str(small)], "permission denied")
    small.chmod(0o644)
    data.chmod(0o000)
    with unprivileged():
        refused(
            capsys,
            ["convert", str(small), "-o", out, "--verify", "--inputs", str(data)],
            "permission denied",
            "--inputs",
        )
    assert not Path(out).exists()


# ---- what a killed run leaves behind ------------------------------------------------------


def test_a_temporary_file_left_by_sigkill_is_removed_by_the_next_run(folder, small):
    """A write killed by SIGKILL (no handler runs) leaves its hidden temporary file; the next
    run into that folder removes graphamp's own leftovers of dead processes, nothing else."""
    script = (
        "import os, signal\n"
        "from pathlib import Path\n"
        "from graphamp.core.io import write_atomic_with\n"
        f"write_atomic_with(Path({str(folder / 'out.onnx')!r}),\n"
        "                  lambda tmp: os.kill(os.getpid(), signal.SIGKILL))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], timeout=60)
    assert done.returncode == -signal.SIGKILL
    left = [p for p in folder.iterdir() if p.name.startswith(".out.onnx.graphamp-")]
    assert len(left) == 1
    mine = folder / f"{temp_prefix(folder / 'x')}keep.tmp"  # this live process's: kept
    mine.write_text("in use")
    other = folder / ".notes.swp"  # not graphamp's pattern: kept
    other.write_text("editor")
    assert main(["convert", str(small), "-o", str(folder / "out.onnx")]) == 0
    assert not left[0].exists()
    assert mine.exists() and other.exists()


def test_a_file_in_a_folder_the_user_may_not_enter_says_permission_denied(capsys, folder):
    closed = folder / "closed"
    closed.mkdir()
    onnx.save(chain(["MatMul", "Relu"]), str(closed / "m.onnx"))
    closed.chmod(0o700)  # root's: an unprivileged user may not enter it
    out = folder / "out.onnx"
    with unprivileged():
        refused(capsys, ["convert", str(closed / "m.onnx"), "-o", str(out)], "permission denied")
        refused(capsys, ["plan", str(closed / "m.onnx")], "permission denied")
        refused(capsys, ["plan", str(closed)], "permission denied")  # a folder MODEL too
    assert not out.exists()
