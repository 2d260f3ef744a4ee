"""The command-line fuzzer's file cases (``python tools/fuzz/fuzz.py --cli``: one seed in five runs
one besides its damaged file): the user's files are sacred.

Seed by seed, a random command (convert, plan, diff, debug, check --update, explain) runs
in-process over a valid model and its companions (an .npz of inputs, a policy file, a plan),
with one of:

* an output that is a file the command reads, through the same path, a symbolic link or a
  hard link (``-o`` onto the model, its --inputs, --config, --from-plan, the other model of
  debug or diff, a baseline), or two outputs naming one file;
* an output folder the command may not write, or an input file it may not read (run as an
  unprivileged user when the fuzzer runs as root);
* nothing wrong (the control: the command may succeed).

It must then exit 2 with one error line, change no file of the folder and leave nothing in it
(a clobbering or permission case), or keep the rules every run keeps (the control).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
from fuzz_graphs import random_case

NOBODY = 65534


def check_files(seed: int, folder: Path, run, judge, outcomes) -> list[str]:  # type: ignore[no-untyped-def]
    """One file case (module docstring); ``run``, ``judge`` and ``outcomes`` are fuzz_cli's."""
    rng = np.random.default_rng(seed)
    folder.chmod(0o777)
    folder.parent.chmod(0o711)  # an unprivileged run enters it
    model = folder / "m.onnx"
    onnx.save(random_case(seed).model, str(model))
    data = folder / "d.npz"
    if not _inputs(model, data):
        outcomes["files: a model with no inputs to feed"] += 1
        return []
    config = folder / "amp.toml"
    config.write_text("[graphamp]\ndeny = ['Exp']\n")
    plan = folder / "p.json"
    status, err = run(["plan", str(model), "--format", "json", "-o", str(plan)])
    if status != 0:  # the model is refused by plan itself: fuzz_cli's other cases cover that
        outcomes[f"files: plan exit {status}"] += 1
        return []
    other = folder / "c.onnx"
    status, _ = run(["convert", str(model), "-o", str(other)])
    reads = {"model": model, "data": data, "config": config, "plan": plan, "other": other}
    kind = int(rng.integers(4))
    argv, expect_refusal = _case(kind, rng, folder, reads)
    for path in folder.rglob("*"):
        if path.is_file():
            path.chmod(0o644)
    if kind == 2:  # an input the command may not read
        victim = reads[str(rng.choice(["model", "data", "config"]))]
        if str(victim) not in argv:
            victim = model
        victim.chmod(0o000)
    before = _digest(folder)
    with _unprivileged(kind in (2, 3)):
        status, err = run(argv)
    case = ("clobber", "twice", "unreadable", "unwritable")[kind] if expect_refusal else "control"
    outcomes[f"files: {argv[0]} {case} exit {status}"] += 1
    problems = judge(status, err, [])
    if expect_refusal:
        if status != 2:
            problems.append(f"{' '.join(argv)}: exit {status}, not refused: {err.strip()[:200]}")
        if _digest(folder) != before:
            problems.append(f"{' '.join(argv)}: files changed or left behind")
    return problems


def _inputs(model: Path, data: Path) -> bool:
    from graphamp.numerics.inputs import random_inputs
    from graphamp.onnx.dialect.plugin import OnnxDialect

    try:
        specs = OnnxDialect().input_specs(model)
    except Exception:
        return False
    if not specs:
        return False
    np.savez(data, **random_inputs(specs))
    return True


def _case(kind: int, rng: np.random.Generator, folder: Path, reads: dict[str, Path]):  # type: ignore[no-untyped-def]
    """(argv, whether it must be refused) for ``kind``: 0 an output onto a read file, 1 two
    outputs naming one file, 2 an unreadable input, 3 an unwritable output folder."""
    m, d, c, p, o = (str(reads[k]) for k in ("model", "data", "config", "plan", "other"))
    commands = {  # name: (arguments, the output flags, the files read)
        "convert": (
            ["convert", m, "--verify", "--inputs", d, "--config", c],
            ["-o", "--plan"],
            [m, d, c],
        ),
        "from-plan": (["convert", m, "--from-plan", p], ["-o", "--plan"], [m, p]),
        "plan": (["plan", m, "--config", c], ["-o"], [m, c]),
        "diff": (["diff", m, o], ["-o"], [m, o]),
        "debug": (["debug", m, o, "--inputs", d, "--plan", p], ["-o"], [m, o, d, p]),
        "check": (["check", m, "--update"], ["--baseline"], [m]),
    }
    command = str(rng.choice(sorted(commands)))
    argv, flags, read = commands[command]
    argv = list(argv)
    model_out = command in ("convert", "from-plan")
    fresh = {
        flag: str(folder / f"out{index}{'.onnx' if flag == '-o' and model_out else '.json'}")
        for index, flag in enumerate(flags)
    }
    if kind == 0:
        victim = Path(read[int(rng.integers(len(read)))])
        how = int(rng.integers(3))
        target = victim
        if how == 1:
            target = folder / "link"
            target.symlink_to(victim)
        elif how == 2:
            target = folder / "hard"
            os.link(victim, target)
        fresh[flags[int(rng.integers(len(flags)))]] = str(target)
    elif kind == 1 and len(flags) > 1:
        fresh[flags[1]] = fresh[flags[0]]
    elif kind == 1:
        return [*argv, *_flat(fresh)], False  # one output only: the control
    elif kind == 3:
        locked = folder / "ro"
        locked.mkdir()
        locked.chmod(0o555)
        fresh[flags[0]] = str(locked / Path(fresh[flags[0]]).name)
    return [*argv, *_flat(fresh)], True


def _flat(flags: dict[str, str]) -> list[str]:
    return [item for flag, value in flags.items() for item in (flag, value)]


def _digest(folder: Path) -> dict[str, str]:
    found = {}
    for path in sorted(folder.rglob("*")):
        if path.is_symlink() or not path.is_file():
            found[str(path)] = "link" if path.is_symlink() else "folder"
            continue
        try:
            found[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
        except PermissionError:
            found[str(path)] = f"unreadable {path.stat().st_size}"
    return found


@contextlib.contextmanager
def _unprivileged(needed: bool) -> Iterator[None]:
    """Run the block as an unprivileged user when running as root (root reads and writes any
    file: a permission case would test nothing)."""
    if not needed or os.geteuid() != 0:
        yield
        return
    os.setegid(NOBODY)
    os.seteuid(NOBODY)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)
