"""Does a change leave what graphamp writes alone? Convert the same models with another revision
of graphamp and with this tree, and compare the output models and plans byte for byte.

    python tools/ci/same_outputs.py --base origin/main     # zoo, small and full, both dtypes
    python tools/ci/same_outputs.py --base HEAD~3 --sizes small --models bert,gpt --flags=

The base revision is checked out as a git worktree under ``--dir`` and run from this
environment (its ``graphamp``, ``graphamp.passes`` and ``graphamp.models`` found in the worktree
first), each conversion a whole ``graphamp convert IN -o OUT --plan PLAN --dtype D`` process, as
users run it, with each of ``--flags`` (default: none, then ``--keep-io-types``); this tree runs
the same commands. The models are exported once (``--dir``) from
``graphamp.models`` of this tree. Exit status 1 when any output or plan differs.
"""

from __future__ import annotations

import argparse
import filecmp
import itertools
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Runs graphamp's CLI from the tree given first: a finder placed before every other one maps the
# package and the two folders pyproject.toml installs inside it (passes/, models/).
RUNNER = """
import importlib.abc, importlib.util, sys
from pathlib import Path
tree = Path(sys.argv.pop(1))
ROOTS = {"graphamp": tree / "graphamp", "graphamp.passes": tree / "passes",
         "graphamp.models": tree / "models"}

class TreeFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        folder = ROOTS.get(name)
        if folder is None:
            return None
        return importlib.util.spec_from_file_location(
            name, folder / "__init__.py", submodule_search_locations=[str(folder)])

sys.meta_path.insert(0, TreeFinder())
import graphamp.cli
assert Path(graphamp.cli.__file__).is_relative_to(tree), graphamp.cli.__file__
sys.exit(graphamp.cli.main(sys.argv[1:]))
"""


def worktree(base: str, folder: Path) -> Path:
    """A detached worktree of ``base`` in ``folder`` (made again if it holds another commit)."""
    commit = git("rev-parse", f"{base}^{{commit}}")
    if folder.exists():
        if git("-C", str(folder), "rev-parse", "HEAD") == commit:
            return folder
        git("worktree", "remove", "--force", str(folder))
    git("worktree", "add", "--detach", str(folder), commit)
    return folder


def git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()


def export(models: list[str], sizes: list[str], folder: Path) -> list[Path]:
    from graphamp.models import export_onnx

    paths = []
    folder.mkdir(parents=True, exist_ok=True)
    for size in sizes:
        for name in models:
            path = folder / f"{name}.{size}.onnx"
            if not path.exists():
                print(f"... exporting {name} ({size})", file=sys.stderr)
                export_onnx(name, path, size)
            paths.append(path)
    return paths


def convert(tree: Path, model: Path, out: Path, plan: Path, dtype: str, flags: str) -> None:
    command = [sys.executable, "-c", RUNNER, str(tree), "convert", str(model), "-o", str(out)]
    command += ["--plan", str(plan), "--dtype", dtype, *flags.split()]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command[3:])} failed in {tree}:\n{done.stderr[-2000:]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the revision to compare with")
    parser.add_argument("--models", default="simplenet,mnist,resnet,bert,gpt")
    parser.add_argument("--sizes", default="small,full")
    parser.add_argument("--dtypes", default="float16,bfloat16")
    parser.add_argument(
        "--flags",
        default=",--keep-io-types",
        help="comma-separated sets of extra convert flags, each run (default: none, then "
        "--keep-io-types)",
    )
    parser.add_argument("--dir", default=str(ROOT / "bench-out" / "same"), help="work folder")
    args = parser.parse_args()
    folder = Path(args.dir)
    folder.mkdir(parents=True, exist_ok=True)
    base = worktree(args.base, folder / "base-tree")
    trees = {"base": base, "this": ROOT}
    print(f"base {git('-C', str(base), 'log', '-1', '--format=%h %<(70,trunc)%s')}")
    print(f"this {git('log', '-1', '--format=%h %<(70,trunc)%s')} (+ the working tree's changes)")
    differ = 0
    for model in export(args.models.split(","), args.sizes.split(","), folder / "models"):
        for dtype, flags in itertools.product(args.dtypes.split(","), args.flags.split(",")):
            files: dict[str, tuple[Path, Path]] = {}
            for label, tree in trees.items():
                variant = "".join(flags.split()).strip("-") or "default"
                out = folder / "out" / label / f"{model.stem}.{dtype}.{variant}.onnx"
                plan = out.with_suffix(".plan.json")
                out.parent.mkdir(parents=True, exist_ok=True)
                convert(tree, model, out, plan, dtype, flags)
                files[label] = (out, plan)
            same = [
                filecmp.cmp(a, b, shallow=False)
                for a, b in zip(files["base"], files["this"], strict=True)
            ]
            verdict = "same" if all(same) else "DIFFERENT " + str(same)
            size = files["this"][0].stat().st_size
            label = f"{model.stem} {dtype} {flags}".strip()
            print(f"{label:40} model and plan: {verdict} ({size} bytes)")
            differ += not all(same)
    print("every output and plan byte-identical" if not differ else f"{differ} differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
