// graphamp plan viewer: draws the views laid out in Python (graphamp/viewer/layout.py) from the
// data embedded in this page. No network, no library: one group is open at a time.
(function () {
  "use strict";
  const D = JSON.parse(document.getElementById("graphamp-data").textContent);
  const S = D.strings, N = D.nodes, T = D.tensors, G = D.groups;
  const MIN_OPEN_SCALE = 0.45;
  const NODE = [156, 40], GROUP = [208, 62], PORT = [172, 24];
  const COLOURS = { float16: "#2563eb", bfloat16: "#7c3aed", float32: "#f59e0b",
    float64: "#a16207", none: "#9ca3af", unknown: "#d1d5db" };
  const LIGHT_TEXT = new Set(["float16", "bfloat16", "float64"]);
  const STATUS = ["unchanged", "precision changed", "added", "removed", "float8 changed"];
  const STATUS_COLOURS = ["#e5e7eb", "#f97316", "#16a34a", "#dc2626", "#a855f7"];
  const CAST_STATUS = ["same", "added", "removed"];
  const GRAPH_INPUT = 1;
  const diffMode = D.mode === "diff";
  const nNodes = N.name.length, nGroups = G.id.length;
  const ROOT = G.id.indexOf("");
  const $ = (id) => document.getElementById(id);
  const esc = (s) => String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;",
    ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
  const prec = (i) => S[N.precision[i]];
  const short = { float32: "f32", float16: "f16", bfloat16: "bf16", float64: "f64" };
  const abbrev = (t) => short[t] || t;

  const nameIndex = new Map(N.name.map((n, i) => [n, i]));
  const consumers = Array.from({ length: T.name.length }, () => []);
  N.inputs.forEach((ins, i) => ins.forEach((t) => {
    if (t >= 0 && !consumers[t].includes(i)) consumers[t].push(i);
  }));
  const precisions = [...new Set(N.group.map((g, i) => (g >= 0 ? prec(i) : null)).filter(Boolean))];
  const rules = [...new Set(N.group.map((g, i) => (g >= 0 ? S[N.rule[i]] : null)).filter((r) => r !== null))];
  const state = { group: ROOT, showPlumbing: false, precisions: new Set(precisions),
    rules: new Set(rules), selected: -1, tensor: -1, scale: 1, tx: 0, ty: 0, counts: null };

  function ancestors(g) { const out = []; for (; g >= 0; g = G.parent[g]) out.push(g); return out; }
  function viewOf(g) {
    const v = D.views[g];
    if (!v) return null;
    if (state.showPlumbing) return v.all;
    if (v.compute === 0) return v.all;
    return v.compute || null;
  }
  function inVariant(i) { return state.showPlumbing || !N.plumbing[i]; }
  function passes(i) {
    return inVariant(i) && state.precisions.has(prec(i)) && state.rules.has(S[N.rule[i]]);
  }

  // Per group: nodes per precision (as drawn), nodes the filters let through, casts, changes.
  function countGroups() {
    const c = { prec: Array.from({ length: nGroups }, () => ({})), shown: new Array(nGroups).fill(0),
      total: new Array(nGroups).fill(0), casts: new Array(nGroups).fill(0),
      changed: new Array(nGroups).fill(0) };
    for (let i = 0; i < nNodes; i++) {
      if (N.group[i] < 0 || !inVariant(i)) continue;
      const p = prec(i), ok = passes(i);
      for (const g of ancestors(N.group[i])) {
        c.prec[g][p] = (c.prec[g][p] || 0) + 1;
        c.total[g]++;
        if (ok) c.shown[g]++;
        if (N.status[i]) c.changed[g]++;
      }
    }
    D.casts.forEach((cast) => {
      const at = new Set();
      cast[4].forEach((i) => { if (N.group[i] >= 0) ancestors(N.group[i]).forEach((g) => at.add(g)); });
      const producer = cast[0] >= 0 ? T.producer[cast[0]] : -1;
      if (cast[5] === 1 && producer >= 0) ancestors(N.group[producer]).forEach((g) => at.add(g));
      at.forEach((g) => c.casts[g]++);
    });
    state.counts = c;
  }

  // ---- drawing -------------------------------------------------------------------------
  function trunc(text, max) {
    if (text.length <= max) return text;
    const head = Math.ceil((max - 1) / 2), tail = Math.floor((max - 1) / 2);
    return text.slice(0, head) + "…" + text.slice(text.length - tail);
  }
  function itemVisible(kind, ref) {
    if (kind === 0) return passes(ref);
    if (kind === 1) return state.counts.shown[ref] > 0;
    return true;
  }
  function nodeSvg(i, x, y) {
    const [w, h] = NODE, p = prec(i);
    const fill = diffMode ? STATUS_COLOURS[N.status[i]] : COLOURS[p] || "#10b981";
    const dark = diffMode ? N.status[i] === 0 : !LIGHT_TEXT.has(p);
    const ink = dark ? "#1f2937" : "#fff";
    let sub = N.leaf[i];
    if (diffMode && N.status[i] === 1) sub = abbrev(S[N.before[i][0]]) + " → " + abbrev(p) + "  " + sub;
    if (diffMode && N.status[i] === 4) sub = fp8Rule(N.fp8_before[i]) + " → " + fp8Rule(N.fp8[i]) + "  " + sub;
    if (isFp8(i)) sub = "fp8 · " + sub;
    const cls = ["node", N.status[i] ? "changed" : "", i === state.selected ? "selected" : "",
      passes(i) ? "" : "filtered", isFp8(i) ? "fp8" : ""].join(" ");
    const tip = `${N.name[i]}\n${S[N.op[i]]}: ${p}\n${S[N.rule[i]]}: ${S[N.reason[i]]}` +
      (N.fp8[i] ? `\nfloat8: ${S[N.fp8[i][1]]}: ${S[N.fp8[i][2]]}` : "") +
      (diffMode ? `\n${STATUS[N.status[i]]}` : "");
    const strip = diffMode ? `<rect x="${x - w / 2}" y="${y - h / 2}" width="6" height="${h}" fill="${COLOURS[p] || "#10b981"}"/>` : "";
    return `<g class="${cls}" data-i="${i}" data-name="${esc(N.name[i])}" data-precision="${esc(p)}" data-rule="${esc(S[N.rule[i]])}" data-status="${N.status[i]}" data-fp8="${N.fp8[i] ? esc(S[N.fp8[i][1]]) : ""}"><title>${esc(tip)}</title>` +
      `<rect class="box" x="${x - w / 2}" y="${y - h / 2}" width="${w}" height="${h}" rx="6" fill="${fill}"/>${strip}` +
      `<text class="op" x="${x - w / 2 + 10}" y="${y - 3}" fill="${ink}">${esc(trunc(S[N.op[i]], 22))}</text>` +
      `<text class="sub" x="${x - w / 2 + 10}" y="${y + 12}" fill="${ink}">${esc(trunc(sub, 26))}</text></g>`;
  }
  function groupSvg(g, x, y) {
    const [w, h] = GROUP, c = state.counts;
    const total = c.total[g] || 1;
    let bar = "", left = x - w / 2 + 8;
    const width = w - 16;
    const parts = diffMode ? [["#f97316", c.changed[g]], ["#e5e7eb", c.total[g] - c.changed[g]]]
      : Object.keys(c.prec[g]).sort().map((p) => [COLOURS[p] || "#10b981", c.prec[g][p]]);
    for (const [colour, count] of parts) {
      const seg = (width * count) / total;
      if (seg > 0) bar += `<rect x="${left.toFixed(1)}" y="${y + h / 2 - 13}" width="${seg.toFixed(1)}" height="6" fill="${colour}"/>`;
      left += seg;
    }
    const shares = Object.keys(c.prec[g]).sort().map((p) => `${p} ${c.prec[g][p]} (${Math.round((100 * c.prec[g][p]) / total)}%)`).join(", ");
    let sub = `${c.total[g]} ops · ${c.casts[g]} cast${c.casts[g] === 1 ? "" : "s"}`;
    if (diffMode) sub += ` · ${c.changed[g]} changed`;
    const cls = ["group", diffMode && c.changed[g] ? "changed" : "", c.shown[g] ? "" : "filtered"].join(" ");
    return `<g class="${cls}" data-g="${g}" data-group="${esc(G.id[g])}"><title>${esc(G.label[g])} — click to open\n${esc(shares)}</title>` +
      `<rect class="tab" x="${x - w / 2 + 8}" y="${y - h / 2 - 5}" width="60" height="8" rx="2"/>` +
      `<rect class="box" x="${x - w / 2}" y="${y - h / 2}" width="${w}" height="${h}" rx="7"/>` +
      `<text class="label" x="${x - w / 2 + 10}" y="${y - h / 2 + 18}">${esc(trunc(G.label[g], 28))}</text>` +
      `<text class="sub" x="${x - w / 2 + 10}" y="${y - h / 2 + 34}">${esc(sub)}</text>${bar}</g>`;
  }
  function portSvg(kind, t, x, y) {
    const [w, h] = PORT;
    const dir = kind === 2 ? "in" : "out";
    const label = (kind === 2 ? "▼ " : "▲ ") + trunc(T.name[t], 26);
    const cls = `port ${dir}${t === state.tensor ? " selected" : ""}`;
    return `<g class="${cls}" data-t="${t}"><title>${esc(T.name[t])} (${esc(S[T.dtype[t]])}): ${dir === "in" ? "enters" : "leaves"} this group</title>` +
      `<rect x="${x - w / 2}" y="${y - h / 2}" width="${w}" height="${h}" rx="12"/>` +
      `<text x="${x - w / 2 + 10}" y="${y + 4}">${esc(label)}</text></g>`;
  }
  function pathOf(points) {
    let d = `M${points[0]},${points[1]}`;
    for (let k = 2; k < points.length; k += 2) {
      const x0 = points[k - 2], y0 = points[k - 1], x1 = points[k], y1 = points[k + 1];
      const my = (y0 + y1) / 2;
      d += x0 === x1 ? ` L${x1},${y1}` : ` C${x0},${my} ${x1},${my} ${x1},${y1}`;
    }
    return d;
  }
  function edgeSvg(edge, items, index) {
    const [s, t, tensors, casts, points] = edge;
    if (points.length < 4) return "";
    const hidden = !itemVisible(items[s][0], items[s][1]) || !itemVisible(items[t][0], items[t][1]);
    const touches = (item) => (item[0] === 0 && item[1] === state.selected);
    const hl = touches(items[s]) || touches(items[t]) || tensors.includes(state.tensor);
    const names = tensors.slice(0, 6).map((k) => `${T.name[k]} (${S[T.dtype[k]]})`).join("\n") +
      (tensors.length > 6 ? `\n… and ${tensors.length - 6} more` : "");
    let mark = "";
    if (casts.length) {
      const first = D.casts[casts[0]];
      let text = `${abbrev(S[first[1]])}→${abbrev(S[first[2]])}`;
      if (casts.length > 1) text += ` +${casts.length - 1}`;
      const n = points.length, mx = (points[n - 4] + points[n - 2]) / 2, my = (points[n - 3] + points[n - 1]) / 2;
      const w = 8 + text.length * 6;
      const status = diffMode ? " " + CAST_STATUS[first[6]] : "";
      const tip = casts.map((c) => { const r = D.casts[c]; return `Cast ${r[7]}: ${S[r[1]]} -> ${S[r[2]]}` + (diffMode ? ` (${CAST_STATUS[r[6]]})` : ""); }).join("\n");
      mark = `<g class="cast-mark${status}" data-casts="${casts.join(",")}"><title>${esc(tip)}</title><rect x="${mx - w / 2}" y="${my - 8}" width="${w}" height="16" rx="4"/>` +
        `<text x="${mx - w / 2 + 4}" y="${my + 4}">${esc(text)}</text></g>`;
    }
    const cls = ["edge", casts.length ? "cast" : "", hl ? "hl" : "", hidden ? "filtered" : ""].join(" ");
    return `<g class="${cls}" data-e="${index}"><title>${esc(names)}</title><path d="${pathOf(points)}" marker-end="url(#arrow)"/>${mark}</g>`;
  }
  function render() {
    const view = viewOf(state.group);
    const parts = [];
    if (view) {
      view.edges.forEach((e, k) => parts.push(edgeSvg(e, view.items, k)));
      for (const [kind, ref, x, y] of view.items) {
        if (kind === 0) parts.push(nodeSvg(ref, x, y));
        else if (kind === 1) parts.push(groupSvg(ref, x, y));
        else parts.push(portSvg(kind, ref, x, y));
      }
    }
    $("viewport").innerHTML = parts.join("");
    applyTransform();
    renderCrumbs();
    $("status").textContent = view ? `${view.items.filter((it) => it[0] === 0).length} nodes and ${view.items.filter((it) => it[0] === 1).length} groups here; ${view.crossings} edge crossings` : "nothing to draw here with these filters";
  }
  function renderCrumbs() {
    const chain = ancestors(state.group).reverse();
    $("crumbs").innerHTML = chain.map((g, k) => (k === chain.length - 1
      ? `<span class="here" data-g="${g}">${esc(g === ROOT ? modelLabel() : G.label[g])}</span>`
      : `<a data-g="${g}">${esc(g === ROOT ? modelLabel() : G.label[g])}</a>`)).join('<span class="sep">›</span>');
  }
  function modelLabel() { return D.model ? D.model.split(/[\\/]/).pop() : "model"; }

  // ---- zoom and pan --------------------------------------------------------------------
  function applyTransform() {
    $("viewport").setAttribute("transform", `translate(${state.tx},${state.ty}) scale(${state.scale})`);
  }
  // The whole view in the window; on opening a group, never below a readable scale (a long
  // chain of layers then starts at its top, and the rest is a drag or a wheel away).
  function fit(readable) {
    const view = viewOf(state.group);
    const box = $("graph").getBoundingClientRect();
    if (!view) return;
    state.scale = Math.min(1, (box.width - 20) / view.w, (box.height - 20) / view.h);
    if (readable === true) state.scale = Math.max(state.scale, MIN_OPEN_SCALE);
    state.tx = (box.width - view.w * state.scale) / 2;
    state.ty = Math.max(0, (box.height - view.h * state.scale) / 2);
    applyTransform();
  }
  function zoomAt(factor, cx, cy) {
    const scale = Math.min(4, Math.max(0.05, state.scale * factor));
    state.tx = cx - ((cx - state.tx) * scale) / state.scale;
    state.ty = cy - ((cy - state.ty) * scale) / state.scale;
    state.scale = scale;
    applyTransform();
  }
  function centreOn(x, y) {
    const box = $("graph").getBoundingClientRect();
    if (state.scale < 0.6) state.scale = 0.9;
    state.tx = box.width / 2 - x * state.scale;
    state.ty = box.height / 2 - y * state.scale;
    applyTransform();
  }
  function ensureVisible(kind, ref) {
    const view = viewOf(state.group);
    const item = view && view.items.find((it) => it[0] === kind && it[1] === ref);
    if (!item) return;
    const box = $("graph").getBoundingClientRect();
    const sx = state.tx + item[2] * state.scale, sy = state.ty + item[3] * state.scale;
    if (state.scale < 0.6 || sx < 80 || sy < 40 || sx > box.width - 80 || sy > box.height - 40) centreOn(item[2], item[3]);
  }

  // ---- navigation and selection ----------------------------------------------------------
  function open(g, keepView) {
    state.group = g;
    if (!keepView) { state.selected = -1; state.tensor = -1; }
    render();
    fit(true);
    if (state.selected < 0) showGroup(g);
  }
  function startGroup() {
    // Open a group that is all there is to see at its level: a "model" wrapper, perhaps with
    // one node beside it (an LM head).
    let g = ROOT;
    for (;;) {
      const view = viewOf(g);
      if (!view) return g;
      const boxes = view.items.filter((it) => it[0] < 2);
      const groups = boxes.filter((it) => it[0] === 1);
      if (groups.length !== 1 || boxes.length > 2) return g;
      g = groups[0][1];
    }
  }
  function reveal(i) {
    // A node hidden by the toggle or the filters comes back into view when asked for.
    if (N.plumbing[i] && !state.showPlumbing) { state.showPlumbing = true; $("show-plumbing").checked = true; }
    const p = prec(i), r = S[N.rule[i]];
    if (!state.precisions.has(p)) { state.precisions.add(p); checkBox("precision", p); }
    if (!state.rules.has(r)) { state.rules.add(r); checkBox("rule", r); }
    countGroups();
  }
  function checkBox(kind, value) {
    document.querySelectorAll(`input[data-${kind}]`).forEach((box) => {
      if (box.dataset[kind] === value) box.checked = true;
    });
  }
  function selectNode(i) {
    if (N.group[i] < 0) { showNode(i); return; }
    reveal(i);
    state.selected = i; state.tensor = -1;
    if (state.group !== N.group[i]) { state.group = N.group[i]; render(); fit(true); } else render();
    ensureVisible(0, i);
    showNode(i);
  }
  function selectTensor(t) {
    const at = T.producer[t] >= 0 ? T.producer[t] : consumers[t][0];
    if (at !== undefined && at >= 0 && N.group[at] >= 0) {
      reveal(at);
      if (state.group !== N.group[at]) { state.group = N.group[at]; render(); fit(true); }
      ensureVisible(0, at);
    }
    state.selected = -1; state.tensor = t;
    render();
    showTensor(t);
  }

  // ---- the side panel ----------------------------------------------------------------------
  function pyRepr(s) {
    const quote = s.includes("'") && !s.includes('"') ? '"' : "'";
    let out = quote;
    for (const ch of s) {
      const code = ch.codePointAt(0);
      if (ch === quote || ch === "\\") out += "\\" + ch;
      else if (ch === "\n") out += "\\n";
      else if (ch === "\r") out += "\\r";
      else if (ch === "\t") out += "\\t";
      else if (code < 32 || (code >= 127 && code < 161) || code === 173) out += "\\x" + code.toString(16).padStart(2, "0");
      else out += ch;
    }
    return out + quote;
  }
  // What `graphamp explain` prints for node i (graphamp/plans/report.py: explain), line for line.
  function explain(i) {
    if (!N.planned[i]) return `no node named ${pyRepr(N.name[i])} in the plan\n`;
    const lines = [], seen = new Set();
    for (let current = i, depth = 0; current >= 0 && !seen.has(current); current = N.via[current], depth++) {
      seen.add(current);
      const arrow = depth === 0 ? "" : "  ".repeat(depth) + "<- ";
      lines.push(`${arrow}${N.name[current]} (${S[N.op[current]]}): ${prec(current)}, rule ${S[N.rule[current]]}: ${S[N.reason[current]]}`);
    }
    lines.push(...fp8Lines(i));
    if (N.group[i] >= 0) {
      N.inputs[i].forEach((t, slot) => {
        if (t < 0) return;
        const producer = T.producer[t];
        let source;
        if (producer >= 0) source = N.planned[producer] ? `from ${N.name[producer]} (${prec(producer)})` : `from ${N.name[producer]}`;
        else source = T.flags[t] & GRAPH_INPUT ? "graph input" : "stored value";
        const cast = D.casts.find((c) => c[5] === 0 && c[6] !== 2 && c[0] === t && c[4].includes(i));
        const moved = cast && cast[8] >= 0 ? ` (${cast[8]} bytes per run)` : "";
        const how = cast ? `; cast ${S[cast[1]]} -> ${S[cast[2]]}${moved} as ${pyRepr(cast[3])}` : "";
        const follows = N.follows[i].includes(slot) ? "follows the node's precision" : "keeps its type";
        lines.push(`  input ${slot} ${pyRepr(T.name[t])} ${source}, ${follows}${how}`);
      });
    }
    return lines.join("\n") + "\n";
  }
  // The node's float8 decision and its operands' scale sources (report.py: fp8_lines).
  function fp8Lines(i) {
    const f = N.fp8[i];
    if (!f) return [];
    const lines = [`  float8: ${S[f[0]]}, rule ${S[f[1]]}: ${S[f[2]]}`];
    for (const [label, value, source] of f[3]) {
      if (label === "table") {
        lines.push(`  table ${pyRepr(value)}: ${source || `kept ${D.dtype}`}`);
      } else {
        lines.push(`  operand ${label} ${pyRepr(value)}: ${source || `not quantised (${D.dtype})`}`);
      }
    }
    return lines;
  }
  const isFp8 = (i) => Boolean(N.fp8[i]) && S[N.fp8[i][0]] === "float8_e4m3fn";
  const fp8Rule = (decision) => (decision ? S[decision[1]] : "none");
  const nodeLink = (i) => `<a data-node="${i}">${esc(N.name[i])}</a>`;
  const tensorLink = (t) => `<a data-tensor="${t}">${esc(T.name[t])}</a>`;
  const groupLink = (g) => `<a data-g="${g}">${esc(g === ROOT ? modelLabel() : G.id[g])}</a>`;
  function swatch(p) { return `<span class="swatch" style="background:${COLOURS[p] || "#10b981"}"></span> ${esc(p)}`; }
  function showNode(i) {
    const rows = [["op", esc(S[N.op[i]])], ["precision", swatch(prec(i))], ["rule", esc(S[N.rule[i]])],
      ["reason", esc(S[N.reason[i]])]];
    if (N.via[i] >= 0) rows.push(["via", nodeLink(N.via[i])]);
    if (N.fp8[i]) {
      rows.push(["float8", `${esc(S[N.fp8[i][0]])}, ${esc(S[N.fp8[i][1]])}: ${esc(S[N.fp8[i][2]])}`]);
      for (const [label, value, source] of N.fp8[i][3]) rows.push([`scale ${label}`, `${esc(value)}: ${esc(source || "not quantised")}`]);
    }
    if (N.flops[i] !== null) rows.push(["flops", N.flops[i].toLocaleString("en")]);
    if (N.group[i] >= 0) rows.push(["group", groupLink(N.group[i])]);
    if (N.plumbing[i]) rows.push(["", "shape plumbing or constant (hidden by default)"]);
    if (diffMode) {
      rows.push(["change", esc(STATUS[N.status[i]])]);
      if (N.before[i]) rows.push(["before", `${swatch(S[N.before[i][0]])}, ${esc(S[N.before[i][1]])}: ${esc(S[N.before[i][2]])}`]);
      if (N.status[i] === 4) rows.push(["float8 before", N.fp8_before[i] ? `${esc(S[N.fp8_before[i][0]])}, ${esc(S[N.fp8_before[i][1]])}: ${esc(S[N.fp8_before[i][2]])}` : "none"]);
    }
    const inputs = N.inputs[i].map((t, slot) => (t < 0 ? "" : `<li>${slot}: ${tensorLink(t)} <span class="muted">${esc(S[T.dtype[t]])}</span>` +
      (T.producer[t] >= 0 ? ` from ${nodeLink(T.producer[t])}` : T.flags[t] & GRAPH_INPUT ? " (graph input)" : " (stored value)") + castsOn(t, i) + "</li>")).join("");
    const outputs = N.outputs[i].map((t) => (t < 0 ? "" : `<li>${tensorLink(t)} <span class="muted">${esc(S[T.dtype[t]])}</span>` +
      (consumers[t].length ? ` to ${consumers[t].slice(0, 8).map(nodeLink).join(", ")}${consumers[t].length > 8 ? " …" : ""}` : "") + "</li>")).join("");
    $("details").innerHTML = `<h2>Node</h2><h3 id="selected-name">${esc(N.name[i])}</h3><table>${rows.map(([k, v]) => `<tr><td>${k}</td><td>${v}</td></tr>`).join("")}</table>` +
      `<h2>Why (graphamp explain)</h2><pre id="explain">${esc(explain(i))}</pre>` +
      `<h2>Inputs</h2><ul class="list">${inputs || "<li class=muted>none</li>"}</ul><h2>Outputs</h2><ul class="list">${outputs || "<li class=muted>none</li>"}</ul>`;
  }
  function castsOn(t, reader) {
    return D.casts.filter((c) => c[0] === t && (reader < 0 || c[4].includes(reader)))
      .map((c) => ` <b class="cast-note">cast ${esc(S[c[1]])} → ${esc(S[c[2]])}${diffMode ? ` (${CAST_STATUS[c[6]]})` : ""}</b>`).join("");
  }
  function showTensor(t) {
    const producer = T.producer[t];
    $("details").innerHTML = `<h2>Tensor</h2><h3 id="selected-name">${esc(T.name[t])}</h3><table>` +
      `<tr><td>type</td><td>${esc(S[T.dtype[t]])}</td></tr>` +
      `<tr><td>from</td><td>${producer >= 0 ? nodeLink(producer) : T.flags[t] & GRAPH_INPUT ? "graph input" : "stored value"}</td></tr>` +
      `<tr><td>to</td><td>${consumers[t].map(nodeLink).join(", ") || "—"}</td></tr>` +
      `<tr><td>casts</td><td>${castsOn(t, -1) || "none"}</td></tr></table>`;
  }
  function showGroup(g) {
    const c = state.counts;
    const shares = Object.keys(c.prec[g]).sort().map((p) => `<tr><td>${swatch(p)}</td><td>${c.prec[g][p]} (${Math.round((100 * c.prec[g][p]) / (c.total[g] || 1))}%)</td></tr>`).join("");
    let changed = "";
    if (diffMode) {
      const list = [];
      for (let i = 0; i < nNodes && list.length < 200; i++) if (N.status[i] && N.group[i] >= 0 && ancestors(N.group[i]).includes(g)) list.push(i);
      changed = `<h2>Changed here (${c.changed[g]})</h2><ul class="list">${list.map((i) => `<li>${nodeLink(i)} <span class="muted">${esc(STATUS[N.status[i]])}</span></li>`).join("")}</ul>`;
    }
    $("details").innerHTML = `<h2>Group</h2><h3>${esc(g === ROOT ? modelLabel() : G.id[g])}</h3><table>` +
      `<tr><td>nodes</td><td>${c.total[g]}</td></tr>${shares}<tr><td>casts</td><td>${c.casts[g]}</td></tr></table>${changed}` +
      `<p class="muted">Click a box to open it, a node for its reasons; drag to pan, wheel to zoom; / searches.</p>`;
  }

  // ---- summary and filters -----------------------------------------------------------------
  function renderSummary() {
    const counts = {};
    const ruleCounts = {};
    let plumbing = 0;
    for (let i = 0; i < nNodes; i++) {
      if (N.group[i] < 0) continue;
      counts[prec(i)] = (counts[prec(i)] || 0) + 1;
      ruleCounts[S[N.rule[i]]] = (ruleCounts[S[N.rule[i]]] || 0) + 1;
      plumbing += N.plumbing[i];
    }
    const s = D.summary;
    let head = `<table><tr><td>nodes</td><td>${Object.values(counts).reduce((a, b) => a + b, 0)}</td></tr>` +
      `<tr><td>casts inserted</td><td>${s.casts_inserted}</td></tr>` +
      `<tr><td>matrix ops in ${esc(D.dtype)}</td><td>${s.matrix_ops_low} of ${s.matrix_ops}</td></tr></table>`;
    if (diffMode) {
      const d = D.diff;
      head = `<table><tr><td>old</td><td>${esc(d.old)}</td></tr><tr><td>new</td><td>${esc(d.new)}</td></tr>` +
        `<tr><td>nodes changed</td><td id="diff-count">${d.changed.length}</td></tr>` +
        `<tr><td>casts</td><td>${d.casts_added} added, ${d.casts_removed} removed</td></tr>` +
        (d.dtype ? `<tr><td>dtype</td><td>${esc(d.dtype[0])} → ${esc(d.dtype[1])}</td></tr>` : "") + "</table>";
      const missing = d.changed.filter((n) => !nameIndex.has(n) || N.group[nameIndex.get(n)] < 0);
      if (missing.length) head += `<p class="muted">Not in this graph: ${missing.map(esc).join(", ")}</p>`;
      head += `<p>${STATUS.map((label, k) => `<span class="swatch" style="background:${STATUS_COLOURS[k]}"></span> ${label}`).join(" &nbsp;")}</p>`;
    }
    $("summary").innerHTML = head;
    $("precision-filter").innerHTML = precisions.sort().map((p) => `<label><input type="checkbox" data-precision="${esc(p)}" checked>${swatch(p)} <span class="muted">${counts[p]}</span></label>`).join("");
    $("rule-filter").innerHTML = rules.sort().map((r) => `<label><input type="checkbox" data-rule="${esc(r)}" checked>${esc(r || "(none)")} <span class="muted">${ruleCounts[r]}</span></label>`).join("");
    $("plumbing-count").textContent = plumbing;
  }
  function onFilter(event) {
    const box = event.target;
    if (box.dataset.precision !== undefined) (box.checked ? state.precisions.add(box.dataset.precision) : state.precisions.delete(box.dataset.precision));
    else if (box.dataset.rule !== undefined) (box.checked ? state.rules.add(box.dataset.rule) : state.rules.delete(box.dataset.rule));
    else if (box.id === "show-plumbing") {
      state.showPlumbing = box.checked;
      if (state.selected >= 0 && !inVariant(state.selected)) state.selected = -1;
      while (!viewOf(state.group) && G.parent[state.group] >= 0) state.group = G.parent[state.group];
      countGroups(); render(); fit(true); return;
    } else return;
    countGroups();
    render();
  }

  // ---- search ------------------------------------------------------------------------------
  const lowerNames = N.name.map((n) => n.toLowerCase());
  const lowerTensors = T.name.map((n) => n.toLowerCase());
  let results = [], active = 0;
  function search(query) {
    const q = query.trim().toLowerCase();
    const found = [], seen = new Set();
    if (!q) return found;
    const push = (kind, ref, rank) => { const key = kind + ref; if (!seen.has(key)) { seen.add(key); found.push([rank, kind, ref]); } };
    for (let i = 0; i < nNodes; i++) {
      if (N.group[i] < 0) continue;
      const name = lowerNames[i];
      if (name === q || N.leaf[i].toLowerCase() === q) push("node", i, 0);
      else if (S[N.op[i]].toLowerCase() === q) push("node", i, 2);
      else if (name.includes(q)) push("node", i, 1);
    }
    for (let t = 0; t < T.name.length && found.length < 400; t++) if (lowerTensors[t].includes(q)) push("tensor", t, lowerTensors[t] === q ? 0 : 3);
    found.sort((a, b) => a[0] - b[0] || (a[1] === b[1] ? a[2] - b[2] : a[1] < b[1] ? -1 : 1));
    return found.slice(0, 50).map(([, kind, ref]) => ({ kind, ref }));
  }
  function showResults() {
    const list = $("results");
    if (!results.length) { list.hidden = true; list.innerHTML = ""; return; }
    list.innerHTML = results.map((r, k) => {
      const cls = k === active ? "active" : "";
      if (r.kind === "node") {
        const where = N.group[r.ref] >= 0 && N.group[r.ref] !== ROOT ? G.id[N.group[r.ref]] : modelLabel();
        return `<li class="${cls}" data-k="${k}"><span class="kind">${esc(S[N.op[r.ref]])}</span>${esc(N.name[r.ref])}<span class="where">${swatch(prec(r.ref))} · in ${esc(where)}</span></li>`;
      }
      return `<li class="${cls}" data-k="${k}"><span class="kind">tensor</span>${esc(T.name[r.ref])}<span class="where">${esc(S[T.dtype[r.ref]])}</span></li>`;
    }).join("");
    list.hidden = false;
  }
  function choose(k) {
    const r = results[k];
    if (!r) return;
    results = []; showResults();
    if (r.kind === "node") selectNode(r.ref); else selectTensor(r.ref);
  }

  // ---- events ------------------------------------------------------------------------------
  function closest(target, attribute) {
    for (let el = target; el && el !== document; el = el.parentNode) if (el.getAttribute && el.getAttribute(attribute) !== null) return el;
    return null;
  }
  let drag = null;
  const svg = $("graph");
  svg.addEventListener("pointerdown", (e) => { drag = { x: e.clientX, y: e.clientY, tx: state.tx, ty: state.ty, moved: false }; });
  svg.addEventListener("pointermove", (e) => {
    if (!drag) return;
    const dx = e.clientX - drag.x, dy = e.clientY - drag.y;
    if (!drag.moved && Math.abs(dx) + Math.abs(dy) < 4) return;
    if (!drag.moved) { drag.moved = true; svg.setPointerCapture(e.pointerId); svg.classList.add("panning"); }
    state.tx = drag.tx + dx; state.ty = drag.ty + dy; applyTransform();
  });
  svg.addEventListener("pointerup", (e) => {
    const moved = drag && drag.moved;
    drag = null; svg.classList.remove("panning");
    if (moved) return;
    const node = closest(e.target, "data-i"), group = closest(e.target, "data-g"), port = closest(e.target, "data-t");
    if (node) selectNode(+node.dataset.i);
    else if (group) open(+group.dataset.g);
    else if (port) selectTensor(+port.dataset.t);
  });
  svg.addEventListener("wheel", (e) => {
    e.preventDefault();
    const box = svg.getBoundingClientRect();
    zoomAt(Math.exp(-e.deltaY * 0.0015), e.clientX - box.left, e.clientY - box.top);
  }, { passive: false });
  document.body.addEventListener("click", (e) => {
    const link = e.target.closest && e.target.closest("a[data-node], a[data-tensor], a[data-g], li[data-k]");
    if (!link || svg.contains(link)) return;
    if (link.dataset.node !== undefined) selectNode(+link.dataset.node);
    else if (link.dataset.tensor !== undefined) selectTensor(+link.dataset.tensor);
    else if (link.dataset.g !== undefined) open(+link.dataset.g);
    else if (link.dataset.k !== undefined) choose(+link.dataset.k);
  });
  $("filters").addEventListener("change", onFilter);
  $("search").addEventListener("input", (e) => { results = search(e.target.value); active = 0; showResults(); });
  $("search").addEventListener("keydown", (e) => {
    if (e.key === "ArrowDown") { active = Math.min(results.length - 1, active + 1); showResults(); e.preventDefault(); }
    else if (e.key === "ArrowUp") { active = Math.max(0, active - 1); showResults(); e.preventDefault(); }
    else if (e.key === "Enter") { if (!results.length) results = search(e.target.value); choose(active); }
    else if (e.key === "Escape") { results = []; showResults(); e.target.blur(); }
  });
  document.addEventListener("keydown", (e) => {
    if (e.target.tagName === "INPUT") return;
    if (e.key === "/") { $("search").focus(); e.preventDefault(); }
    else if (e.key === "Backspace" && G.parent[state.group] >= 0) open(G.parent[state.group]);
    else if (e.key === "Escape") { state.selected = -1; state.tensor = -1; render(); showGroup(state.group); }
  });
  $("zoom-in").addEventListener("click", () => { const b = svg.getBoundingClientRect(); zoomAt(1.25, b.width / 2, b.height / 2); });
  $("zoom-out").addEventListener("click", () => { const b = svg.getBoundingClientRect(); zoomAt(0.8, b.width / 2, b.height / 2); });
  $("fit").addEventListener("click", () => fit(false));
  window.addEventListener("resize", () => fit(true));

  // ---- start ---------------------------------------------------------------------------------
  countGroups();
  renderSummary();
  open(startGroup());
  window.graphampViewer = {
    ready: true,
    readyAt: performance.now(), // milliseconds since navigation began: the page is usable
    explain: (name) => explain(nameIndex.get(name)),
    open: (id) => { const g = G.id.indexOf(id); if (g < 0) throw new Error(`no group ${id}`); open(g); },
    select: (name) => selectNode(nameIndex.get(name)),
    groups: () => G.id.filter((_, g) => viewOf(g) !== null),
    state: () => ({ group: G.id[state.group], selected: state.selected >= 0 ? N.name[state.selected] : null,
      scale: state.scale, tx: state.tx, ty: state.ty, showPlumbing: state.showPlumbing }),
  };
  document.body.dataset.ready = "1";
})();
