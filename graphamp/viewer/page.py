"""The viewer page: one self-contained HTML file (styles, script and data inline; nothing is
fetched when it is viewed)."""

from __future__ import annotations

import html
import json
from importlib import resources

TEMPLATE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="generator" content="graphamp viewer">
<title>{title}</title>
<style>
{css}</style></head>
<body>
<header>
<div class="title">{heading}</div>
<nav id="crumbs" aria-label="group path"></nav>
<div id="searchbox"><input id="search" type="search" placeholder="Search node, op or tensor (/)"
 autocomplete="off" spellcheck="false"><ul id="results" hidden></ul></div>
<div id="zoom"><button id="zoom-out" title="zoom out">&minus;</button>
<button id="fit" title="fit to window">Fit</button>
<button id="zoom-in" title="zoom in">+</button></div>
</header>
<main>
<div id="canvas"><svg id="graph" xmlns="http://www.w3.org/2000/svg"><defs>
<marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7"
 orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#94a3b8"/></marker></defs>
<g id="viewport"></g></svg><div id="hint"><span id="status"></span></div></div>
<aside id="panel">
<section id="summary"></section>
<section id="filters"><h2>Show</h2>
<div class="filter" id="precision-filter"></div>
<details><summary>Rules</summary><div class="filter" id="rule-filter"></div></details>
<div class="filter"><label><input type="checkbox" id="show-plumbing">
shape plumbing and constants (<span id="plumbing-count">0</span>)</label></div>
</section>
<section id="details"></section>
</aside>
</main>
<script type="application/json" id="graphamp-data">{data}</script>
<script>
{js}</script>
</body></html>
"""


def _static(name: str) -> str:
    return resources.files("graphamp.viewer").joinpath("static", name).read_text("utf-8")


def render(data: dict[str, object], title: str, heading: str) -> str:
    """The page for ``data`` (:func:`graphamp.viewer.data.page_data`)."""
    payload = json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    # Inside <script>, "</" could end the element early; JSON allows "<\\/" for it.
    payload = payload.replace("</", "<\\/").replace("<!--", "<\\!--")
    return TEMPLATE.format(
        title=html.escape(title),
        heading=heading,
        css=_static("viewer.css"),
        js=_static("viewer.js"),
        data=payload,
    )
