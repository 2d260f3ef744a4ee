"""Names as torch 2.13's default ONNX exporter writes them: ``torch.onnx.export``
with ``dynamo=True`` names nodes ``node_MatMul_3`` and puts the module path in each node's
``pkg.torch.onnx.name_scopes`` metadata. deny_names globs match those module paths (as they
match FX module paths), the plan records them, and the viewer folds the graph by them.

The model is a real export of a small nn.Module with nested modules, made once."""

from __future__ import annotations

import json

import onnx
import pytest
import torch
from torch import nn

import graphamp.onnx as gonnx
from graphamp.cli import main
from graphamp.viewer.hierarchy import build_hierarchy, node_path

pytestmark = pytest.mark.slow  # every test reads one torch.onnx dynamo export, made once


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.query, self.key = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = self.query(x) @ self.key(x).transpose(-1, -2)
        return torch.softmax(scores, -1) @ x


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention, self.out = Attention(), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.out(self.attention(x))) + x


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Layer(), Layer()])
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("dynamo") / "net.onnx"
    program = torch.onnx.export(Net().eval(), (torch.randn(2, 3, 8),), dynamo=True)
    program.save(str(path))
    return path


def modules(plan) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {name: d.module for name, d in plan.nodes.items() if d.module}


def test_the_export_names_nodes_after_ops_and_the_plan_records_their_modules(exported):
    names = [node.name for node in onnx.load(str(exported)).graph.node]
    assert any(name.startswith("node_MatMul") for name in names)
    assert not any("layers" in name for name in names)  # the path is not in the names
    found = modules(gonnx.analyse(str(exported)).plan)
    assert {"layers.0.attention.query", "layers.1.out", "head"} <= set(found.values())


def test_deny_names_match_module_paths(exported):
    from graphamp import engine
    from graphamp.onnx.dialect.plugin import OnnxDialect
    from graphamp.policy.policy import Policy

    policy = Policy.create("float16", deny_names=["layers.1.*"])
    plan = engine.analyse(str(exported), policy, dialect=OnnxDialect()).plan
    found = modules(plan)
    denied = {name for name, d in plan.nodes.items() if d.rule == "deny_name"}
    in_layer_1 = {name for name, module in found.items() if module.startswith("layers.1.")}
    assert in_layer_1 and denied == in_layer_1
    assert all(plan.nodes[n].precision == "float32" for n in denied)
    assert plan.nodes[next(n for n, m in found.items() if m == "head")].precision == "float16"


def test_the_command_line_and_strict_mode_take_module_globs(exported, tmp_path, capsys):
    plan_path = tmp_path / "plan.json"
    out = tmp_path / "out.onnx"
    argv = ["convert", str(exported), "-o", str(out), "--plan", str(plan_path)]
    assert main([*argv, "--deny-name", "layers.0.attention*", "--strict"]) == 0
    nodes = json.loads(plan_path.read_text())["nodes"]
    denied = {n["module"] for n in nodes.values() if n["rule"] == "deny_name"}
    assert denied == {"layers.0.attention", "layers.0.attention.query", "layers.0.attention.key"}
    capsys.readouterr()
    assert main(["plan", str(exported)]) == 0
    assert "(layers.0.attention.query)" in capsys.readouterr().out  # the text plan shows it


def test_the_viewer_folds_the_graph_by_module(exported):
    analysis = gonnx.analyse(str(exported))
    graph = analysis.graph
    paths = {node.name: node_path(node.name, node.scope) for node in graph}
    hierarchy = build_hierarchy(list(graph.nodes), paths=paths)
    top = {hierarchy.groups[g].label for g in hierarchy.groups[""].children}
    assert {"layers", "head"} <= top
    layers = hierarchy.groups["layers"].children
    assert [hierarchy.groups[g].label for g in layers] == ["layers.0", "layers.1"]
    query = next(
        n for n, d in analysis.plan.nodes.items() if d.module == "layers.1.attention.query"
    )
    assert hierarchy.chain(hierarchy.group_of[query])[1:3] == ["layers", "layers/layers.1"]
