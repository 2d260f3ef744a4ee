"""What the graphamp commands share: the policy flags, reading a model or plan file through
its dialect, and the plan's text (verification: :mod:`graphamp.cli.verification`).

The flags are defined with light imports only (the parser is built for ``--help`` too); what
runs a command (numpy, rich, the engine, the dialects) is imported inside the functions."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from graphamp.core.vocab import TARGET_TYPES, ListName
from graphamp.errors import GraphampError, PolicyWarning

if TYPE_CHECKING:
    from graphamp.core.graph import OpGraph
    from graphamp.dialects.base import Dialect
    from graphamp.passes.options import Options
    from graphamp.plans.plan import Plan
    from graphamp.policy.policy import Policy

DTYPES = TARGET_TYPES
LISTS = tuple(ListName)
POLICY_FLAGS = (
    "dtype",
    "target",
    "spread",
    "keep_io_types",
    "keep_io",
    "no_fuse",
    "inline_functions",
    *LISTS,
    "deny_name",
    "allow_name",
    "deny_tensor",
    "config",
)


def _ops(text: str) -> list[str]:
    ops = [op.strip() for op in text.split(",") if op.strip()]
    if not ops:
        raise argparse.ArgumentTypeError("expected a comma-separated list of op types")
    return ops


def add_policy_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "policy",
        "What runs in low precision. OPS is a comma-separated list of op types; naming "
        "an op under one flag moves it out of the other lists. Flags win over --config.",
    )
    group.add_argument(
        "--dtype",
        choices=DTYPES,
        help="target type (default float16; bfloat16 for .pt2 programs; or the config's)",
    )
    group.add_argument(
        "--target",
        choices=("cuda", "cpu", "any"),
        help="ONNX: the onnxruntime provider the model is for (default cuda). An op goes low "
        "only where that provider has a kernel for the low type (otherwise rule no_kernel: "
        "a missing kernel is a silent fallback with copies); any: no kernel check",
    )
    group.add_argument(
        "--no-fuse",
        action="store_true",
        default=None,
        help="ONNX: keep a decomposed RMSNorm's or LayerNorm's own ops instead of the fused op "
        "that reads the low type with no Cast (RMSNormalization at opset 23+, "
        "LayerNormalization at 17+; for --target cuda/cpu onnxruntime's Skip* forms, after a "
        "residual Add or, below those opsets, reading the norm's input as input and skip "
        "with epsilon x4; the plan's rewrites)",
    )
    group.add_argument(
        "--inline-functions",
        action="store_true",
        default=None,
        help="ONNX: write each call of a model-local function with its body inline (nodes "
        "named <call>/<function>/<node>, as in the plan) instead of as a call of a copy of "
        "the function specialised to its precisions",
    )
    group.add_argument(
        "--spread",
        choices=("cost", "tensorflow", "autocast", "all"),
        help="how infer and clear ops are decided: cost (ONNX default: the precisions and Cast "
        "places that move the fewest bytes through Casts and stored weights, a minimum cut; "
        "a tie goes low), "
        "tensorflow (TensorFlow's colouring, graphamp's rule before cost existed), autocast "
        "(type promotion, the default for PyTorch) or all (every float op low that its schema "
        "and the target's kernels allow, unlisted ones and If/Loop/Scan bodies included, "
        "unless a deny-list op, a name or tensor rule, a weight's or calibrated range or tune "
        "keeps it float32; deny does not spread: onnxconverter-common's and Paddle O2's way)",
    )
    group.add_argument(
        "--keep-io-types",
        action="store_true",
        default=None,
        help="keep every graph input and output in its float32 type",
    )
    group.add_argument(
        "--keep-io",
        metavar="NAMES",
        action="append",
        default=[],
        help="keep these graph inputs/outputs (comma-separated, repeatable) in float32",
    )
    for name, meaning in (
        ("allow", "that always run in low precision (unless a name rule denies them)"),
        (
            "infer",
            "that may run in either type, as --spread decides: cost (the ONNX default) takes "
            "the type that moves fewer bytes through Casts and weights; autocast (the PyTorch "
            "default) follows type promotion; tensorflow puts them low between low-precision "
            "ops; all puts them low",
        ),
        (
            "clear",
            "that do not care about the float type (Reshape, Transpose, Relu): decided as "
            "infer ops, except that under --spread tensorflow they follow any low-precision "
            "neighbour",
        ),
        (
            "deny",
            "that always stay float32; under --spread cost or tensorflow, deny spreads forward "
            "to the infer and clear ops on a path to a deny or infer op",
        ),
    ):
        group.add_argument(
            f"--{name}",
            type=_ops,
            metavar="OPS",
            action="extend",
            help=f"op types {meaning}",
        )
    group.add_argument(
        "--deny-name",
        action="append",
        default=[],
        metavar="GLOB",
        help="keep nodes whose name or module path matches GLOB in float32 (repeatable)",
    )
    group.add_argument(
        "--allow-name",
        action="append",
        default=[],
        metavar="GLOB",
        help="run nodes whose name or module path matches GLOB low wherever their schema, "
        "kernel and weights allow, whatever the op lists say (repeatable; plan rule "
        "allow_name; a --deny-name match wins); in a model that already computes low, the "
        "way to lower a float32 op it keeps (rule kept)",
    )
    group.add_argument(
        "--deny-tensor",
        action="append",
        default=[],
        metavar="NAME",
        help="keep every op reading or writing tensor NAME in float32 (repeatable)",
    )
    group.add_argument(
        "--config",
        metavar="FILE",
        help="a TOML policy file with a [graphamp] table (see docs/policies.md)",
    )
    group.add_argument(
        "--strict",
        action="store_true",
        help="a policy rule that matches nothing in the model (an op no node has, a name no "
        "node or tensor has) is an error, not a warning",
    )


def policy_flags_given(args: argparse.Namespace) -> list[str]:
    """The policy flags set on the command line, as the user spelt them."""
    given = []
    for name in POLICY_FLAGS:
        value = getattr(args, name, None)
        if value not in (None, [], False):
            given.append("--" + name.replace("_", "-"))
    return given


def policy_from_args(args: argparse.Namespace, dialect: Dialect) -> Policy:
    """The policy of the flags (and ``--config``) for a model of ``dialect``."""
    from graphamp.policy.policy import Policy

    overrides: dict[str, object] = {"dialect": dialect.lists}
    onnx_only = [
        flag
        for flag, value in (
            ("--target", getattr(args, "target", None)),
            ("--no-fuse", getattr(args, "no_fuse", None)),
            ("--inline-functions", getattr(args, "inline_functions", None)),
        )
        if value
    ]
    if onnx_only and not dialect.lists.startswith("onnx"):
        warnings.warn(
            f"{', '.join(onnx_only)} only change{'s' if len(onnx_only) == 1 else ''} ONNX "
            f"models: ignored for this {dialect.name} model",
            PolicyWarning,
            stacklevel=2,
        )
    if args.dtype:
        overrides["dtype"] = args.dtype
    if getattr(args, "target", None):
        overrides["target"] = args.target
    if getattr(args, "spread", None):
        overrides["spread"] = args.spread
    if getattr(args, "no_fuse", None):
        overrides["fuse"] = False
    if getattr(args, "inline_functions", None):
        overrides["inline_functions"] = True
    if args.keep_io_types and args.keep_io:
        raise GraphampError("--keep-io-types keeps every input and output: drop --keep-io")
    if args.keep_io_types:
        overrides["keep_io_types"] = True
    elif args.keep_io:
        overrides["keep_io_types"] = [n for text in args.keep_io for n in text.split(",") if n]
    for name in LISTS:
        if getattr(args, name):
            overrides[name] = getattr(args, name)
    if args.deny_name:
        overrides["deny_names"] = args.deny_name
    if args.allow_name:
        overrides["allow_names"] = args.allow_name
    if args.deny_tensor:
        overrides["deny_tensors"] = args.deny_tensor
    if args.config:
        return Policy.from_toml(args.config, default_dtype=dialect.default_dtype, **overrides)
    return Policy.from_mapping(
        {}, where="command line", default_dtype=dialect.default_dtype, **overrides
    )


def plan_of(path: str | Path, args: argparse.Namespace) -> tuple[OpGraph | None, Plan]:
    """(graph or None, Plan) of a model file (through its dialect, under the policy flags of
    ``args``) or of a plan file."""
    from graphamp import engine
    from graphamp.dialects.registry import for_file, named_by_suffix
    from graphamp.numerics.batches import load_input_batches
    from graphamp.plans.plan import PLAN_FORMAT, Plan, is_json_object, is_plan_file, looks_like_json

    path = Path(path)
    if is_plan_file(path):
        if getattr(args, "calibrate", None):
            raise GraphampError(f"{path}: --calibrate needs a model, not a plan file")
        return None, Plan.load(path)
    if looks_like_json(path) and named_by_suffix(path) is None:  # read as ONNX: a parse error
        if not is_json_object(path):  # what is wrong with it as JSON, as --from-plan says it:
            Plan.load(path)  # a BOM, nested too deeply, an array, a syntax error
        raise GraphampError(  # listing every field of ModelProto
            f'{path}: a JSON file but not a graphamp plan (no "format": "{PLAN_FORMAT}" at its '
            "start): give a model, or a plan that plan --format json or convert --plan wrote"
        )
    from graphamp.cli.numerics import check_fp8_flags, float8_option

    dialect = for_file(path)
    options = policy_options(args)
    check_fp8_flags(args)
    fp8 = float8_option(args, dialect, path)
    if fp8 is not None:
        options = dataclasses.replace(options, fp8=fp8)
    if getattr(args, "calibrate", None):  # plan --calibrate DATA
        batches = load_input_batches(args.calibrate, dialect.input_specs(path))
        if fp8 is not None:
            ranges = dialect.calibrate(path, batches, histograms=True)
        else:
            ranges = dialect.calibrate(path, batches)
        options = dataclasses.replace(options, ranges=ranges)
    analysis = engine.analyse(
        path, policy_from_args(args, dialect), dialect=dialect, options=options
    )
    return analysis.graph, analysis.plan


def policy_options(args: argparse.Namespace) -> Options:
    """Pass options the policy flags set (``--strict``)."""
    from graphamp.passes.options import Options

    return Options(strict=bool(getattr(args, "strict", False)))


def shown(text: object) -> str:
    """``text`` (a name, a path, a list of them: what comes from the files) for a rich
    console or table: :func:`printable`, and its ``[...]`` escaped, which rich would
    otherwise take for markup (``[/]`` in a tensor name was an internal error)."""
    from rich.markup import escape

    from graphamp.core.text import printable

    return escape(printable(str(text)))


def emit(text: str, args: argparse.Namespace) -> None:
    """``text`` to ``-o FILE`` (staged with the command's other outputs), or to stdout."""
    if getattr(args, "output", None):
        args.outputs.path(args.output).write_bytes(text.encode("utf-8"))
    else:
        sys.stdout.write(text)


def plan_text(model: str | Path, args: argparse.Namespace) -> str:
    """The plan of ``model`` in ``args.format``."""
    from graphamp import viewer
    from graphamp.plans import report

    graph, plan = plan_of(model, args)
    if args.format == "json":
        text = plan.to_json()
    elif args.format == "html":
        if graph is None:
            raise GraphampError(f"{model}: --format html needs a model, not a plan file")
        text = viewer.plan_page(plan, graph)
    else:
        text = report.text_table(plan)
    return text
