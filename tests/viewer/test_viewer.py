"""The plan viewer in a real headless Chromium: the page loads on the zoo's BERT and GPT without
a console error or a network request, opens folded to one screen, search opens a node's group
and selects it, the filters hide what they should, the side panel says what ``graphamp
explain`` says, and the diff page marks exactly the nodes the plan diff lists. Screenshots go
to each test's tmp_path."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

import graphamp.onnx as gonnx
from graphamp import viewer
from graphamp.plans.report import explain
from graphamp.viewer.hierarchy import build_hierarchy

pytestmark = pytest.mark.browser

# What Chromium needs here: no sandbox (containers), nothing fetched in the background.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
WINDOW = {"width": 1400, "height": 1000}


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    raise AssertionError("the viewer tests need Chromium: apt-get install chromium")


@pytest.fixture(scope="module")
def browser():
    # Playwright drives the system's Chromium; it never downloads a browser of its own.
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium(), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def analyses(tmp_path_factory: pytest.TempPathFactory):
    """analyses(name, **policy) -> the small zoo model's analysis (graph and plan), cached.
    Without list moves of its own, LayerNormalization is denied: the residual stream then stays
    float32, so a page holds nodes of both precisions, deny spreads and casts to look at; the
    pages were drawn for TensorFlow's colouring (``spread``), which they keep unless told."""
    from graphamp.models import export_onnx

    folder = tmp_path_factory.mktemp("viewer-zoo")
    cache: dict[tuple, object] = {}

    def get(name: str, **policy):
        if "allow" not in policy and "deny" not in policy:
            policy["deny"] = ["LayerNormalization"]
        policy.setdefault("spread", "tensorflow")
        key = (name, tuple(sorted((k, str(v)) for k, v in policy.items())))
        if key not in cache:
            path = folder / f"{name}.onnx"
            if not path.exists():
                export_onnx(name, path, "small")
            analysis = gonnx.analyse(str(path), None, **policy)
            analysis.plan.model = f"{name}.onnx"
            cache[key] = analysis
        return cache[key]

    return get


class Loaded:
    """A page opened in the browser, with everything it logged and requested."""

    def __init__(self, browser: Browser, html: str, folder: Path, name: str) -> None:
        self.path = folder / f"{name}.html"
        self.path.write_text(html, encoding="utf-8")
        self.folder, self.name = folder, name
        self.page: Page = browser.new_page(viewport=WINDOW)
        self.problems: list[str] = []
        self.requests: list[str] = []
        self.page.on(
            "console",
            lambda m: (
                self.problems.append(f"{m.type}: {m.text}")
                if m.type in ("error", "warning")
                else None
            ),
        )
        self.page.on("pageerror", lambda e: self.problems.append(f"page error: {e}"))
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.goto(self.path.as_uri())
        self.page.wait_for_function("document.body.dataset.ready === '1'", timeout=20_000)

    def screenshot(self, label: str) -> Path:
        target = self.folder / f"{self.name}-{label}.png"
        self.page.screenshot(path=str(target))
        assert target.stat().st_size > 10_000, "a blank screenshot"
        return target

    def drawn(self, selector: str, attribute: str) -> list[str]:
        """``attribute`` of every element matching ``selector`` that is displayed."""
        return self.page.eval_on_selector_all(
            selector,
            f"els => els.filter(e => e.getBoundingClientRect().width > 0)"
            f".map(e => e.getAttribute({attribute!r}))",
        )

    def state(self) -> dict:
        return self.page.evaluate("graphampViewer.state()")

    def open(self, group: str) -> None:
        self.page.evaluate("id => graphampViewer.open(id)", group)

    def every_view(self) -> dict[str, list[str]]:
        """Node names drawn in each group's view, for every group there is to open."""
        out = {}
        for group in self.page.evaluate("graphampViewer.groups()"):
            self.open(group)
            out[group] = self.drawn("g.node", "data-name")
        return out

    def close(self) -> None:
        assert not self.problems, self.problems
        foreign = [u for u in self.requests if not u.startswith(("file:", "data:", "about:"))]
        assert not foreign, f"the page asked the network for {foreign}"
        self.page.close()


def plan_page(browser, analyses, tmp_path, name: str, **policy) -> Loaded:
    analysis = analyses(name, **policy)
    return Loaded(browser, viewer.plan_page(analysis.plan, analysis.graph), tmp_path, name)


@pytest.mark.parametrize("name", ["bert", "gpt"])
def test_page_loads_without_console_errors_and_draws_every_node_once(
    browser, analyses, tmp_path, name
):
    loaded = plan_page(browser, analyses, tmp_path, name)
    loaded.screenshot("default")
    graph = analyses(name).graph
    hidden = loaded.page.evaluate("+document.getElementById('plumbing-count').textContent")
    assert 0 < hidden < len(graph.nodes)
    compute = loaded.every_view()
    drawn = [node for names in compute.values() for node in names]
    assert len(drawn) == len(set(drawn)) == len(graph.nodes) - hidden
    loaded.page.click("#show-plumbing")
    everything = loaded.every_view()
    drawn = [node for names in everything.values() for node in names]
    assert sorted(drawn) == sorted(graph.nodes), "each node drawn once, in one group"
    assert set(everything) >= set(compute)
    loaded.close()


@pytest.mark.parametrize("name", ["bert", "gpt"])
def test_default_view_is_folded_and_fits_the_window(browser, analyses, tmp_path, name):
    loaded = plan_page(browser, analyses, tmp_path, name)
    assert loaded.state()["group"] == ""
    groups = loaded.drawn("g.group", "data-group")
    assert "layers" in groups, groups
    assert not [n for n in loaded.drawn("g.node", "data-name") if "/layers." in n]
    canvas = loaded.page.eval_on_selector("#canvas", "e => e.getBoundingClientRect().toJSON()")
    boxes = loaded.page.eval_on_selector_all(
        "#viewport rect", "els => els.map(e => e.getBoundingClientRect().toJSON())"
    )
    assert len(boxes) > 10
    for box in boxes:
        assert box["left"] >= canvas["left"] and box["right"] <= canvas["right"], box
        assert box["top"] >= canvas["top"] and box["bottom"] <= canvas["bottom"], box
    assert loaded.state()["scale"] >= 0.6, "readable without zooming"
    loaded.screenshot("fits")
    loaded.close()


def test_search_by_name_opens_the_group_and_selects_the_node(browser, analyses, tmp_path):
    analysis = analyses("bert")
    loaded = plan_page(browser, analyses, tmp_path, "bert")
    target = "/layers.1/attention/Softmax"
    loaded.page.click("#search")
    loaded.page.keyboard.type(target)
    first = loaded.page.inner_text("#results li")
    assert target in first
    loaded.page.keyboard.press("Enter")
    state = loaded.state()
    assert state["group"] == "layers/layers.1/attention" and state["selected"] == target
    crumbs = loaded.page.inner_text("#crumbs")
    assert [part.strip() for part in crumbs.split("›")][1:] == ["layers", "layers.1", "attention"]
    selected = loaded.drawn("g.node.selected", "data-name")
    assert selected == [target]
    assert loaded.page.inner_text("#selected-name") == target
    assert loaded.page.inner_text("#explain") == explain(analysis.plan, target, analysis.graph)
    loaded.screenshot("selected")
    # by op: every Softmax of the model, and nothing else, among the node results
    loaded.page.fill("#search", "")
    loaded.page.keyboard.type("softmax")
    ops = loaded.page.eval_on_selector_all(
        "#results li .kind", "els => els.map(e => e.textContent)"
    )
    softmaxes = [n for n, d in analysis.plan.nodes.items() if d.op == "Softmax"]
    assert ops.count("Softmax") == len(softmaxes) == 2
    # by tensor: its producer's group opens and the tensor is shown
    tensor = "/layers.0/norm1/LayerNormalization_output_0"
    loaded.page.fill("#search", tensor)
    loaded.page.keyboard.press("Enter")
    assert loaded.state()["group"] == "layers/layers.0"
    assert loaded.page.inner_text("#selected-name") == tensor
    loaded.close()


def test_search_reveals_a_hidden_node(browser, analyses, tmp_path):
    """A constant is hidden by default; asking for it by name shows plumbing and selects it."""
    analysis = analyses("bert")
    constant = next(n for n, d in analysis.plan.nodes.items() if d.op == "Constant")
    loaded = plan_page(browser, analyses, tmp_path, "bert")
    assert not loaded.state()["showPlumbing"]
    loaded.page.fill("#search", constant)
    loaded.page.keyboard.press("Enter")
    assert loaded.state()["showPlumbing"] and loaded.state()["selected"] == constant
    assert loaded.drawn("g.node.selected", "data-name") == [constant]
    loaded.close()


def test_clicks_open_groups_and_select_nodes_and_the_view_zooms_and_pans(
    browser, analyses, tmp_path
):
    analysis = analyses("bert")
    loaded = plan_page(browser, analyses, tmp_path, "bert")
    page = loaded.page
    page.click('g.group[data-group="layers"]')
    page.click('g.group[data-group="layers/layers.0"]')
    page.click('g.group[data-group="layers/layers.0/attention"]')
    assert loaded.state()["group"] == "layers/layers.0/attention"
    node = "/layers.0/attention/Div"
    page.click(f'g.node[data-name="{node}"]')
    assert loaded.state()["selected"] == node
    assert page.inner_text("#explain") == explain(analysis.plan, node, analysis.graph)
    # the wheel zooms about the pointer: the drawing point under it stays under it
    before = loaded.state()
    canvas = page.eval_on_selector("#graph", "e => e.getBoundingClientRect().toJSON()")
    x, y = 400.0, 500.0
    page.mouse.move(x, y)
    page.mouse.wheel(0, -300)
    after = loaded.state()
    assert after["scale"] > before["scale"] * 1.3

    def drawing_point(view: dict) -> tuple[float, float]:
        """The point of the drawing under the pointer in ``view``."""
        return (
            (x - canvas["left"] - view["tx"]) / view["scale"],
            (y - canvas["top"] - view["ty"]) / view["scale"],
        )

    assert drawing_point(after) == pytest.approx(drawing_point(before), abs=0.5)
    # a drag pans, and is no click
    page.mouse.move(300, 300)
    page.mouse.down()
    page.mouse.move(380, 340, steps=4)
    page.mouse.up()
    panned = loaded.state()
    assert (panned["tx"] - after["tx"], panned["ty"] - after["ty"]) == pytest.approx((80, 40))
    assert panned["group"] == "layers/layers.0/attention" and panned["selected"] == node
    page.click("#fit")
    assert loaded.state()["scale"] == pytest.approx(before["scale"])
    # breadcrumbs and Backspace go back up
    page.click('#crumbs a:text-is("layers")')
    assert loaded.state()["group"] == "layers"
    page.keyboard.press("Backspace")
    assert loaded.state()["group"] == ""
    loaded.close()


def test_precision_and_rule_filters_hide_what_they_should(browser, analyses, tmp_path):
    loaded = plan_page(browser, analyses, tmp_path, "bert")
    loaded.open("layers/layers.0/attention")
    before = loaded.drawn("g.node", "data-precision")
    assert "float16" in before and "float32" not in before  # one float32 node: in "output"
    assert {"layers/layers.0/attention/query", "layers/layers.0/attention/output"} <= set(
        loaded.drawn("g.group", "data-group")
    )
    loaded.page.click('input[data-precision="float16"]')
    assert loaded.drawn("g.node", "data-precision") == []
    # a group of float16 nodes only goes; one with a float32 node stays
    assert loaded.drawn("g.group", "data-group") == ["layers/layers.0/attention/output"]
    assert loaded.drawn("g.edge", "data-e") == [], "edges of hidden nodes hide with them"
    loaded.screenshot("no-float16")
    loaded.open("layers/layers.0")
    precisions = loaded.drawn("g.node", "data-precision")
    assert precisions and set(precisions) == {"float32"}
    loaded.page.click('input[data-precision="float16"]')
    # the rule filter: no node of the allow list stays drawn
    loaded.page.click("details summary")
    loaded.open("layers/layers.0/attention")
    loaded.page.click('input[data-rule="allow"]')
    rules = loaded.drawn("g.node", "data-rule")
    assert rules and "allow" not in rules
    loaded.close()


def test_casts_are_drawn_on_their_edges_with_their_types(browser, analyses, tmp_path):
    analysis = analyses("bert")
    loaded = plan_page(browser, analyses, tmp_path, "bert")
    loaded.open("layers/layers.0/attention")
    marks = loaded.page.eval_on_selector_all(
        ".cast-mark text", "els => els.map(e => e.textContent)"
    )
    into_attention = [
        c for c in analysis.plan.casts if any("/layers.0/attention/" in r for r in c.consumers)
    ]
    assert len(marks) == 3 == len(into_attention[0].consumers)  # query, key and value read it
    assert set(marks) == {"f32→f16"} and into_attention[0].src == "float32"
    loaded.close()


@pytest.mark.parametrize("name", ["bert", "gpt"])
def test_the_panel_explains_every_node_as_graphamp_explain(browser, analyses, tmp_path, name):
    analysis = analyses(name)
    loaded = plan_page(browser, analyses, tmp_path, name)
    shown = loaded.page.evaluate(
        "names => names.map(n => graphampViewer.explain(n))", list(analysis.plan.nodes)
    )
    expected = [explain(analysis.plan, n, analysis.graph) for n in analysis.plan.nodes]
    assert shown == expected
    loaded.close()


def test_diff_page_marks_exactly_the_nodes_the_plan_diff_lists(browser, analyses, tmp_path):
    old = analyses("bert")
    new = analyses("bert", allow=["LayerNormalization"], deny=["Softmax"])
    difference = old.plan.diff(new.plan)
    listed = set(difference.changed_nodes())
    assert 5 < len(listed) < len(old.graph.nodes)
    page = viewer.diff_page(old.plan, new.plan, new.graph)
    loaded = Loaded(browser, page, tmp_path, "diff")
    loaded.screenshot("diff")
    assert loaded.page.inner_text("#diff-count") == str(len(listed))
    for plumbing in (False, True):
        if plumbing:
            loaded.page.click("#show-plumbing")
        marked: set[str] = set()
        for group in loaded.page.evaluate("graphampViewer.groups()"):
            loaded.open(group)
            marked.update(loaded.drawn("g.node.changed", "data-name"))
        assert marked == listed
    # a closed group is marked when it holds a changed node
    hierarchy = build_hierarchy(list(new.graph.nodes))
    holding = {g for n in listed for g in hierarchy.chain(hierarchy.group_of[n])}
    loaded.open("")
    drawn_groups = set(loaded.drawn("g.group", "data-group"))
    assert set(loaded.drawn("g.group.changed", "data-group")) == drawn_groups & holding
    assert "layers" in holding
    loaded.close()


def test_diff_page_lists_a_node_the_graph_lacks(browser, analyses, tmp_path):
    old = analyses("bert")
    new_plan = old.plan.from_dict(old.plan.to_dict())
    gone = "/layers.1/attention/Softmax"
    del new_plan.nodes[gone]
    page = viewer.diff_page(new_plan, old.plan, old.graph)  # the old plan lacks it: "added"
    loaded = Loaded(browser, page, tmp_path, "added")
    loaded.open("layers/layers.1/attention")
    assert loaded.page.get_attribute(f'g.node[data-name="{gone}"]', "data-status") == "2"
    loaded.close()


def test_fx_plans_fold_by_module_path(browser, tmp_path):
    import graphamp.fx as gfx
    from graphamp.fx.conversion import fx_policy
    from graphamp.models import build

    module, inputs = build("bert", "small")
    analysis = gfx.analyse(module, inputs, policy=fx_policy(module, None, "cpu", {}))
    page = viewer.plan_page(analysis.plan, analysis.graph)
    loaded = Loaded(browser, page, tmp_path, "fx")
    assert "layers" in loaded.drawn("g.group", "data-group")
    loaded.page.fill("#search", "layers.1.attention/softmax")
    loaded.page.keyboard.press("Enter")
    assert loaded.state()["group"] == "layers/layers.1/attention"
    assert loaded.page.inner_text("#explain") == explain(
        analysis.plan, "layers.1.attention/softmax", analysis.graph
    )
    loaded.screenshot("fx")
    loaded.close()


def test_names_that_look_like_markup_stay_text(browser, tmp_path):
    from tests.opgraphs import toy_plan

    plan, graph = toy_plan(["</script><b>x", "a'b\"c/<i>op", "ünï/cöde"])
    loaded = Loaded(browser, viewer.plan_page(plan, graph), tmp_path, "markup")
    loaded.page.click("#show-plumbing")
    drawn = {n for names in loaded.every_view().values() for n in names}
    assert drawn == set(graph.nodes)
    assert loaded.page.evaluate("document.querySelectorAll('b, i').length") == 0
    loaded.close()


def test_an_empty_plan_still_loads(browser, tmp_path):
    from tests.opgraphs import toy_plan

    plan, graph = toy_plan([], constant=False)
    loaded = Loaded(browser, viewer.plan_page(plan, graph), tmp_path, "empty")
    assert loaded.drawn("g.node", "data-name") == []
    assert loaded.page.inner_text("#status").startswith("0 nodes")
    loaded.close()


def test_the_command_line_writes_the_viewer_pages(browser, tmp_path, capsys):
    """``graphamp plan --format html`` and ``graphamp diff A B --format html`` write these
    pages; the diff page counts the nodes the text diff lists; two plan files cannot be drawn."""
    import onnx

    from graphamp.cli import main
    from tests.helpers import chain

    path = tmp_path / "m.onnx"
    onnx.save(chain(["MatMul", "Exp", "Add", "Relu"]), str(path))
    plan_html, diff_html = tmp_path / "plan.html", tmp_path / "diff.html"
    assert main(["plan", str(path), "--format", "html", "-o", str(plan_html)]) == 0
    loaded = Loaded(browser, plan_html.read_text(), tmp_path, "cli-plan")
    assert len(loaded.drawn("g.node", "data-name")) == 4
    loaded.close()
    old_json, new_json = tmp_path / "old.json", tmp_path / "new.json"
    assert main(["plan", str(path), "--format", "json", "-o", str(old_json)]) == 0
    assert (
        main(["plan", str(path), "--deny", "MatMul", "--format", "json", "-o", str(new_json)]) == 0
    )
    assert main(["diff", str(old_json), str(path), "--deny", "MatMul", "--format", "json"]) == 0
    listed = {entry["node"] for entry in json.loads(capsys.readouterr().out)["nodes_changed"]}
    args = ["diff", str(old_json), str(path), "--deny", "MatMul", "--format", "html"]
    assert main([*args, "-o", str(diff_html)]) == 0
    loaded = Loaded(browser, diff_html.read_text(), tmp_path, "cli-diff")
    changed = loaded.drawn("g.node.changed", "data-name")
    assert set(changed) == listed and len(listed) == int(loaded.page.inner_text("#diff-count"))
    loaded.close()
    assert main(["diff", str(old_json), str(new_json), "--format", "html"]) == 2
    assert "needs a model" in capsys.readouterr().err


def test_float8_nodes_are_marked_and_explained_with_their_scale_sources(browser, tmp_path):
    """A float8 plan's page: the panel explains every node as ``graphamp explain`` does (both
    operands' scale sources included) and exactly the float8 nodes are drawn marked."""
    import numpy as np

    from graphamp import engine
    from graphamp.models import export_onnx
    from graphamp.passes.options import Options
    from graphamp.policy.policy import Policy
    from graphamp.training.float8 import Float8

    path = export_onnx("gpt", tmp_path / "gpt.onnx", "small")
    rng = np.random.default_rng(0)
    batches = [{"input_ids": rng.integers(0, 128, (2, 16))} for _ in range(2)]
    # with 8-bit tables and kept products' int8 weights: their lines too
    fp8 = Float8.static(embeddings=True, kept_int8=True)
    options = Options(fp8=fp8, ranges=gonnx.calibrate(str(path), batches))
    analysis = engine.analyse(str(path), Policy.create("float16"), options=options)
    chosen = {n for n, d in analysis.plan.fp8.items() if d.precision == "float8_e4m3fn"}
    assert len(chosen) == 12
    loaded = Loaded(browser, viewer.plan_page(analysis.plan, analysis.graph), tmp_path, "fp8")
    shown = loaded.page.evaluate(
        "names => names.map(n => graphampViewer.explain(n))", list(analysis.plan.nodes)
    )
    assert shown == [explain(analysis.plan, n, analysis.graph) for n in analysis.plan.nodes]
    assert any("operand B" in text and "weight: at conversion" in text for text in shown)
    assert any("table 'word.weight': int8 per row" in text for text in shown)
    assert any("operand B" in text and "int8 per channel" in text for text in shown)
    marked: set[str] = set()
    for group in loaded.page.evaluate("graphampViewer.groups()"):
        loaded.open(group)
        marked |= set(loaded.drawn("g.node.fp8", "data-name"))
    assert marked == chosen
    loaded.screenshot("fp8")
    loaded.close()


def test_a_float8_diff_page_marks_the_nodes_whose_float8_decision_moved(browser, tmp_path):
    """Two float8 plans of one model whose node precisions are the same: the nodes a deny rule
    took out of float8, and the readers of a scale whose granularity moved, are marked
    "float8 changed" (and counted), with the old float8 decision in the panel."""
    import dataclasses

    import numpy as np

    from graphamp import engine
    from graphamp.models import export_onnx
    from graphamp.passes.options import Options
    from graphamp.policy.policy import Policy
    from graphamp.training.float8 import Float8

    path = export_onnx("gpt", tmp_path / "gpt.onnx", "small")
    rng = np.random.default_rng(0)
    batches = [{"input_ids": rng.integers(0, 128, (2, 16))} for _ in range(2)]
    options = Options(fp8=Float8.static(), ranges=gonnx.calibrate(str(path), batches))
    old = engine.analyse(str(path), Policy.create("float16"), options=options)
    denied = dataclasses.replace(options, fp8=Float8.static(deny_names=("/layers.1/mlp/*",)))
    new = engine.analyse(str(path), Policy.create("float16"), options=denied)
    moved = {"/layers.1/mlp/mlp.0/MatMul", "/layers.1/mlp/mlp.2/MatMul"}
    assert all(new.plan.fp8[n].rule == "fp8_deny" for n in moved)
    assert not old.plan.diff(new.plan).nodes_changed  # no node's own precision moved
    # a scale record whose granularity moved marks its float8 readers too
    record = next(r for r in new.plan.scales if r.source == "calibration")
    new.plan.scales[new.plan.scales.index(record)] = dataclasses.replace(record, granularity="row")
    listed = set(old.plan.diff(new.plan).changed_nodes())
    assert listed == moved | set(record.consumers)
    page = viewer.diff_page(old.plan, new.plan, new.graph)
    loaded = Loaded(browser, page, tmp_path, "fp8-diff")
    assert loaded.page.inner_text("#diff-count") == str(len(listed))
    marked: set[str] = set()
    for group in loaded.page.evaluate("graphampViewer.groups()"):
        loaded.open(group)
        marked.update(loaded.drawn("g.node.changed", "data-name"))
    assert marked == listed
    name = "/layers.1/mlp/mlp.0/MatMul"
    loaded.open(build_hierarchy(list(new.graph.nodes)).group_of[name])
    node = f'g.node[data-name="{name}"]'
    assert loaded.page.get_attribute(node, "data-status") == "4"
    loaded.page.click(node)
    details = loaded.page.inner_text("#details")
    assert "float8 changed" in details and "float8 before" in details
    assert "float8_e4m3fn, fp8: K = 32, N = 64" in details
    loaded.screenshot("fp8-diff")
    loaded.close()
