"""``graphamp --help`` and each command's ``--help`` import nothing heavy.

The parser is built before any command runs, so whatever the command modules import at their
top is paid by every invocation, ``--help`` included; numpy, onnx, onnx_ir (and sympy under
it), onnxruntime, rich, networkx and torch are imported by the commands that use them, when
they run. This checks *which modules* get imported (in a fresh interpreter), not how long it
takes: BENCHMARKS.md has the times.
"""

from __future__ import annotations

import json
import subprocess
import sys

from graphamp.cli import COMMANDS

HEAVY = (
    "numpy",
    "ml_dtypes",
    "onnx",
    "onnx_ir",
    "sympy",
    "onnxruntime",
    "google.protobuf",
    "rich",
    "networkx",
    "torch",
)

PROBE = """
import contextlib, io, json, sys
from graphamp.cli import main
heavy = {heavy!r}
found = {{}}
for argv in {argvs!r}:
    with contextlib.redirect_stdout(io.StringIO()) as out:
        try:
            main(argv)
        except SystemExit:
            pass
    assert "usage: graphamp" in out.getvalue(), (argv, out.getvalue()[:200])
    found[" ".join(argv)] = sorted(
        m for m in sys.modules if any(m == h or m.startswith(h + ".") for h in heavy)
    )
print(json.dumps(found))
"""


def test_help_imports_nothing_heavy() -> None:
    argvs = [["--help"], *([name, "--help"] for name in COMMANDS)]
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(heavy=HEAVY, argvs=argvs)],
        capture_output=True,
        text=True,
        check=True,
    )
    found = json.loads(done.stdout)
    assert list(found) == [" ".join(argv) for argv in argvs]
    # cumulative: a command's entry lists what it or any command before it imported
    assert found == {key: [] for key in found}


def test_a_command_that_runs_imports_what_it_needs() -> None:
    """The other side: lazy imports still happen (a command that runs has rich for its
    output), so the probe above can see a heavy module when one is imported."""
    probe = (
        "import contextlib, io, sys\n"
        "from graphamp.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    main(['lists'])\n"
        "print('rich' in sys.modules, 'numpy' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["True", "True"]


def test_converting_an_onnx_file_never_imports_onnx_ir(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The ONNX reader and writer work on the protobuf itself: onnx_ir (and sympy, which it
    imports) is left out of every conversion, a model with external data, bodies or
    model-local functions included; ``graphamp plan`` needs no onnxruntime either."""
    import onnx
    from onnx import helper

    from graphamp.models.control_flow import CASES
    from tests.helpers import chain

    source = tmp_path / "m.onnx"
    onnx.save(chain(["MatMul", "Relu", "MatMul"]), str(source))
    outside = tmp_path / "outside.onnx"
    onnx.save(
        chain(["MatMul", "Relu", "MatMul"]),
        str(outside),
        save_as_external_data=True,
        size_threshold=0,
    )
    nested = tmp_path / "nested.onnx"
    onnx.save(CASES["if_in_loop"]().model, str(nested))
    called = tmp_path / "called.onnx"
    plain = chain(["MatMul", "Relu", "MatMul"])
    first = plain.graph.node[0]
    body = helper.make_function(
        "local", "Mm", ["a", "b"], ["c"], [helper.make_node("MatMul", ["a", "b"], ["c"])],
        opset_imports=list(plain.opset_import),
    )  # fmt: skip
    first.op_type, first.domain = "Mm", "local"
    plain.functions.append(body)
    plain.opset_import.append(helper.make_opsetid("local", 1))
    plain.ir_version = max(plain.ir_version, 8)
    onnx.save(plain, str(called))
    probe = (
        "import contextlib, io, sys\n"
        "from graphamp.cli import main\n"
        "def run(*argv):\n"
        "    with contextlib.redirect_stdout(io.StringIO()):\n"
        "        assert main(list(argv)) == 0\n"
        "    return [m for m in ('onnx_ir', 'sympy', 'onnxruntime') if m in sys.modules]\n"
        f"print(run('plan', {str(source)!r}))\n"
        f"print(run('convert', {str(source)!r}, '-o', {str(tmp_path / 'out.onnx')!r}))\n"
        f"print(run('convert', {str(outside)!r}, '-o', {str(tmp_path / 'out2.onnx')!r}))\n"
        f"print(run('convert', {str(nested)!r}, '-o', {str(tmp_path / 'out3.onnx')!r}))\n"
        f"print(run('convert', {str(called)!r}, '-o', {str(tmp_path / 'out4.onnx')!r}))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.splitlines() == ["[]", *(["['onnxruntime']"] * 4)], done.stdout
