"""The viewer's Python half: module paths read from node names, the folding into groups, the
layered layout, plumbing, and the page as bytes (deterministic, self-contained)."""

from __future__ import annotations

import itertools
import random

import pytest

from graphamp import viewer
from graphamp.core.graph import NodeKind, OpNode, TensorInfo
from graphamp.plans.records import NodeDecision
from graphamp.viewer.hierarchy import (
    MAX_CHILDREN,
    build_hierarchy,
    node_path,
    plumbing,
    scope_path,
)
from graphamp.viewer.layout import layered_layout
from tests.opgraphs import toy_plan


@pytest.mark.parametrize(
    ("name", "path"),
    [
        ("/model/layers.3/self_attn/MatMul", ("model", "layers", "layers.3", "self_attn")),
        ("layers.3.self_attn/linear", ("layers", "layers.3", "self_attn")),
        ("layers.0.mlp.0/linear", ("layers", "layers.0", "mlp", "mlp.0")),
        ("/layers.0/Add_1", ("layers", "layers.0")),
        ("Identity_17", ()),
        ("/Add", ()),
        ("add_1", ()),
    ],
)
def test_scope_paths_of_onnx_and_fx_names(name, path):
    assert scope_path(name) == path


def test_a_name_without_a_path_falls_back_on_the_module_path_of_its_scope():
    assert node_path("node_MatMul_3", "encoder.layers.1.self_attn") == (
        "encoder",
        "layers",
        "layers.1",
        "self_attn",
    )
    assert node_path("node_MatMul_3", "node_MatMul_3") == ()  # an ONNX scope is the name
    assert node_path("layers.0.attention/matmul", "layers.0.attention") == (
        "layers",
        "layers.0",
        "attention",
    )


def test_groups_follow_module_paths_and_single_node_groups_fold_away():
    names = [
        "/layers.0/attention/query/MatMul",
        "/layers.0/attention/query/Add",
        "/layers.0/attention/Softmax",
        "/layers.0/norm1/LayerNormalization",
        "/layers.0/Add",
        "/layers.1/attention/query/MatMul",
        "/layers.1/attention/query/Add",
        "/layers.1/Add",
        "/pooler/Gemm",
        "Identity_3",
    ]
    hierarchy = build_hierarchy(names)
    assert hierarchy.groups[""].children == ["layers"]
    assert hierarchy.groups["layers"].children == ["layers/layers.0", "layers/layers.1"]
    assert hierarchy.group_of["/layers.0/attention/query/MatMul"] == (
        "layers/layers.0/attention/query"
    )
    # one node in "norm1", one in "pooler": drawn in the group above, labelled with the path
    assert hierarchy.group_of["/layers.0/norm1/LayerNormalization"] == "layers/layers.0"
    assert hierarchy.labels["/layers.0/norm1/LayerNormalization"] == "norm1/LayerNormalization"
    assert hierarchy.group_of["/pooler/Gemm"] == "" and "pooler" not in hierarchy.groups
    assert hierarchy.group_of["Identity_3"] == ""
    assert sorted(hierarchy.subtree_nodes("")) == sorted(names)


def test_a_flat_graph_is_split_into_parts_no_view_can_overflow():
    names = [f"node_{i}" for i in range(1000)]
    hierarchy = build_hierarchy(names)
    for group in hierarchy.groups.values():
        assert len(group.nodes) + len(group.children) <= MAX_CHILDREN
    parts = hierarchy.groups[""].children
    assert len(parts) == -(-1000 // MAX_CHILDREN)
    size = len(hierarchy.groups[parts[0]].nodes)
    assert hierarchy.groups[parts[0]].label == f"node_0 … node_{size - 1}"
    flattened = [n for part in parts for n in hierarchy.groups[part].nodes]
    assert flattened == names, "parts keep graph order"


def random_dag(n: int, seed: int) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    return [(i, j) for j in range(1, n) for i in rng.sample(range(max(0, j - 8), j), min(2, j))]


@pytest.mark.parametrize("seed", range(4))
def test_layout_ranks_point_down_and_boxes_never_overlap(seed):
    n = 60
    edges = random_dag(n, seed)
    sizes = [(156.0, 40.0) if i % 3 else (208.0, 62.0) for i in range(n)]
    layout = layered_layout(sizes, list(range(n)), edges)
    for (a, b), route in zip(edges, layout.routes, strict=True):
        assert layout.ranks[b] > layout.ranks[a]
        assert route[0][1] == pytest.approx(layout.y[a] + sizes[a][1] / 2, abs=0.1)
        assert route[-1][1] == pytest.approx(layout.y[b] - sizes[b][1] / 2, abs=0.1)
        assert all(p[1] <= q[1] for p, q in itertools.pairwise(route))
    by_rank: dict[int, list[int]] = {}
    for v in range(n):
        by_rank.setdefault(layout.ranks[v], []).append(v)
    for members in by_rank.values():
        members.sort(key=lambda v: layout.x[v])
        for u, v in itertools.pairwise(members):
            assert layout.x[v] - layout.x[u] >= (sizes[u][0] + sizes[v][0]) / 2 - 0.2
    for v in range(n):
        assert layout.x[v] - sizes[v][0] / 2 >= 0 and layout.x[v] + sizes[v][0] / 2 <= layout.width
        assert layout.y[v] - sizes[v][1] / 2 >= 0 and layout.y[v] + sizes[v][1] / 2 <= layout.height
    assert layered_layout(sizes, list(range(n)), edges) == layout, "deterministic"


def test_layout_of_a_tree_has_no_crossings_and_cycles_are_drawn():
    tree = [(0, 1), (0, 2), (1, 3), (1, 4), (2, 5), (2, 6), (5, 7)]
    layout = layered_layout([(100.0, 30.0)] * 8, list(range(8)), tree)
    assert layout.crossings == 0
    # groups folded together can make a cycle: it is broken, and every edge still has a route
    cycle = layered_layout([(100.0, 30.0)] * 3, [0, 1, 2], [(0, 1), (1, 2), (2, 0)])
    assert cycle.ranks == [0, 1, 2]
    back = cycle.routes[2]  # 2 -> 0 runs upwards: from the top of 2 to the bottom of 0
    assert back[0][1] == pytest.approx(cycle.y[2] - 15) and back[-1][1] == pytest.approx(
        cycle.y[0] + 15
    )


def test_inputs_read_late_sit_next_to_their_reader_not_in_a_top_row():
    # 0 -> 1 -> 2 -> 3, and 4 (a source) read only by 3
    layout = layered_layout([(100.0, 30.0)] * 5, list(range(5)), [(0, 1), (1, 2), (2, 3), (4, 3)])
    assert layout.ranks[4] == layout.ranks[3] - 1


def test_plumbing_is_constants_shape_ops_and_what_only_they_feed():
    plan, graph = toy_plan(["a", "b"])
    graph.add_tensor(TensorInfo("w", "float32"))
    graph.add_tensor(TensorInfo("w2", "float32"))
    graph.add_node(OpNode("identity", "Identity", ["w"], ["w2"]))
    plan.nodes["identity"] = NodeDecision("Identity", "float16", "clear", "follows")
    graph.add_tensor(TensorInfo("s", "int64"))
    graph.add_node(OpNode("shape", "Shape", ["t0"], ["s"]))
    plan.nodes["shape"] = NodeDecision("Shape", "none", "no_float", "no float math")
    graph.add_tensor(TensorInfo("h", "float16"))
    graph.add_node(OpNode("cast", "Cast", ["t1"], ["h"], kind=NodeKind.CAST))
    plan.nodes["cast"] = NodeDecision("Cast", "none", "cast", "a Cast in the model")
    assert plumbing(plan, graph) == {"const", "identity", "shape"}


def test_pages_are_deterministic_and_fetch_nothing():
    plan, graph = toy_plan([f"/block.{i}/op{j}" for i in range(3) for j in range(4)])
    first, second = viewer.plan_page(plan, graph), viewer.plan_page(plan, graph)
    assert first == second
    for fetching in ("src=", "href=", "url(http", "@import", "fetch(", "XMLHttpRequest"):
        assert fetching not in first, fetching
    assert viewer.diff_page(plan, plan, graph) == viewer.diff_page(plan, plan, graph)
