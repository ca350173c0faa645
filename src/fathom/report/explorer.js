// Fathom report explorer: a small SVG line plotter over columnar data embedded once.
// Data: JSON in <script id="fathom-data">; non-finite numbers arrive as the strings
// "NaN" / "Infinity" / "-Infinity", missing values as null (drawn as gaps).
// The data behind the current plots is exposed on window.fathomPlot and
// window.fathomClassPlot so a browser test can compare it with the history.
(function () {
  "use strict";
  const D = JSON.parse(document.getElementById("fathom-data").textContent);
  const NS = "http://www.w3.org/2000/svg";
  const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf",
    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22"];
  const DASHES = ["", "6 3", "2 3", "8 3 2 3", "1 2", "10 4"];
  const nameIndex = new Map(D.names.map((n, i) => [n, i]));
  const $ = (id) => document.getElementById(id);

  function num(v) {
    if (v === null || v === undefined) return null;
    return typeof v === "string" ? Number(v) : v;
  }

  function column(run, name) {
    const i = nameIndex.get(name);
    if (i === undefined || run.cols[i] === null) return null;
    return run.cols[i].map(num);
  }

  function concrete(key, split) {
    return key.includes("{split}") ? key.replace("{split}", split) : key;
  }

  function checked(containerId) {
    return Array.from($(containerId).querySelectorAll("input:checked")).map((e) => e.value);
  }

  function fmt(v) {
    if (v === null || !isFinite(v)) return String(v);
    const a = Math.abs(v);
    return a !== 0 && (a < 1e-3 || a >= 1e5) ? v.toExponential(2) : Number(v.toPrecision(4)).toString();
  }

  function ticks(lo, hi, n) {
    if (!(hi > lo)) return [lo];
    const raw = (hi - lo) / n;
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw);
    const out = [];
    for (let t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) out.push(t);
    return out;
  }

  function el(tag, attrs, parent) {
    const e = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    if (parent) parent.appendChild(e);
    return e;
  }

  // Draw traces [{label, color, dash, x: [], y: []}] into an <svg>; a null, NaN or
  // infinite x or y (or y <= 0 on a log axis) breaks the line: a gap, never a zero.
  function draw(svg, traces, opts) {
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    const W = 760, H = 380, L = 70, R = 12, T = 12, B = 44;
    svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
    const ty = (v) => (opts.logY ? (v > 0 ? Math.log10(v) : null) : v);
    let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
    for (const tr of traces) {
      tr.x.forEach((x, i) => {
        const y = ty(tr.y[i]);
        if (x === null || y === null || !isFinite(x) || !isFinite(y)) return;
        x0 = Math.min(x0, x); x1 = Math.max(x1, x); y0 = Math.min(y0, y); y1 = Math.max(y1, y);
      });
    }
    if (!isFinite(x0)) {
      el("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "empty" }, svg)
        .textContent = "no finite values for this selection";
      return;
    }
    if (x1 === x0) { x0 -= 0.5; x1 += 0.5; }
    if (y1 === y0) { const d = Math.abs(y0) * 0.05 || 0.5; y0 -= d; y1 += d; }
    const pad = (y1 - y0) * 0.04; y0 -= pad; y1 += pad;
    const sx = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
    const sy = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
    const axes = el("g", { class: "axes" }, svg);
    for (const t of ticks(x0, x1, 8)) {
      el("line", { x1: sx(t), x2: sx(t), y1: T, y2: H - B, class: "grid" }, axes);
      el("text", { x: sx(t), y: H - B + 16, "text-anchor": "middle" }, axes).textContent = fmt(t);
    }
    for (const t of ticks(y0, y1, 6)) {
      el("line", { x1: L, x2: W - R, y1: sy(t), y2: sy(t), class: "grid" }, axes);
      el("text", { x: L - 6, y: sy(t) + 4, "text-anchor": "end" }, axes)
        .textContent = opts.logY ? "1e" + fmt(t) : fmt(t);
    }
    el("rect", { x: L, y: T, width: W - L - R, height: H - T - B, class: "frame" }, axes);
    el("text", { x: (L + W - R) / 2, y: H - 8, "text-anchor": "middle" }, axes).textContent = opts.xLabel;
    svg.points = [];
    for (const tr of traces) {
      let d = "", pen = false;
      const dots = [];
      tr.x.forEach((x, i) => {
        const y = ty(tr.y[i]);
        if (x === null || y === null || !isFinite(x) || !isFinite(y)) { pen = false; return; }
        d += (pen ? "L" : "M") + sx(x).toFixed(2) + " " + sy(y).toFixed(2);
        dots.push([sx(x), sy(y)]);
        svg.points.push({ px: sx(x), py: sy(y), label: tr.label, x: x, y: tr.y[i] });
        pen = true;
      });
      const g = el("g", { class: "trace" }, svg);
      el("path", { d: d, stroke: tr.color, "stroke-dasharray": tr.dash, fill: "none" }, g);
      for (const [cx, cy] of dots) el("circle", { cx: cx, cy: cy, r: 1.8, fill: tr.color }, g);
      el("title", {}, g).textContent = tr.label;
    }
  }

  // Show the recorded value of the point nearest the pointer (within 12 px) under a plot.
  function readout(svg, div) {
    svg.addEventListener("mousemove", (ev) => {
      const box = svg.getBoundingClientRect();
      const scale = svg.viewBox.baseVal.width / box.width;
      const mx = (ev.clientX - box.left) * scale, my = (ev.clientY - box.top) * scale;
      let best = null, dist = 12 * scale;
      for (const p of svg.points || []) {
        const d = Math.hypot(p.px - mx, p.py - my);
        if (d < dist) { dist = d; best = p; }
      }
      div.textContent = best ? `${best.label}: x = ${best.x}, y = ${best.y}` : "";
    });
  }

  function legend(div, traces) {
    div.textContent = "";
    for (const tr of traces) {
      const s = document.createElement("span");
      s.className = "key";
      s.innerHTML = `<svg width="28" height="10"><line x1="0" y1="5" x2="28" y2="5" stroke="${tr.color}" stroke-width="2" stroke-dasharray="${tr.dash}"/></svg>`;
      s.appendChild(document.createTextNode(tr.label));
      div.appendChild(s);
    }
  }

  // ---------------------------------------------------------------- main explorer
  const cohorts = [...new Set(D.runs.map((r) => r.cohort))];
  const seeds = [...new Set(D.runs.map((r) => String(r.seed)))];

  function checkboxes(containerId, values, label) {
    const c = $(containerId);
    for (const v of values) {
      const lab = document.createElement("label");
      const box = document.createElement("input");
      box.type = "checkbox"; box.value = v; box.checked = true;
      box.addEventListener("change", render);
      lab.appendChild(box);
      lab.appendChild(document.createTextNode(" " + label(v)));
      c.appendChild(lab);
    }
  }

  function fillFields() {
    const q = $("field-search").value.trim().toLowerCase();
    const sel = $("field");
    const keep = sel.value;
    sel.textContent = "";
    for (const f of D.fields) {
      if (q && !f.toLowerCase().includes(q)) continue;
      const o = document.createElement("option");
      o.value = f; o.textContent = f;
      sel.appendChild(o);
    }
    if ([...sel.options].some((o) => o.value === keep)) sel.value = keep;
    else if (sel.options.length) sel.selectedIndex = 0;
    $("field-count").textContent = `${sel.options.length} of ${D.fields.length} fields`;
  }

  function fieldInfo(key) {
    const m = D.meta[key] || {};
    const parts = [];
    if (m.formula) parts.push(`<b>formula</b> ${esc(m.formula)}`);
    if (m.units) parts.push(`<b>units</b> ${esc(m.units)}`);
    if (m.scope) parts.push(`<b>scope</b> ${esc(m.scope)}`);
    if (m.caveats) parts.push(`<b>caveats</b> ${esc(m.caveats)}`);
    if (m.source) parts.push(`<i>${esc(m.source)}</i>`);
    $("field-info").innerHTML = parts.join(" · ");
  }

  function esc(s) {
    return String(s).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]);
  }

  function render() {
    const key = $("field").value;
    const axis = $("axis").value;
    const split = $("split").value;
    const logY = $("logy").checked;
    const hasSplit = key.includes("{split}");
    $("split").disabled = !hasSplit;
    const name = concrete(key, split);
    const onCohorts = new Set(checked("cohorts"));
    const onSeeds = new Set(checked("seeds"));
    const traces = [];
    for (const run of D.runs) {
      if (!onCohorts.has(run.cohort) || !onSeeds.has(String(run.seed))) continue;
      const y = column(run, name);
      const x = axis === "epoch" ? run.epochs.slice() : column(run, axis);
      if (y === null || x === null) continue;
      traces.push({
        run: run.id, cohort: run.cohort, seed: run.seed, epochs: run.epochs, x: x, y: y,
        label: `${run.cohort} · seed ${run.seed}`,
        color: COLORS[cohorts.indexOf(run.cohort) % COLORS.length],
        dash: DASHES[seeds.indexOf(String(run.seed)) % DASHES.length],
      });
    }
    fieldInfo(key);
    $("plot-title").textContent = `${name} vs ${D.axes[axis]}` + (traces.length ? "" : " — no run records it");
    draw($("plot"), traces, { logY: logY, xLabel: D.axes[axis] });
    legend($("legend"), traces);
    window.fathomPlot = { field: name, key: key, axis: axis, split: split, logY: logY, traces: traces };
  }

  // ---------------------------------------------------------------- per-class curves
  function renderClasses() {
    const runId = $("class-run").value;
    const split = $("class-split").value;
    const run = D.runs.find((r) => r.id === runId);
    const traces = [];
    if (run) {
      for (let c = 0; c < D.classes; c++) {
        const y = column(run, `split/${split}/class_acc/${c}`);
        if (y === null) continue;
        traces.push({ run: run.id, cls: c, epochs: run.epochs, x: run.epochs.slice(), y: y,
          label: `class ${c}`, color: COLORS[c % COLORS.length], dash: DASHES[Math.floor(c / COLORS.length) % DASHES.length] });
      }
    }
    $("class-title").textContent = traces.length
      ? `per-class accuracy on ${split}, run ${runId}` : `no per-class accuracy recorded for ${split} in run ${runId}`;
    draw($("class-plot"), traces, { logY: false, xLabel: "epoch" });
    legend($("class-legend"), traces);
    window.fathomClassPlot = { run: runId, split: split, traces: traces };
  }

  // ---------------------------------------------------------------- table filters
  function wireTables() {
    for (const box of document.querySelectorAll("input.table-filter")) {
      const table = document.getElementById(box.dataset.table);
      box.addEventListener("input", () => {
        const q = box.value.trim().toLowerCase();
        for (const tr of table.tBodies[0].rows) {
          tr.style.display = !q || tr.textContent.toLowerCase().includes(q) ? "" : "none";
        }
      });
    }
    for (const th of document.querySelectorAll("table.sortable th")) {
      th.addEventListener("click", () => {
        const table = th.closest("table");
        const i = th.cellIndex;
        const dir = th.dataset.dir === "asc" ? "desc" : "asc";
        th.dataset.dir = dir;
        const rows = Array.from(table.tBodies[0].rows);
        const val = (r) => { const t = r.cells[i].textContent; const n = Number(t); return t !== "" && !isNaN(n) ? n : t; };
        rows.sort((a, b) => {
          const va = val(a), vb = val(b);
          const cmp = typeof va === "number" && typeof vb === "number" ? va - vb : String(va).localeCompare(String(vb));
          return dir === "asc" ? cmp : -cmp;
        });
        for (const r of rows) table.tBodies[0].appendChild(r);
      });
    }
  }

  // ---------------------------------------------------------------- set-up
  checkboxes("cohorts", cohorts, (v) => v);
  checkboxes("seeds", seeds, (v) => "seed " + v);
  for (const [k, v] of Object.entries(D.axes)) {
    const o = document.createElement("option"); o.value = k; o.textContent = v; $("axis").appendChild(o);
  }
  for (const s of D.splits) {
    for (const id of ["split", "class-split"]) {
      const o = document.createElement("option"); o.value = s; o.textContent = s; $(id).appendChild(o);
    }
  }
  if (D.splits.includes("val")) { $("split").value = "val"; $("class-split").value = "val"; }
  for (const run of D.runs) {
    const o = document.createElement("option"); o.value = run.id; o.textContent = `${run.id} (${run.cohort}, seed ${run.seed})`;
    $("class-run").appendChild(o);
  }
  fillFields();
  if (D.fields.includes(D.defaultField)) $("field").value = D.defaultField;
  const chosen = $("field").selectedOptions[0];
  if (chosen) chosen.scrollIntoView({ block: "nearest" });
  $("field-search").addEventListener("input", () => { fillFields(); render(); });
  for (const id of ["field", "axis", "split", "logy"]) $(id).addEventListener("change", render);
  for (const id of ["class-run", "class-split"]) $(id).addEventListener("change", renderClasses);
  wireTables();
  readout($("plot"), $("readout"));
  readout($("class-plot"), $("class-readout"));
  render();
  renderClasses();
  window.fathomReadyMs = performance.now();
  window.fathomReady = true;
})();
