"""The explorer's HTML page: one self-contained file (inline CSS and JS, no network).

``PAGE`` holds the template; :func:`attnlab.viz.explorer.explorer_html` replaces
``__ATTNLAB_DATA__`` with the JSON payload (maps as base64 float32, tokens, head labels).

DOM hooks the browser test relies on: ``#layer``, ``#head`` (``all`` or a head index),
``#view-tokens`` / ``#view-matrix``, ``#compare``; every token is a ``g.tok`` with
``data-panel`` (map index), ``data-side`` (``q`` or ``k``), ``data-index`` and, while a
token is selected, ``data-weight`` (the highlighted weight); every matrix canvas is
``canvas.matrix`` with ``data-panel``. ``window.attnlab`` exposes the decoded state.
"""

PAGE = r"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>attnlab explorer</title>
<style>
  :root { --fg:#1d2433; --muted:#667085; --line:#d0d5dd; --accent:#1d4ed8; --bad:#b00020; --bg:#f8fafc; }
  * { box-sizing: border-box; }
  body { margin:0; font:14px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif; color:var(--fg); background:var(--bg); }
  header { padding:12px 20px; background:#fff; border-bottom:1px solid var(--line); }
  header h1 { font-size:17px; margin:0 0 2px 0; }
  header .sub { color:var(--muted); font-size:13px; }
  .controls { display:flex; flex-wrap:wrap; gap:14px; align-items:center; padding:10px 20px; background:#fff; border-bottom:1px solid var(--line); }
  .controls label { color:var(--muted); font-size:13px; }
  select, button { font:inherit; padding:4px 8px; border:1px solid var(--line); border-radius:6px; background:#fff; }
  button.on { background:var(--accent); color:#fff; border-color:var(--accent); }
  .seg button { border-radius:0; margin-left:-1px; }
  .seg button:first-child { border-radius:6px 0 0 6px; }
  .seg button:last-child { border-radius:0 6px 6px 0; }
  main { display:flex; gap:18px; padding:16px 20px; align-items:flex-start; flex-wrap:wrap; }
  .panels { display:flex; gap:18px; flex-wrap:wrap; align-items:flex-start; }
  .panel { background:#fff; border:1px solid var(--line); border-radius:10px; padding:10px 12px; }
  .panel h2 { font-size:14px; margin:0 0 6px 0; }
  .panel h2 small { color:var(--muted); font-weight:normal; }
  svg text { font-size:13px; font-family:ui-monospace,SFMono-Regular,Menlo,monospace; cursor:pointer; user-select:none; }
  .tok rect.bg { fill:#1d4ed8; }
  .tok.sel text { font-weight:bold; fill:#b45309; }
  .side { width:330px; }
  #readout { font-family:ui-monospace,monospace; font-size:12.5px; white-space:pre; max-height:260px; overflow:auto; }
  table { border-collapse:collapse; font-size:12.5px; width:100%; }
  th, td { padding:3px 6px; text-align:right; border-bottom:1px solid #eef0f3; }
  th:nth-child(2), td:nth-child(2) { text-align:left; }
  tr.cur { background:#e0e7ff; }
  tr.abn td { color:var(--bad); }
  tbody tr { cursor:pointer; }
  .hint { color:var(--muted); font-size:12px; margin-top:6px; }
  canvas.matrix { image-rendering:pixelated; display:block; cursor:crosshair; }
  #tip { position:fixed; pointer-events:none; background:#111827; color:#fff; padding:3px 7px; border-radius:5px; font-size:12px; display:none; z-index:9; }
  .legend { display:flex; align-items:center; gap:6px; font-size:11px; color:var(--muted); margin-top:4px; }
  .legend canvas { border:1px solid var(--line); }
</style>
</head>
<body>
<header><h1 id="title">attnlab explorer</h1><div class="sub" id="subtitle"></div></header>
<div class="controls">
  <span><label for="layer">layer</label> <select id="layer"></select></span>
  <span><label for="head">head</label> <select id="head"></select></span>
  <span class="seg"><button id="view-tokens" class="on">tokens</button><button id="view-matrix">matrix</button></span>
  <span id="compare-box" style="display:none"><label><input type="checkbox" id="compare"> side by side: <span id="compare-names"></span></label></span>
  <span class="hint">hover a token to preview, click to pin; left column = queries (what it attends to), right = keys (what attends to it)</span>
</div>
<main>
  <div class="panels" id="panels"></div>
  <div class="side">
    <div class="panel"><h2>Selection</h2><div id="readout">nothing selected</div></div>
    <div class="panel" style="margin-top:14px"><h2>Heads of this layer <small id="stats-for"></small></h2>
      <table id="stats"><thead><tr><th>head</th><th>pattern</th><th>score</th><th>entropy</th><th>dist</th><th>sink</th></tr></thead><tbody></tbody></table>
      <div class="hint">red = abnormal: most attention on separators or the first token. Click a row to view the head.</div>
    </div>
  </div>
</main>
<div id="tip"></div>
<script type="application/json" id="attnlab-data">__ATTNLAB_DATA__</script>
<script>
"use strict";
(function () {
  const DATA = JSON.parse(document.getElementById("attnlab-data").textContent);
  const SVGNS = "http://www.w3.org/2000/svg";
  const YLGNBU = ["#ffffd9","#edf8b1","#c7e9b4","#7fcdbb","#41b6c4","#1d91c0","#225ea8","#253494","#081d58"];
  const RDBU = ["#2166ac","#4393c3","#92c5de","#d1e5f0","#f7f7f7","#fddbc7","#f4a582","#d6604d","#b2182b"];

  function decode(b64) {
    const bin = atob(b64);
    const bytes = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    return new Float32Array(bytes.buffer);
  }
  const maps = DATA.maps.map(m => Object.assign({}, m, { w: decode(m.data) }));
  const A = maps[0];
  const L = A.layers, H = A.heads, N = A.n, M = A.m;
  const qTok = DATA.tokens, kTok = DATA.key_tokens || DATA.tokens;
  const state = { layer: DATA.initial_layer || 0, head: DATA.initial_head === undefined ? 0 : DATA.initial_head,
                  view: "tokens", compare: false, sel: null, pinned: null };

  function hexRgb(h) { return [1, 3, 5].map(i => parseInt(h.slice(i, i + 2), 16)); }
  const YL = YLGNBU.map(hexRgb), RB = RDBU.map(hexRgb);
  function ramp(stops, t) {
    t = Math.min(1, Math.max(0, t)) * (stops.length - 1);
    const i = Math.min(stops.length - 2, Math.floor(t)), f = t - i;
    return stops[i].map((c, k) => Math.round(c + (stops[i + 1][k] - c) * f));
  }
  function headColor(h) { return "hsl(" + Math.round(360 * h / H) + ",70%,45%)"; }

  // weight of (query i, key j) in map p, current layer, head h (or the mean over heads for "all")
  function weight(p, i, j, head) {
    const mp = maps[p], l = state.layer;
    head = head === undefined ? state.head : head;
    if (head === "all") {
      let s = 0;
      for (let h = 0; h < H; h++) s += mp.w[((l * H + h) * N + i) * M + j];
      return s / H;
    }
    return mp.w[((l * H + head) * N + i) * M + j];
  }
  function shown() { return state.compare && maps.length > 1 ? [0, 1] : [0]; }

  // ---- controls ------------------------------------------------------------------
  const layerSel = document.getElementById("layer"), headSel = document.getElementById("head");
  for (let l = 0; l < L; l++) layerSel.add(new Option("layer " + l, String(l)));
  function fillHeads() {
    const cur = String(state.head);
    headSel.innerHTML = "";
    headSel.add(new Option("all heads (overlaid)", "all"));
    const st = (DATA.stats || [])[state.layer] || [];
    for (let h = 0; h < H; h++) {
      const s = st[h];
      const txt = "head " + h + (s ? " \u2014 " + s.label + " " + s.score.toFixed(2) + (s.abnormal ? " \u26a0" : "") : "");
      headSel.add(new Option(txt, String(h)));
    }
    headSel.value = cur;
  }
  layerSel.value = String(state.layer);
  layerSel.addEventListener("change", () => { state.layer = +layerSel.value; fillHeads(); render(); });
  headSel.addEventListener("change", () => { state.head = headSel.value === "all" ? "all" : +headSel.value; render(); });
  const vt = document.getElementById("view-tokens"), vm = document.getElementById("view-matrix");
  vt.addEventListener("click", () => { state.view = "tokens"; render(); });
  vm.addEventListener("click", () => { state.view = "matrix"; render(); });
  const cmp = document.getElementById("compare");
  if (maps.length > 1) {
    document.getElementById("compare-box").style.display = "";
    document.getElementById("compare-names").textContent = maps[0].name + " | " + maps[1].name;
    state.compare = !!DATA.compare_on;
    cmp.checked = state.compare;
    cmp.addEventListener("change", () => { state.compare = cmp.checked; render(); });
  }
  document.getElementById("title").textContent = DATA.title || "attnlab explorer";
  document.getElementById("subtitle").textContent = DATA.subtitle || "";

  // ---- selection -------------------------------------------------------------------
  function select(sel, pin) {
    if (pin) state.pinned = (state.pinned && sel && state.pinned.side === sel.side && state.pinned.index === sel.index) ? null : sel;
    state.sel = sel || state.pinned;
    highlight();
  }

  // ---- tokens view -------------------------------------------------------------------
  const ROW = 22, XQ = 150, XK = 380, W = 530;
  function tokenPanel(p) {
    const rows = Math.max(N, M), svg = document.createElementNS(SVGNS, "svg");
    svg.setAttribute("width", W); svg.setAttribute("height", rows * ROW + 10);
    const lines = document.createElementNS(SVGNS, "g"); lines.setAttribute("class", "lines"); svg.appendChild(lines);
    function tok(side, i, text) {
      const g = document.createElementNS(SVGNS, "g");
      g.setAttribute("class", "tok"); g.setAttribute("data-panel", p); g.setAttribute("data-side", side); g.setAttribute("data-index", i);
      const y = 5 + i * ROW;
      const bg = document.createElementNS(SVGNS, "rect");
      bg.setAttribute("class", "bg"); bg.setAttribute("y", y); bg.setAttribute("height", ROW - 3); bg.setAttribute("rx", 3);
      bg.setAttribute("x", side === "q" ? 0 : XK); bg.setAttribute("width", side === "q" ? XQ : W - XK);
      bg.setAttribute("fill-opacity", 0);
      const t = document.createElementNS(SVGNS, "text");
      t.setAttribute("x", side === "q" ? XQ - 8 : XK + 8); t.setAttribute("y", y + ROW / 2 + 2);
      t.setAttribute("text-anchor", side === "q" ? "end" : "start"); t.setAttribute("dominant-baseline", "middle");
      t.textContent = text;
      const title = document.createElementNS(SVGNS, "title"); title.textContent = (side === "q" ? "query " : "key ") + i + ": " + text;
      g.appendChild(bg); g.appendChild(t); g.appendChild(title);
      g.addEventListener("mouseenter", () => { if (!state.pinned) select({ side, index: i }, false); });
      g.addEventListener("mouseleave", () => { if (!state.pinned) select(null, false); });
      g.addEventListener("click", () => select({ side, index: i }, true));
      svg.appendChild(g);
    }
    for (let i = 0; i < N; i++) tok("q", i, qTok[i]);
    for (let j = 0; j < M; j++) tok("k", j, kTok[j]);
    return svg;
  }
  function drawLines(p, svg) {
    const g = svg.querySelector("g.lines");
    while (g.firstChild) g.removeChild(g.firstChild);
    const sel = state.sel, heads = state.head === "all" ? [...Array(H).keys()] : [state.head];
    const thr = heads.length > 1 ? 0.05 : 0.01;
    for (const h of heads) {
      for (let i = 0; i < N; i++) {
        if (sel && sel.side === "q" && sel.index !== i) continue;
        for (let j = 0; j < M; j++) {
          if (sel && sel.side === "k" && sel.index !== j) continue;
          const w = weight(p, i, j, h);
          if (w < thr) continue;
          const ln = document.createElementNS(SVGNS, "line");
          ln.setAttribute("x1", XQ); ln.setAttribute("y1", 5 + i * ROW + ROW / 2 - 1);
          ln.setAttribute("x2", XK); ln.setAttribute("y2", 5 + j * ROW + ROW / 2 - 1);
          ln.setAttribute("stroke", heads.length > 1 ? headColor(h) : "#1d4ed8");
          ln.setAttribute("stroke-width", sel ? 1 + 3 * w : 1 + 2 * w);
          ln.setAttribute("stroke-opacity", Math.min(1, (sel ? 0.15 + 0.85 * w : 0.6 * w)));
          g.appendChild(ln);
        }
      }
    }
  }

  // ---- matrix view ------------------------------------------------------------------
  const CELL = Math.max(3, Math.min(26, Math.floor(560 / Math.max(N, M))));
  const LONGEST = Math.min(14, Math.max(...qTok.concat(kTok).map(t => t.length)));
  const LABW = CELL >= 8 ? Math.round(LONGEST * 0.62 * Math.min(12, CELL - 1)) + 10 : 0;
  function matrixPanel(p) {
    const c = document.createElement("canvas");
    c.className = "matrix"; c.setAttribute("data-panel", p);
    c.width = LABW + M * CELL; c.height = LABW + N * CELL;
    c.addEventListener("mousemove", ev => {
      const r = c.getBoundingClientRect();
      const j = Math.floor((ev.clientX - r.left - LABW) / CELL), i = Math.floor((ev.clientY - r.top - LABW) / CELL);
      const tip = document.getElementById("tip");
      if (i < 0 || j < 0 || i >= N || j >= M) { tip.style.display = "none"; return; }
      tip.textContent = qTok[i] + " \u2192 " + kTok[j] + ": " + cellValue(p, i, j).toFixed(4);
      tip.style.left = ev.clientX + 12 + "px"; tip.style.top = ev.clientY + 12 + "px"; tip.style.display = "block";
    });
    c.addEventListener("mouseleave", () => { document.getElementById("tip").style.display = "none"; });
    c.addEventListener("click", ev => {
      const r = c.getBoundingClientRect();
      const j = Math.floor((ev.clientX - r.left - LABW) / CELL), i = Math.floor((ev.clientY - r.top - LABW) / CELL);
      if (i >= 0 && i < N && j < 0) select({ side: "q", index: i }, true);
      else if (j >= 0 && j < M && i < 0) select({ side: "k", index: j }, true);
      else if (i >= 0 && i < N && j >= 0 && j < M) select({ side: "q", index: i }, true);
    });
    return c;
  }
  function cellValue(p, i, j) { return p === "diff" ? weight(0, i, j) - weight(1, i, j) : weight(p, i, j); }
  function drawMatrix(c, p) {
    const ctx = c.getContext("2d");
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, c.width, c.height);
    let hi = 1e-12;
    for (let i = 0; i < N; i++) for (let j = 0; j < M; j++) hi = Math.max(hi, Math.abs(cellValue(p, i, j)));
    const img = ctx.createImageData(M * CELL, N * CELL);
    for (let i = 0; i < N; i++) for (let j = 0; j < M; j++) {
      const v = cellValue(p, i, j);
      const rgb = p === "diff" ? ramp(RB, 0.5 + 0.5 * v / hi) : ramp(YL, v / hi);
      for (let y = 0; y < CELL; y++) for (let x = 0; x < CELL; x++) {
        const o = ((i * CELL + y) * M * CELL + j * CELL + x) * 4;
        img.data[o] = rgb[0]; img.data[o + 1] = rgb[1]; img.data[o + 2] = rgb[2]; img.data[o + 3] = 255;
      }
    }
    ctx.putImageData(img, LABW, LABW);
    const sel = state.sel;
    if (sel) {
      ctx.strokeStyle = "#f97316"; ctx.lineWidth = 2;
      if (sel.side === "q") ctx.strokeRect(LABW + 1, LABW + sel.index * CELL + 1, M * CELL - 2, CELL - 2);
      else ctx.strokeRect(LABW + sel.index * CELL + 1, LABW + 1, CELL - 2, N * CELL - 2);
    }
    if (LABW) {
      ctx.fillStyle = "#1d2433"; ctx.font = Math.min(12, CELL - 1) + "px ui-monospace,monospace";
      ctx.textAlign = "right"; ctx.textBaseline = "middle";
      for (let i = 0; i < N; i++) ctx.fillText(qTok[i].slice(0, 14), LABW - 4, LABW + i * CELL + CELL / 2);
      for (let j = 0; j < M; j++) {
        ctx.save(); ctx.translate(LABW + j * CELL + CELL / 2, LABW - 4); ctx.rotate(-Math.PI / 2);
        ctx.textAlign = "left"; ctx.fillText(kTok[j].slice(0, 14), 0, 0); ctx.restore();
      }
    }
    c.setAttribute("data-max", hi.toPrecision(6));
  }

  // ---- render ------------------------------------------------------------------------
  const panelsEl = document.getElementById("panels");
  let built = null;
  function render() {
    vt.classList.toggle("on", state.view === "tokens"); vm.classList.toggle("on", state.view === "matrix");
    panelsEl.innerHTML = "";
    built = [];
    const list = shown().slice();
    if (state.view === "matrix" && list.length > 1) list.push("diff");
    for (const p of list) {
      const div = document.createElement("div"); div.className = "panel";
      const h2 = document.createElement("h2");
      const name = p === "diff" ? maps[0].name + " \u2212 " + maps[1].name : maps[p].name;
      h2.textContent = name + " ";
      const sm = document.createElement("small");
      sm.textContent = "layer " + state.layer + ", " + (state.head === "all" ? (state.view === "matrix" ? "mean of all heads" : "all heads") : "head " + state.head);
      h2.appendChild(sm); div.appendChild(h2);
      if (state.view === "tokens" && p !== "diff") {
        if (state.head === "all") {
          const lg = document.createElement("div"); lg.className = "legend";
          for (let h = 0; h < H; h++) {
            const sw = document.createElement("span"); sw.textContent = "\u25a0 " + h; sw.style.color = headColor(h); lg.appendChild(sw);
          }
          div.appendChild(lg);
        }
        const svg = tokenPanel(p); div.appendChild(svg); built.push({ p, svg });
      } else {
        const c = matrixPanel(p); div.appendChild(c); built.push({ p, canvas: c });
        const lg = document.createElement("div"); lg.className = "legend";
        const bar = document.createElement("canvas"); bar.width = 120; bar.height = 10;
        const bctx = bar.getContext("2d");
        for (let x = 0; x < 120; x++) { const c2 = p === "diff" ? ramp(RB, x / 119) : ramp(YL, x / 119); bctx.fillStyle = "rgb(" + c2 + ")"; bctx.fillRect(x, 0, 1, 10); }
        const lo = document.createElement("span"), hi = document.createElement("span");
        lg.appendChild(lo); lg.appendChild(bar); lg.appendChild(hi); div.appendChild(lg);
        built[built.length - 1].legend = [lo, hi];
      }
      panelsEl.appendChild(div);
    }
    statsTable();
    highlight();
  }

  function highlight() {
    const sel = state.sel;
    for (const b of built) {
      if (b.svg) {
        drawLines(b.p, b.svg);
        b.svg.querySelectorAll("g.tok").forEach(g => {
          const side = g.getAttribute("data-side"), idx = +g.getAttribute("data-index");
          const bg = g.querySelector("rect.bg");
          g.classList.toggle("sel", !!sel && sel.side === side && sel.index === idx);
          if (sel && side !== sel.side) {
            const w = side === "k" ? weight(b.p, sel.index, idx) : weight(b.p, idx, sel.index);
            g.setAttribute("data-weight", String(w));
            bg.setAttribute("fill-opacity", Math.min(0.85, w));
            g.querySelector("title").textContent = (side === "q" ? "query " : "key ") + idx + ": " + g.querySelector("text").textContent + " \u2014 " + w.toFixed(4);
          } else {
            g.removeAttribute("data-weight");
            bg.setAttribute("fill-opacity", 0);
          }
        });
      } else {
        drawMatrix(b.canvas, b.p);
        const hi = +b.canvas.getAttribute("data-max");
        b.legend[0].textContent = b.p === "diff" ? (-hi).toFixed(3) : "0";
        b.legend[1].textContent = (b.p === "diff" ? "+" : "") + hi.toFixed(3);
      }
    }
    readout();
  }

  function readout() {
    const el = document.getElementById("readout"), sel = state.sel;
    if (!sel) { el.textContent = "nothing selected \u2014 hover or click a token"; return; }
    const lines = [];
    const who = sel.side === "q" ? qTok[sel.index] : kTok[sel.index];
    lines.push(sel.side === "q" ? "query " + sel.index + " '" + who + "' attends to:" : "key " + sel.index + " '" + who + "' is attended by:");
    const others = sel.side === "q" ? kTok : qTok;
    const rows = others.map((t, o) => {
      const vals = shown().map(p => sel.side === "q" ? weight(p, sel.index, o) : weight(p, o, sel.index));
      return { t, o, vals };
    }).sort((a, b) => b.vals[0] - a.vals[0]).slice(0, 15);
    if (shown().length > 1) lines.push("  " + "".padEnd(16) + maps[0].name.slice(0, 8).padStart(9) + maps[1].name.slice(0, 8).padStart(9));
    for (const r of rows) lines.push("  " + (r.o + " " + r.t).slice(0, 16).padEnd(16) + r.vals.map(v => v.toFixed(4).padStart(9)).join(""));
    el.textContent = lines.join("\n");
  }

  function statsTable() {
    const body = document.querySelector("#stats tbody");
    body.innerHTML = "";
    document.getElementById("stats-for").textContent = "(layer " + state.layer + ", " + maps[0].name + ")";
    const st = (DATA.stats || [])[state.layer] || [];
    st.forEach((s, h) => {
      const tr = document.createElement("tr");
      if (s.abnormal) tr.classList.add("abn");
      if (state.head === h) tr.classList.add("cur");
      for (const v of [h, s.label + (s.abnormal ? " \u26a0" : ""), s.score.toFixed(2), s.entropy.toFixed(2), s.mean_distance.toFixed(1), s.sink_mass.toFixed(2)]) {
        const td = document.createElement("td"); td.textContent = v; tr.appendChild(td);
      }
      tr.addEventListener("click", () => { state.head = h; headSel.value = String(h); render(); });
      body.appendChild(tr);
    });
  }

  fillHeads();
  headSel.value = String(state.head);
  render();
  window.attnlab = { state, weight, maps: maps.map(m => ({ name: m.name, layers: m.layers, heads: m.heads, n: m.n, m: m.m })), render, select };
})();
</script>
</body>
</html>
"""
