"""The shape the design asks for: no import circle (type hints included), passes that import
neither onnx nor torch, the CLI with no file-suffix checks; the package root only its public face,
the rest in packages by concern with graphamp.core at the bottom, and tests and tools in folders
by what they serve. Module length is a report (tools/ci/module_sizes.py), not a rule."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"graphamp": ROOT / "graphamp", "graphamp.passes": ROOT / "passes"}


def modules() -> dict[str, Path]:
    found = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((package, *parts))] = path
    # graphamp.passes lives in passes/, not in graphamp/passes
    return {name: path for name, path in found.items() if "graphamp.graphamp" not in name}


def imports(
    path: Path, known: dict[str, Path] | None = None, *, type_checking: bool = True
) -> set[str]:
    """Every module ``path`` imports, at any depth: function-level imports count, and so do
    ``if TYPE_CHECKING:`` blocks unless ``type_checking`` is false (a circle through a type
    hint is still two modules that cannot be read apart). ``from package import module``
    counts as an import of that module, not of the package; relative imports are resolved."""
    known = known or {}
    here = next((name for name, file in known.items() if file == path), "")
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    names: set[str] = set()
    pending: list[ast.AST] = [ast.parse(path.read_text())]
    while pending:
        node = pending.pop()
        if (
            not type_checking
            and isinstance(node, ast.If)
            and ast.unparse(node.test) == "TYPE_CHECKING"
        ):
            pending.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{module}".rstrip(".")
            for alias in node.names:
                full = f"{module}.{alias.name}"
                names.add(full if full in known else module)
        pending.extend(ast.iter_child_nodes(node))
    return names


def test_no_import_circle():
    known = modules()
    graph = nx.DiGraph()
    for name, path in known.items():
        graph.add_node(name)
        for target in imports(path, known):
            if target in known and target != name:
                graph.add_edge(name, target)
    cycles = list(nx.simple_cycles(graph))
    assert not cycles, cycles


def test_passes_import_neither_onnx_nor_torch():
    for name, path in modules().items():
        if name.startswith("graphamp.passes"):
            runtime = imports(path, type_checking=False)
            top = {target.partition(".")[0] for target in runtime}
            assert not top & {"onnx", "onnx_ir", "onnxruntime", "torch"}, name


def test_the_cli_checks_no_file_suffix():
    for path in (ROOT / "graphamp" / "cli").glob("*.py"):
        text = path.read_text()
        assert ".suffix" not in text and '".pt2"' not in text and '".onnx"' not in text, path


# The root of graphamp/ is its public face; everything else lives in a package named by its
# concern (docs/ARCHITECTURE.md, "Layout").
ROOT_MODULES = {"__init__.py", "engine.py", "errors.py"}
# Loose files at tests/: checks of the whole tree and helpers several test folders share.
ROOT_TESTS = {
    "__init__.py",
    "conftest.py",
    "helpers.py",
    "hf_models.py",
    "opgraphs.py",
    "optimum_exports.py",
    "test_architecture.py",
    "test_golden_plans.py",
    "test_readme.py",
    "test_version.py",
    "test_wheel.py",
}
# Loose files at tools/: the set-up scripts the README, .ci/run and the workplace call by path.
ROOT_TOOLS = {
    "gpu_check.sh",
    "install-chromium.sh",
    "optimum_env.sh",
    "setup-dev.sh",
    "setup-modelopt.sh",
}


def test_the_package_root_holds_only_the_public_face():
    loose = {path.name for path in (ROOT / "graphamp").glob("*.py")} - ROOT_MODULES
    assert not loose, f"graphamp/ holds {sorted(loose)}: move them into a package by concern"


def test_the_public_face_resolves():
    """Every public name loads, and ``graphamp.verify.verify`` (the README's 0.1 path) is
    the function in graphamp.numerics.verify."""
    import graphamp
    import graphamp.numerics.verify

    for name in graphamp.__all__:
        assert getattr(graphamp, name) is not None, name
    assert graphamp.verify.verify is graphamp.numerics.verify.verify
    assert graphamp.verify.random_inputs is graphamp.numerics.verify.random_inputs
    assert "verify" in dir(graphamp)


def test_a_public_function_stays_itself_when_its_package_modules_are_imported():
    """``graphamp.onnx.tune`` was a function that imported ``graphamp/onnx/tune.py`` when
    called: the first import binds the package's attribute to the module, so the next call (or
    any call after a test imported the module) met a module. Every public function of
    graphamp.onnx and graphamp.fx is still itself after every module of its package is
    imported."""
    import importlib
    import inspect

    for package in ("onnx", "fx"):
        module = importlib.import_module(f"graphamp.{package}")
        public = {name: getattr(module, name) for name in module.__all__}
        for path in sorted((ROOT / "graphamp" / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            importlib.import_module(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
        for name, value in public.items():
            if inspect.isfunction(value):
                assert getattr(module, name) is value, f"graphamp.{package}.{name} was replaced"


# The stack, bottom up: a module imports from its own level or below. graphamp.dialects (the
# Dialect interface and its registry) is read from any level; a package not named here is
# not held to it.
LEVELS = {
    "core": 0,
    "errors": 0,
    "plans": 1,
    "policy": 1,
    "numerics": 1,
    "training": 1,
    "lists": 1,
    "passes": 2,
    "engine": 3,
    "onnx": 4,
    "fx": 4,
    "cli": 5,
    "viewer": 5,
}


def test_imports_point_down_the_stack():
    known = modules()

    def level(module: str) -> int | None:
        parts = module.split(".")
        return LEVELS.get(parts[1]) if len(parts) > 1 and parts[0] == "graphamp" else None

    up = []
    for name, path in known.items():
        here = level(name)
        for target in imports(path, known) if here is not None else ():
            there = level(target) if target in known else None
            if there is not None and there > here:
                up.append(f"{name} -> {target}")
    assert not up, up


def test_core_imports_nothing_above_it():
    """graphamp.core is the bottom of the stack: it imports only itself and graphamp.errors."""
    known = modules()
    for name, path in known.items():
        if name.startswith("graphamp.core"):
            above = {
                target
                for target in imports(path, known)
                if target.startswith("graphamp")
                and not target.startswith("graphamp.core")
                and target != "graphamp.errors"
            }
            assert not above, (name, above)


def test_tests_mirror_the_packages():
    """Each test file sits in a folder named after what it tests: a package of graphamp, the
    passes, the models or the tools; at tests/ itself only what concerns the whole tree."""
    rooms = {p.name for p in (ROOT / "graphamp").iterdir() if (p / "__init__.py").exists()}
    rooms |= {"passes", "models", "tools"}
    loose = {path.name for path in (ROOT / "tests").glob("*.py")} - ROOT_TESTS
    assert not loose, f"tests/ holds {sorted(loose)}: move them into the folder they test"
    for folder in (ROOT / "tests").iterdir():
        if folder.is_dir() and any(folder.glob("*.py")):
            assert folder.name in rooms, folder
            assert (folder / "__init__.py").exists(), f"{folder}: test basenames may repeat"


def test_tools_sit_in_folders_by_use():
    loose = {path.name for path in (ROOT / "tools").iterdir() if path.is_file()} - ROOT_TOOLS
    assert not loose, f"tools/ holds {sorted(loose)}: move them into bench/, fuzz/, ci/, ..."


# A dialect's plugin (what the engine calls through the Dialect interface) sits below the
# engine and below its package's API: it imports neither, nor its package's rooms other than
# those named here (the ONNX plugin runs models and reads files through its siblings).
PLUGINS = {
    "graphamp.fx.dialect": ("graphamp.fx", ()),
    "graphamp.onnx.dialect": ("graphamp.onnx", ("io", "validation", "numerics")),
}


def test_dialect_plugins_import_neither_the_engine_nor_the_api_above_them():
    known = modules()
    reaching = []
    for plugin, (package, rooms) in PLUGINS.items():
        allowed = (plugin, *(f"{package}.{room}" for room in rooms))
        for name, path in known.items():
            if name != plugin and not name.startswith(plugin + "."):
                continue
            for target in imports(path, known):
                above = target == "graphamp.engine" or target.startswith("graphamp.engine.")
                inside = target == package or target.startswith(package + ".")
                if above or (
                    inside and not any(target == a or target.startswith(a + ".") for a in allowed)
                ):
                    reaching.append(f"{name} -> {target}")
    assert not reaching, reaching


def test_architecture_names_every_module():
    """docs/ARCHITECTURE.md's Layout table names every module in the row of its package
    (``graphamp/fx/``, ``passes/``, ...), a module of a subpackage after the subpackage's own
    name (``dialect/``), so the map cannot fall behind the tree."""
    import re

    rows = {}
    for line in (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8").splitlines():
        found = re.match(r"\| `([\w/]+/)` \|(.*)\|\s*$", line)
        if found:
            rows[found.group(1)] = found.group(2)
    unnamed = []
    for folder in [ROOT / "graphamp", ROOT / "passes", ROOT / "models"]:
        for path in sorted(folder.rglob("*.py")):
            if path.name == "__init__.py" or "static" in path.parts:
                continue
            inside = path.relative_to(folder).parts
            if folder.name == "graphamp" and len(inside) > 1:
                package, inside = f"graphamp/{inside[0]}/", inside[1:]
            else:
                package = "graphamp/" if folder.name == "graphamp" else f"{folder.name}/"
            row = rows.get(package, "")
            subpackages = {
                f"`{p.name}/`"
                for p in (ROOT / package).iterdir()
                if p.is_dir() and (p / "__init__.py").exists()
            }
            # the row cut at each subpackage's name: the text that names its modules
            pieces = re.split("(" + "|".join(map(re.escape, sorted(subpackages))) + ")", row)
            sections = {"": pieces[0]}
            for name, text in zip(pieces[1::2], pieces[2::2], strict=True):
                sections[name.strip("`")] = sections.get(name.strip("`"), "") + text
            where = "/".join(inside[:-1]) + "/" if len(inside) > 1 else ""
            if f"`{inside[-1]}`" not in sections.get(where, ""):
                unnamed.append(str(path.relative_to(ROOT)))
    assert not unnamed, f"docs/ARCHITECTURE.md's Layout table does not name {unnamed}"
