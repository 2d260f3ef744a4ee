"""Benchmark of the plan viewer: a synthetic 10,000-node plan, and the full-size BERT
of the zoo, rendered to HTML and opened in headless Chromium.

    python tools/bench/bench_viewer.py [--nodes 10000] [--bert] [--out DIR] [--runs 3]

For each page: the time Python takes to build it, its size, the time from navigation to the
page being usable (its script has drawn the first view and answers input), the time a search
takes to open a node's group and select it, and whether the first view fits a 1400 x 1000
window without zooming out below 60%. Screenshots go to --out.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tools" / "bench")]

from benchlib import machine  # noqa: E402

from graphamp import viewer  # noqa: E402
from graphamp.core.graph import NodeKind, OpGraph, OpNode, TensorInfo  # noqa: E402
from graphamp.plans.plan import Plan  # noqa: E402
from graphamp.plans.records import CastRecord, NodeDecision  # noqa: E402

WINDOW = {"width": 1400, "height": 1000}
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


class Builder:
    """A transformer-shaped graph named as the ONNX exporter names it, with its plan."""

    def __init__(self) -> None:
        self.graph = OpGraph("synthetic")
        self.nodes: dict[str, NodeDecision] = {}
        self.casts: list[CastRecord] = []
        self.graph.add_tensor(TensorInfo("input", "float32", is_graph_input=True))

    def stored(self, name: str) -> str:
        self.graph.add_tensor(TensorInfo(name, "float32"))
        return name

    def op(
        self,
        name: str,
        op: str,
        inputs: list[str],
        precision: str,
        rule: str,
        via: str | None = None,
        kind: NodeKind = NodeKind.OP,
    ) -> str:
        out = f"{name}_output_0"
        self.graph.add_tensor(TensorInfo(out, "float32"))
        self.graph.nodes[name] = OpNode(
            name, op, inputs, [out], kind=kind, follow_inputs=frozenset({0})
        )
        self.graph.tensors[out].producer = name
        reason = {
            "allow": "allow list: tensor-core work",
            "infer": "infer list op between low-precision ops",
            "clear": "follows its inputs",
            "deny": "deny list",
            "deny_spread": "on a deny path",
            "no_float": "no float math",
        }[rule]
        self.nodes[name] = NodeDecision(op, precision, rule, reason, via)
        return out

    def cast(self, tensor: str, src: str, dst: str, readers: list[str]) -> None:
        self.casts.append(CastRecord(tensor, src, dst, f"{tensor}__{dst}", readers))

    def layer(self, i: int, x: str) -> str:
        p = f"/model/layers.{i}"
        h, f = "float16", "float32"
        norm = self.op(
            f"{p}/norm1/LayerNormalization",
            "LayerNormalization",
            [x, self.stored(f"{p}.norm1.w"), self.stored(f"{p}.norm1.b")],
            f,
            "deny",
        )
        heads = []
        for k, part in enumerate(("query", "key", "value")):
            mm = self.op(
                f"{p}/attention/{part}/MatMul",
                "MatMul",
                [norm, self.stored(f"{p}.{part}.w")],
                h,
                "allow",
            )
            add = self.op(
                f"{p}/attention/{part}/Add",
                "Add",
                [mm, self.stored(f"{p}.{part}.b")],
                h,
                "infer",
                f"{p}/attention/{part}/MatMul",
            )
            shape = self.op(
                f"{p}/attention/Constant_{k}",
                "Constant",
                [],
                "none",
                "no_float",
                kind=NodeKind.CONSTANT,
            )
            r = self.op(f"{p}/attention/Reshape_{k}", "Reshape", [add, shape], h, "clear")
            heads.append(self.op(f"{p}/attention/Transpose_{k}", "Transpose", [r], h, "clear"))
        self.cast(norm, f, h, [f"{p}/attention/{q}/MatMul" for q in ("query", "key", "value")])
        scores = self.op(f"{p}/attention/MatMul", "MatMul", heads[:2], h, "allow")
        scale = self.op(
            f"{p}/attention/Constant_3", "Constant", [], "none", "no_float", kind=NodeKind.CONSTANT
        )
        div = self.op(f"{p}/attention/Div", "Div", [scores, scale], h, "infer")
        soft = self.op(f"{p}/attention/Softmax", "Softmax", [div], h, "infer")
        ctx = self.op(f"{p}/attention/MatMul_1", "MatMul", [soft, heads[2]], h, "allow")
        t = self.op(f"{p}/attention/Transpose_3", "Transpose", [ctx], h, "clear")
        shape = self.op(
            f"{p}/attention/Constant_4", "Constant", [], "none", "no_float", kind=NodeKind.CONSTANT
        )
        r = self.op(f"{p}/attention/Reshape_3", "Reshape", [t, shape], h, "clear")
        out = self.op(
            f"{p}/attention/output/MatMul", "MatMul", [r, self.stored(f"{p}.o.w")], h, "allow"
        )
        bias = self.op(
            f"{p}/attention/output/Add",
            "Add",
            [out, self.stored(f"{p}.o.b")],
            f,
            "deny_spread",
            f"{p}/Add",
        )
        self.cast(out, h, f, [f"{p}/attention/output/Add"])
        res = self.op(
            f"{p}/Add", "Add", [bias, x], f, "deny_spread", f"{p}/norm2/LayerNormalization"
        )
        norm2 = self.op(
            f"{p}/norm2/LayerNormalization",
            "LayerNormalization",
            [res, self.stored(f"{p}.norm2.w"), self.stored(f"{p}.norm2.b")],
            f,
            "deny",
        )
        up = self.op(
            f"{p}/mlp/mlp.0/MatMul", "MatMul", [norm2, self.stored(f"{p}.up.w")], h, "allow"
        )
        self.cast(norm2, f, h, [f"{p}/mlp/mlp.0/MatMul"])
        up_b = self.op(f"{p}/mlp/mlp.0/Add", "Add", [up, self.stored(f"{p}.up.b")], h, "infer")
        erf = self.op(f"{p}/mlp/mlp.1/Erf", "Erf", [up_b], h, "clear")
        gelu = self.op(f"{p}/mlp/mlp.1/Mul", "Mul", [up_b, erf], h, "clear")
        down = self.op(
            f"{p}/mlp/mlp.2/MatMul", "MatMul", [gelu, self.stored(f"{p}.down.w")], h, "allow"
        )
        down_b = self.op(
            f"{p}/mlp/mlp.2/Add",
            "Add",
            [down, self.stored(f"{p}.down.b")],
            f,
            "deny_spread",
            f"{p}/Add_1",
        )
        self.cast(down, h, f, [f"{p}/mlp/mlp.2/Add"])
        return self.op(
            f"{p}/Add_1", "Add", [down_b, norm2], f, "deny_spread", f"{p}/norm2/LayerNormalization"
        )


def synthetic(nodes: int) -> tuple[Plan, OpGraph]:
    """A plan of about ``nodes`` nodes: an embedding, transformer layers, a head."""
    b = Builder()
    x = b.op("/model/embed/Gather", "Gather", [b.stored("embed.w"), "input"], "float32", "clear")
    layer = 0
    while len(b.nodes) < nodes - 3:
        x = b.layer(layer, x)
        layer += 1
    x = b.op("/model/norm/LayerNormalization", "LayerNormalization", [x], "float32", "deny")
    logits = b.op("/lm_head/MatMul", "MatMul", [x, b.stored("head.w")], "float16", "allow")
    b.graph.tensors[logits].is_graph_output = True
    plan = Plan(
        "float16",
        {"dialect": "onnx"},
        nodes=b.nodes,
        casts=b.casts,
        model=f"synthetic-{len(b.nodes)}",
    )
    return plan, b.graph


def bert_full(folder: Path) -> tuple[Plan, OpGraph]:
    import graphamp.onnx as gonnx
    from graphamp.models import export_onnx

    path = export_onnx("bert", folder / "bert.onnx", "full")
    analysis = gonnx.analyse(str(path))
    analysis.plan.model = "bert.onnx (full)"
    return analysis.plan, analysis.graph


def measure(label: str, plan: Plan, graph: OpGraph, out: Path, runs: int, search: str) -> dict:
    from playwright.sync_api import sync_playwright

    start = time.perf_counter()
    html = viewer.plan_page(plan, graph)
    build_s = time.perf_counter() - start
    page_path = out / f"{label}.html"
    page_path.write_text(html, encoding="utf-8")
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    ready, searches, fits = [], [], None
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=ARGS)
        for run in range(runs + 1):  # the first run warms the disk cache and is not counted
            page = browser.new_page(viewport=WINDOW)
            errors: list[str] = []
            page.on("pageerror", lambda e, errors=errors: errors.append(str(e)))
            page.on(
                "console",
                lambda m, errors=errors: errors.append(m.text) if m.type == "error" else None,
            )
            page.goto(page_path.as_uri())
            page.wait_for_function("window.graphampViewer && graphampViewer.ready")
            if run:
                ready.append(page.evaluate("graphampViewer.readyAt"))
            if fits is None:
                fits = default_view(page)
                page.screenshot(path=str(out / f"{label}-default.png"))
            begin = page.evaluate("performance.now()")
            page.fill("#search", search)
            page.keyboard.press("Enter")
            page.wait_for_function("n => graphampViewer.state().selected === n", arg=search)
            if run:
                searches.append(page.evaluate("performance.now()") - begin)
            assert not errors, errors
            page.close()
        browser.close()
    return {
        "page": label,
        "nodes": len(graph.nodes),
        "build_s": round(build_s, 2),
        "bytes": len(html.encode("utf-8")),
        "ready_ms": round(statistics.median(ready)),
        "search_ms": round(statistics.median(searches)),
        **fits,
    }


def default_view(page) -> dict:
    """Whether every box of the first view lies inside the window's drawing area, and how
    much the view is scaled down to get there."""
    canvas = page.eval_on_selector("#canvas", "e => e.getBoundingClientRect().toJSON()")
    boxes = page.eval_on_selector_all(
        "#viewport rect", "els => els.map(e => e.getBoundingClientRect().toJSON())"
    )
    inside = all(
        b["left"] >= canvas["left"]
        and b["right"] <= canvas["right"]
        and b["top"] >= canvas["top"]
        and b["bottom"] <= canvas["bottom"]
        for b in boxes
    )
    state = page.evaluate("graphampViewer.state()")
    drawn = page.evaluate("document.querySelectorAll('g.node, g.group').length")
    return {
        "fits_window": inside,
        "scale": round(state["scale"], 2),
        "boxes": drawn,
        "group": state["group"] or "(top)",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--bert", action="store_true", help="also the full-size BERT zoo model")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="folder for pages and screenshots")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="bench-viewer-"))
    out.mkdir(parents=True, exist_ok=True)
    results = []
    plan, graph = synthetic(args.nodes)
    deep = next(n for n in reversed(list(graph.nodes)) if n.endswith("attention/Softmax"))
    results.append(measure(f"synthetic-{len(graph.nodes)}", plan, graph, out, args.runs, deep))
    if args.bert:
        with tempfile.TemporaryDirectory() as folder:
            plan, graph = bert_full(Path(folder))
        results.append(
            measure("bert-full", plan, graph, out, args.runs, "/layers.11/attention/Softmax")
        )
    print(f"# {datetime.date.today()} · {machine()}")
    print("| page | nodes | build s | page MB | ready ms | search ms | first view |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        view = (
            f"{r['group']}: {r['boxes']} boxes, scale {r['scale']}, "
            f"{'fits' if r['fits_window'] else 'does not fit'} 1400x1000"
        )
        print(
            f"| {r['page']} | {r['nodes']} | {r['build_s']} | {r['bytes'] / 1e6:.2f} | "
            f"{r['ready_ms']} | {r['search_ms']} | {view} |"
        )
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print(f"pages, screenshots and results.json in {out}")
    ok = all(r["bytes"] < 5e6 and r["ready_ms"] < 2000 and r["fits_window"] for r in results)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
