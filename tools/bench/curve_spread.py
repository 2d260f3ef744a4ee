"""Is one configuration's loss curves inside the run-to-run spread of another's? Read again
from a saved ``bench_speedup.py --part curves`` result (``bench-speedup-curves-<model>.json``),
without training anything.

    python tools/bench/curve_spread.py speedup-results/bench-speedup-curves-bert-base.json

Three figures, windows of ``--width`` steps:

* the bench's: windows where every graphamp curve lies inside the min-max band of all
  autocast's (``gpu_train.within_spread``);
* the same count when the label is no information: all curves split at random into two sets
  of the two configurations' sizes (``--splits`` times, median and 5-95%). The bench's figure
  near this one means the curves cannot be told apart by it;
* held out (``gpu_train.held_out_inside``): the share of windows an autocast run lies inside
  the band of the other autocast runs, beside the share a graphamp run lies inside such a band.
  graphamp is within autocast's run-to-run spread where its share is not below autocast's own.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path
from typing import NoReturn

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "gpu"))

import gpu_train  # noqa: E402


def random_splits(
    ours: list[list[float]], theirs: list[list[float]], splits: int, width: int, seed: int = 0
) -> list[int]:
    """``within_spread``'s count for ``splits`` random partitions of all curves into sets of
    ``len(ours)`` and ``len(theirs)``."""
    pool, rng, counts = [*ours, *theirs], random.Random(seed), []
    for _ in range(splits):
        order = rng.sample(range(len(pool)), len(pool))
        first = [pool[i] for i in order[: len(ours)]]
        rest = [pool[i] for i in order[len(ours) :]]
        counts.append(gpu_train.within_spread(first, rest, width)[0])
    return counts


def fail(message: str) -> NoReturn:
    """One line on stderr, exit status 2: the input is at fault."""
    print(f"curve_spread: {message}", file=sys.stderr)
    raise SystemExit(2)


def report(path: Path, splits: int, width: int) -> list[str]:
    """One Markdown row a model in the file at ``path``."""
    try:
        results = json.loads(path.read_text())["results"]
    except (OSError, ValueError, KeyError) as error:
        fail(f"{path}: not a bench_speedup curves result ({error})")
    rows = []
    for model, result in results.items():
        if not isinstance(result, dict) or not {"autocast", "graphamp"} <= result.keys():
            fail(f"{path}: {model} has no autocast and graphamp curves")
        ours, theirs = result["graphamp"], result["autocast"]
        inside, count = gpu_train.within_spread(ours, theirs, width)
        null = sorted(random_splits(ours, theirs, splits, width))
        low, high = null[len(null) * 5 // 100], null[min(len(null) - 1, len(null) * 95 // 100)]
        held = gpu_train.held_out_inside(ours, theirs, width)
        held_cell = "-" if held is None else f"{held[1]:.0%} / {held[0]:.0%}"
        rows.append(
            f"| {model} | {len(theirs)} / {len(ours)} | {inside}/{count} | "
            f"{statistics.median(null):g} ({low}-{high}) | {held_cell} |"
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", type=Path, help="bench-speedup-curves-*.json")
    parser.add_argument("--width", type=int, default=10, help="steps a window (the bench's 10)")
    parser.add_argument("--splits", type=int, default=1000, help="random splits for the null")
    args = parser.parse_args(argv)
    rows = [row for path in args.results for row in report(path, args.splits, args.width)]
    print(
        "| model | runs, autocast / graphamp | windows with every graphamp run inside autocast's "
        "band | the same for random splits of all runs, median (5-95%) | a run's windows inside "
        "the band of the other autocast runs, autocast / graphamp |"
    )
    print("|---|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
