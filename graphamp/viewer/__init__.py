"""The plan viewer: a self-contained HTML page to review a plan on a real model.

    >>> from graphamp import viewer
    >>> page = viewer.plan_page(plan, graph)                  # doctest: +SKIP
    >>> page = viewer.diff_page(old_plan, new_plan, graph)   # doctest: +SKIP

The graph is folded by module path (``layers`` > ``layers.3`` > ``attention``), one group
open at a time with its children as boxes showing their share of nodes per precision and
their casts; each view is laid out here, in Python (:mod:`graphamp.viewer.layout`). The page
searches nodes, ops and tensors, filters by precision and rule, hides shape plumbing and
constants by default, zooms and pans, and shows a selected node's reason chain as
``graphamp explain`` prints it. Nothing is fetched when it is viewed.
"""

from __future__ import annotations

import html

from graphamp.core.graph import OpGraph
from graphamp.plans.plan import Plan
from graphamp.viewer.data import PageInput, page_data
from graphamp.viewer.page import render

__all__ = ["diff_page", "plan_page"]


def plan_page(plan: Plan, graph: OpGraph) -> str:
    """One HTML page showing ``plan`` over ``graph``, nodes coloured by precision."""
    name = plan.model or "model"
    heading = f"graphamp plan: {html.escape(name)} &rarr; {html.escape(plan.dtype)}"
    return render(page_data(PageInput(plan, graph)), f"graphamp plan: {name}", heading)


def diff_page(old_plan: Plan, new_plan: Plan, graph: OpGraph) -> str:
    """One HTML page of ``graph`` coloured by what changed from ``old_plan`` to ``new_plan``:
    exactly the nodes :meth:`Plan.diff` lists are marked (precision changed, added, removed),
    and the casts added and removed are drawn on their edges."""
    difference = old_plan.diff(new_plan)
    old, new = difference.old_label, difference.new_label
    heading = f"graphamp diff: {html.escape(old)} &rarr; {html.escape(new)}"
    data = page_data(PageInput(new_plan, graph, old=old_plan, diff=difference))
    return render(data, f"graphamp diff: {old} -> {new}", heading)
