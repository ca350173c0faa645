// Fathom report explorer: curves drawn with uPlot (inlined), and the mask/example explorer.
// Mask data: JSON stored gzip + base64 in <script id="fathom-masks"> (fathom.report.lazy).
// Curve data: JSON in <script id="fathom-data">. Cells: a number; null (due, missing: a
// gap); "NaN"/"Infinity"/"-Infinity" (gaps); "-" (not scheduled at that epoch: spanned,
// the line connects the recorded points). Accuracy arrives in percent.
// window.fathomPlot holds the data behind the current charts and window.fathomCharts the
// uPlot instances, so a browser test can compare them with the history.
(function () {
  "use strict";
  const D = JSON.parse(document.getElementById("fathom-data").textContent);
  let M = { tables: [], examples: {} };  // the masks: stored gzip + base64, read at start
  const nameIndex = new Map(D.names.map((n, i) => [n, i]));
  const $ = (id) => document.getElementById(id);
  const h = (tag, attrs, text) => {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  };

  // A cell as a plotted value: undefined = not scheduled, null = gap, else a finite number.
  function cellValue(v, logy) {
    if (v === "-") return undefined;
    if (v === null || typeof v === "string") return null;
    if (!isFinite(v) || (logy && v <= 0)) return null;
    return v;
  }

  function fmt(v) {
    if (v === null || v === undefined || !isFinite(v)) return "—";
    const a = Math.abs(v);
    return a !== 0 && (a < 1e-3 || a >= 1e5) ? v.toExponential(3) : Number(v.toPrecision(4)).toString();
  }

  // Times read as times: a field in seconds is a duration ("45 s", "2:05", "1:02:05"); a
  // Unix timestamp ("s since epoch") is a UTC clock time ("01:09:07", with the date when
  // the shown span crosses a day). Kind by the registry's units (D.meta), or the x axis.
  const TIME_INCRS = [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 172800, 604800];
  function timeKind(units) { return units === "s since epoch" ? "unix" : units === "s" ? "duration" : null; }
  function axisKind(axis) { return axis === "epoch" ? null : timeKind((D.meta[axis] || {}).units || "s"); }
  function fmtDuration(v) {
    if (v === null || v === undefined || !isFinite(v)) return "—";
    const sign = v < 0 ? "−" : "", a = Math.abs(v);
    if (a < 60) return `${sign}${fmt(a)} s`;
    const h = Math.floor(a / 3600), m = Math.floor((a % 3600) / 60), sec = a % 60;
    const ss = (Number.isInteger(sec) ? String(sec) : sec.toFixed(1)).padStart(Number.isInteger(sec) ? 2 : 4, "0");
    return h ? `${sign}${h}:${String(m).padStart(2, "0")}:${ss}` : `${sign}${m}:${ss}`;
  }
  function fmtClock(v, withDate) {
    if (v === null || v === undefined || !isFinite(v)) return "—";
    const iso = new Date(v * 1000).toISOString();  // UTC
    return withDate ? `${iso.slice(0, 10)} ${iso.slice(11, 19)}` : iso.slice(11, 19);
  }
  function fmtAs(kind, v) { return kind === "unix" ? fmtClock(v, true) + " UTC" : kind === "duration" ? fmtDuration(v) : fmt(v); }
  function tickFormat(kind) {
    if (kind === "duration") return (u, vals) => vals.map(fmtDuration);
    if (kind === "unix") return (u, vals) => {
      const fin = vals.filter((v) => v !== null && isFinite(v));
      const days = new Set(fin.map((v) => Math.floor(v / 86400)));
      return vals.map((v) => fmtClock(v, days.size > 1));
    };
    return (u, vals) => vals.map(fmt);
  }

  // The run's own field name: a layer facet is an aligned label (the same network layer of
  // every recipe); run.layers maps it to this run's layer name where the two differ.
  function concrete(key, split, facet, run) {
    let n = key.replace("{split}", split);
    if (facet !== null) {
      const own = run && run.layers && /\{layer\}$/.test(n) ? run.layers[facet] : undefined;
      n = n.replace(/\{(layer|class|block)\}$/, own === undefined ? facet : own);
    }
    return n;
  }

  // Per run, the (x, y) points of one field; x from the chosen axis at the same row.
  function runPoints(run, name, axis, logy) {
    const i = nameIndex.get(name);
    if (i === undefined || run.cols[i] === null) return null;
    const col = run.cols[i];
    const xs = axis === "epoch" ? run.epochs : run.cols[nameIndex.get(axis)] || null;
    if (!xs) return null;
    const pts = [];
    for (let r = 0; r < col.length; r++) {
      const x = axis === "epoch" ? xs[r] : cellValue(xs[r], false);
      if (x === null || x === undefined) continue;
      pts.push({ epoch: run.epochs[r], x: x, y: cellValue(col[r], logy) });
    }
    return pts;
  }

  // The view lives in the URL hash, "#view?field=...&split=...": a link or a reload shows
  // the same charts, zoom and mask. A plain anchor (#audit) leaves the view as it is.
  const VIEW_PREFIX = "#view?";
  const pending = location.hash.startsWith(VIEW_PREFIX) ? new URLSearchParams(location.hash.slice(VIEW_PREFIX.length)) : new URLSearchParams();
  const selectedCohorts = new Set(pending.has("cohorts")
    ? pending.get("cohorts").split("|").filter((c) => D.runs.some((r) => r.cohort === c))
    : Array.from(new Set(D.runs.filter((r) => r.phase === "main").map((r) => r.cohort))));
  let zoomX = pending.has("x") ? pending.get("x").split("~").map(Number) : null;  // null: not zoomed
  let viewReady = false, building = false;
  // The section a nav link went to (kept in the view as "at"); a plain anchor (#audit) too.
  let section = pending.get("at") || (location.hash.length > 1 && !location.hash.startsWith(VIEW_PREFIX) ? decodeURIComponent(location.hash.slice(1)) : null);

  function saveView() {
    if (!viewReady) return;
    const q = new URLSearchParams();
    q.set("field", $("field").value); q.set("split", $("split").value); q.set("axis", $("axis").value);
    q.set("band", $("band").value);
    for (const id of ["logy", "seeds", "zero-y"]) if ($(id).checked) q.set(id, "1");
    q.set("cohorts", Array.from(selectedCohorts).join("|"));
    if (zoomX) q.set("x", `${zoomX[0]}~${zoomX[1]}`);
    for (const id of ["mask-arm", "mask-seed", "mask-checkpoint"]) if ($(id).value) q.set(id, $(id).value);
    if (maskState.mask !== null) q.set("mask", maskState.mask);
    if (maskState.example !== null) q.set("example", String(maskState.example));
    if (section) q.set("at", section);
    history.replaceState(null, "", VIEW_PREFIX + q.toString());
  }
  const shownFacets = {};
  let syncing = false;

  function cohortsList() {
    const seen = new Map();
    for (const r of D.runs) if (!seen.has(r.cohort)) seen.set(r.cohort, r);
    return Array.from(seen.values()).sort((a, b) =>
      (a.phase === "main" ? 0 : 1) - (b.phase === "main" ? 0 : 1) || a.cohort.localeCompare(b.cohort));
  }

  // Per cohort and epoch: mean, SD, min, max over the seeds holding a finite value; the
  // x position is the mean of their x (the epoch itself on the epoch axis).
  function aggregate(perRun) {
    const byEpoch = new Map();
    let scheduled = new Set();
    for (const pts of perRun) for (const p of pts) {
      if (p.y !== undefined) scheduled.add(p.epoch);
      if (!byEpoch.has(p.epoch)) byEpoch.set(p.epoch, []);
      byEpoch.get(p.epoch).push(p);
    }
    const out = [];
    for (const e of Array.from(byEpoch.keys()).sort((a, b) => a - b)) {
      const ps = byEpoch.get(e);
      const ys = ps.filter((p) => p.y !== null && p.y !== undefined).map((p) => p.y);
      const x = ps.reduce((s, p) => s + p.x, 0) / ps.length;
      if (!scheduled.has(e)) { out.push({ epoch: e, x: x, mean: undefined }); continue; }
      if (!ys.length) { out.push({ epoch: e, x: x, mean: null, lo: null, hi: null, sd: null, n: 0 }); continue; }
      const mean = ys.reduce((s, y) => s + y, 0) / ys.length;
      const sd = ys.length > 1 ? Math.sqrt(ys.reduce((s, y) => s + (y - mean) ** 2, 0) / (ys.length - 1)) : null;
      out.push({ epoch: e, x: x, mean: mean, sd: sd, lo: Math.min(...ys), hi: Math.max(...ys), n: ys.length });
    }
    return out;
  }

  // A history row that a run lacks but another run of its phase (main or tuning: one
  // schedule) has, inside the run's own epoch range, was due and is missing: a gap
  // (null), not a span.
  function markMissingRows(perRun) {
    for (const [r, pts] of perRun) {
      const all = new Set(D.runs.filter((x) => x.phase === r.phase).flatMap((x) => x.epochs));
      const own = new Set(r.epochs);
      const lo = Math.min(...r.epochs), hi = Math.max(...r.epochs);
      for (const e of all) if (!own.has(e) && e > lo && e < hi) pts.push({ epoch: e, x: e, y: null });
      pts.sort((a, b) => a.x - b.x);
    }
  }

  function buildChart(field, facet, opts) {
    const series = [];  // {label, colour, kind, cohort, run, pts: [{x, y}]}
    for (const c of cohortsList()) {
      if (!selectedCohorts.has(c.cohort)) continue;
      const runs = D.runs.filter((r) => r.cohort === c.cohort);
      const perRun = runs.map((r) => [r, runPoints(r, concrete(field, opts.split, facet, r), opts.axis, opts.logy)]).filter((p) => p[1]);
      if (opts.axis === "epoch") markMissingRows(perRun);
      if (!perRun.length) continue;
      const colour = D.colours[c.recipe] || "#444";
      const agg = aggregate(perRun.map((p) => p[1]));
      const band = opts.band;
      const lo = agg.map((a) => ({ x: a.x, y: a.mean === undefined ? undefined : band === "sd" ? (a.sd === null ? a.mean : a.mean - a.sd) : a.lo }));
      const hi = agg.map((a) => ({ x: a.x, y: a.mean === undefined ? undefined : band === "sd" ? (a.sd === null ? a.mean : a.mean + a.sd) : a.hi }));
      const n = perRun.length;
      series.push({ label: `${c.cohort} mean (n=${n})`, colour: colour, kind: "mean", cohort: c.cohort, pts: agg.map((a) => ({ x: a.x, y: a.mean })), agg: new Map(agg.map((a) => [a.x, a])) });
      if (band !== "none" && n > 1) {
        series.push({ label: `${c.cohort} ${band === "sd" ? "mean+SD" : "max"}`, colour: colour, kind: "hi", cohort: c.cohort, pts: hi });
        series.push({ label: `${c.cohort} ${band === "sd" ? "mean−SD" : "min"}`, colour: colour, kind: "lo", cohort: c.cohort, pts: lo });
      }
      if (opts.seeds || n === 1) {
        for (const [r, pts] of perRun) {
          if (n === 1) continue;  // the mean of one seed is that seed
          series.push({ label: `${r.id}`, colour: colour, kind: "seed", cohort: c.cohort, run: r.id, pts: pts.map((p) => ({ x: p.x, y: p.y })) });
        }
      }
    }
    // A stated reference level of this field and split (a language model's unigram
    // baseline), drawn flat across the plotted x range, dashed grey.
    const xs = Array.from(new Set(series.flatMap((s) => s.pts.map((p) => p.x)))).sort((a, b) => a - b);
    for (const b of facet === null && xs.length ? D.baselines || [] : []) {
      if (b.field !== field || b.split !== opts.split) continue;
      const y = opts.logy && !(b.value > 0) ? null : b.value;
      series.push({ label: b.label, colour: "#777777", kind: "baseline", pts: xs.map((x) => ({ x: x, y: y })), value: b.value });
    }
    return series;
  }

  // One x array for the chart (the union of the series' x); a series lacking an x gets
  // undefined there, which uPlot spans.
  function toAligned(series) {
    const xs = Array.from(new Set(series.flatMap((s) => s.pts.map((p) => p.x)))).sort((a, b) => a - b);
    const pos = new Map(xs.map((x, i) => [x, i]));
    const data = [xs];
    for (const s of series) {
      const ys = new Array(xs.length).fill(undefined);
      for (const p of s.pts) ys[pos.get(p.x)] = p.y;
      data.push(ys);
    }
    return data;
  }

  function axisLabel(field) {
    const m = D.meta[field] || {};
    const base = field.replace("{split}", $("split").value).replace(/\/\{(layer|class)\}$/, "");
    return timeKind(m.units) === "unix" ? `${base} (UTC clock time)` : m.units ? `${base} (${m.units})` : base;
  }

  function charts() {
    const field = $("field").value;
    const meta = D.meta[field] || {};
    const opts = { axis: $("axis").value, split: $("split").value, logy: $("logy").checked, band: $("band").value, seeds: $("seeds").checked, zeroY: $("zero-y").checked };
    const facets = meta.facets && meta.facets.length ? meta.facets : [null];
    const yKind = timeKind(meta.units);
    if (!shownFacets[field]) shownFacets[field] = new Set(facets);
    renderFacetBoxes(field, meta, facets);
    const box = $("charts");
    (window.fathomCharts || []).forEach((u) => u.destroy());
    box.innerHTML = "";
    box.className = facets.length === 1 || facets[0] === null ? "single" : "";
    window.fathomCharts = [];
    building = true;  // a zoom survives a new field, split or recipe choice
    window.fathomPlot = { field: field, split: opts.split, axis: opts.axis, logy: opts.logy, band: opts.band, zeroY: opts.zeroY, charts: [] };
    $("charts-title").textContent = axisLabel(field) + (facets[0] === null ? "" : `: one chart per ${meta.facetKind}`);
    const width = facets[0] === null ? Math.min(box.clientWidth || 1100, 1200) : 400;
    for (const facet of facets) {
      if (facet !== null && !shownFacets[field].has(facet)) continue;
      const series = buildChart(field, facet, opts);
      const wrap = h("div", { class: "chart", "data-facet": facet === null ? "" : facet });
      if (facet !== null) wrap.appendChild(h("h4", {}, `${meta.facetKind} ${facet}`));
      box.appendChild(wrap);
      window.fathomPlot.charts.push({ facet: facet, series: series.map((s) => ({ label: s.label, kind: s.kind, cohort: s.cohort, run: s.run || null, x: s.pts.map((p) => p.x), y: s.pts.map((p) => p.y === undefined ? "not scheduled" : p.y) })) });
      if (!series.length) { wrap.appendChild(h("p", { class: "note" }, "no selected run records this field")); continue; }
      const bands = [];
      series.forEach((s, i) => { if (s.kind === "hi") bands.push({ series: [i + 1, i + 2], fill: s.colour + "33" }); });
      const u = new uPlot({
        width: width, height: facet === null ? 360 : 240,
        scales: { x: { time: false }, y: opts.logy ? { distr: 3, log: 10 } : { range: (u, lo, hi) => visibleRange(u, lo, hi, opts) } },
        axes: [
          Object.assign({ label: D.axes[opts.axis], labelSize: 20, size: 36 }, opts.axis === "epoch" ? { incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500] } : { incrs: TIME_INCRS, values: tickFormat(axisKind(opts.axis)) }),
          Object.assign({ label: facet === null ? axisLabel(field) : (yKind === "unix" ? "UTC" : meta.units || "value"), labelSize: 20, size: yKind ? 78 : 64, values: tickFormat(yKind) }, yKind && !opts.logy ? { incrs: TIME_INCRS } : {}),
        ],
        legend: { show: false },
        cursor: { sync: { key: "fathom" }, drag: { x: true, y: false } },
        bands: bands,
        series: [{ label: D.axes[opts.axis] }].concat(series.map((s) => ({
          label: s.label, stroke: s.kind === "lo" || s.kind === "hi" ? s.colour + "66" : s.colour,
          width: s.kind === "mean" ? 2 : 1, dash: s.kind === "seed" ? [4, 3] : s.kind === "baseline" ? [9, 5] : undefined,
          points: { show: s.kind === "mean" || s.kind === "seed", size: s.kind === "mean" ? 5 : 3 },
          spanGaps: false,
        }))),
        hooks: {
          setCursor: [(u) => readout(u, series)],
          setScale: [(u, key) => { if (key === "x" && !building) { noteZoom(u); syncX(u); saveView(); } }],
        },
      }, toAligned(series), wrap);
      u.fathomSeries = series;
      window.fathomCharts.push(u);
    }
    $("field-info").textContent = [meta.formula, meta.units && `units: ${meta.units}`, meta.scope && `scope: ${meta.scope}`, meta.caveats].filter(Boolean).join(" · ");
    building = false;
    if (zoomX && window.fathomCharts.length) window.fathomCharts[0].setScale("x", { min: zoomX[0], max: zoomX[1] });
    saveView();
  }

  // The y range of the points inside the visible x window (every plotted series, bands
  // included), padded by 5%; on the epoch axis epoch 0 (before training) is left out of the
  // autoscale unless "y range includes epoch 0" is ticked, so curves that differ by a few
  // percent are not flattened by the initial accuracy. uPlot's own range when none is visible.
  // uPlot re-ranges y whenever x changes; series[0].idxs is the new visible x window then
  // (u.scales.x still holds the old one while ranges are computed).
  function visibleRange(u, lo, hi, opts) {
    const xs = u.data[0];
    const idxs = u.series[0] && u.series[0].idxs;
    const i0 = idxs && idxs[0] != null ? idxs[0] : 0, i1 = idxs && idxs[1] != null ? idxs[1] : xs.length - 1;
    let a = Infinity, b = -Infinity;
    for (let k = 1; k < u.data.length; k++) for (let i = i0; i <= i1; i++) {
      const v = u.data[k][i];
      if (v === null || v === undefined || !isFinite(v)) continue;
      if (opts.axis === "epoch" && xs[i] === 0 && !opts.zeroY && i1 > i0) continue;
      if (v < a) a = v; if (v > b) b = v;
    }
    if (!(a <= b)) return [lo, hi];
    const pad = (b - a) * 0.05 || Math.abs(a) * 0.05 || 1;
    return [a - pad, b + pad];
  }

  // The zoom the reader chose (kept across re-renders and in the URL); the full x extent
  // (a double-click reset) is no zoom.
  function noteZoom(u) {
    const xs = u.data[0]; const { min, max } = u.scales.x;
    zoomX = !xs.length || (min <= xs[0] && max >= xs[xs.length - 1]) ? null : [min, max];
  }

  function syncX(src) {
    if (syncing) return;
    syncing = true;
    const { min, max } = src.scales.x;
    for (const u of window.fathomCharts) if (u !== src) u.setScale("x", { min: min, max: max });
    syncing = false;
  }

  // The hover readout: per recipe the seed mean ± sample SD and the min–max over seeds
  // (n stated), per shown seed its value, all with the field's unit.
  function readout(u, series) {
    const i = u.cursor.idx;
    if (i === null || i === undefined) return;
    const meta = D.meta[$("field").value] || {};
    const kind = timeKind(meta.units);
    const unit = meta.units && !kind ? ` ${meta.units}` : "";
    const val = (v) => fmtAs(kind, v), span = (v) => (kind ? fmtDuration(v) : fmt(v));
    const x = u.data[0][i];
    const parts = [`${D.axes[$("axis").value] || "x"} = ${fmtAs(axisKind($("axis").value), x)}`];
    series.forEach((s, k) => {
      if (s.kind === "mean") {
        const a = s.agg.get(x);
        if (!a || a.mean === undefined) return;
        if (a.mean === null) { parts.push(`${s.cohort}: — (no finite value)`); return; }
        const sd = a.sd === null ? "" : ` ± ${span(a.sd)} SD`;
        const range = a.n > 1 ? `, range ${val(a.lo)}–${val(a.hi)}` : "";
        parts.push(`${s.cohort}: ${val(a.mean)}${sd}${unit} (n=${a.n}${range})`);
      } else if (s.kind === "seed") {
        const v = u.data[k + 1][i];
        if (v !== undefined) parts.push(`${s.label}: ${val(v)}${unit}`);
      } else if (s.kind === "baseline") {
        parts.push(`${s.label}: ${val(s.value)}${unit}`);
      }
    });
    $("readout").textContent = parts.join("   ");
  }

  function renderFacetBoxes(field, meta, facets) {
    const box = $("facets");
    box.innerHTML = "";
    $("facet-box").style.display = facets[0] === null ? "none" : "";
    $("facet-legend").textContent = ({class: "classes", block: "residual blocks"}[meta.facetKind] || "layers") + " (small multiples)";
    if (facets[0] === null) return;
    for (const f of facets) {
      const lab = h("label"); const cb = h("input", { type: "checkbox", value: f, "data-facet": f });
      cb.checked = shownFacets[field].has(f);
      cb.addEventListener("change", () => { cb.checked ? shownFacets[field].add(f) : shownFacets[field].delete(f); charts(); });
      lab.append(cb, ` ${f}`); box.appendChild(lab);
    }
  }

  function renderCohorts() {
    const box = $("cohorts");
    for (const c of cohortsList()) {
      const lab = h("label"); const cb = h("input", { type: "checkbox", value: c.cohort, "data-cohort": c.cohort });
      cb.checked = selectedCohorts.has(c.cohort);
      cb.addEventListener("change", () => { cb.checked ? selectedCohorts.add(c.cohort) : selectedCohorts.delete(c.cohort); charts(); });
      const sw = h("span", { class: "swatch" }); sw.style.background = D.colours[c.recipe] || "#444";
      lab.append(cb, sw, c.cohort); box.appendChild(lab);
    }
  }

  function fillFields() {
    const q = $("field-search").value.toLowerCase();
    const sel = $("field"); const cur = sel.value || D.defaultField;
    sel.innerHTML = "";
    const shown = D.fields.filter((f) => f.toLowerCase().includes(q));
    for (const f of shown) { const o = h("option", { value: f }, f); if (f === cur) o.selected = true; sel.appendChild(o); }
    if (!sel.value && shown.length) sel.value = shown[0];
    $("field-count").textContent = `${shown.length} of ${D.fields.length} fields`;
  }

  // ---- masks and examples --------------------------------------------------------------
  function drawImage(canvas, b64) {
    const bytes = atob(b64); const n = Math.round(Math.sqrt(bytes.length));
    canvas.width = n; canvas.height = n;
    const ctx = canvas.getContext("2d"); const img = ctx.createImageData(n, n);
    for (let i = 0; i < n * n; i++) { const v = 255 - bytes.charCodeAt(i); img.data.set([v, v, v, 255], 4 * i); }
    ctx.putImageData(img, 0, 0);
  }

  const maskState = { key: null, mask: pending.get("mask"), example: pending.has("example") ? Number(pending.get("example")) : null };

  function maskTable() {
    const t = M.tables.find((x) => x.key === maskState.key);
    const area = $("mask-area"); area.innerHTML = "";
    if (!t) return;
    const table = h("table", { id: "mask-table", class: "headline" });
    table.appendChild(h("caption", {}, `Every mask of ${t.run} (${t.arm}, seed ${t.seed}), ${t.checkpoint} checkpoint, epoch ${t.epoch}: click a mask for its examples`));
    const head = ["mask (1 = kept)", "kept", "MAC fraction", "test acc (%)", "test CE (nats)", "damage ΔCE (nats)", "val acc (%)"];
    const tr = h("tr"); head.forEach((x) => tr.appendChild(h("th", {}, x))); table.appendChild(h("thead")).appendChild(tr);
    const tb = h("tbody"); table.appendChild(tb);
    for (const m of t.masks.slice().sort((a, b) => b.kept - a.kept || a.test_damage - b.test_damage)) {
      const row = h("tr", { "data-mask": m.mask, tabindex: "0", role: "button", "aria-label": `mask ${m.mask}: show its examples` });
      [m.mask, m.kept, fmt(m.macs_fraction), m.test_acc.toFixed(2), fmt(m.test_ce), (m.test_damage >= 0 ? "+" : "") + m.test_damage.toFixed(4), m.val_acc.toFixed(2)].forEach((v, i) => row.appendChild(h("td", { class: i ? "num" : "" }, String(v))));
      if (m.mask === maskState.mask) row.className = "sel";
      activate(row, () => { maskState.mask = m.mask; maskTable(); examples(); $("mask-table").querySelector(`tr[data-mask="${m.mask}"]`).focus(); saveView(); });
      tb.appendChild(row);
    }
    area.appendChild(table);
  }

  // Click, Enter or Space: the same action (keyboard users reach every mask and example).
  function activate(el, act) {
    el.addEventListener("click", act);
    el.addEventListener("keydown", (ev) => { if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); act(); } });
  }

  function argmax(a) { let k = 0; for (let i = 1; i < a.length; i++) if (a[i] > a[k]) k = i; return k; }
  function margin(z, y) { let o = -Infinity; z.forEach((v, c) => { if (c !== y && v > o) o = v; }); return z[y] - o; }

  function examples() {
    const E = M.examples; const per = E.per && E.per[maskState.key];
    const box = $("examples"); box.innerHTML = ""; $("example-detail").innerHTML = "";
    if (!per) { $("examples-head").textContent = `No examples kept for this run and checkpoint (${E.note}).`; return; }
    const mi = per.masks.indexOf(maskState.mask);
    $("examples-head").textContent = `${E.indices.length} test examples under mask ${maskState.mask} (green border: correct under this mask). ${E.note}. Click one for its logits and the masks that keep it correct.`;
    E.indices.forEach((idx, j) => {
      const z = per.logits[mi][j]; const pred = argmax(z); const ok = pred === E.labels[j];
      const d = h("div", { class: `ex ${ok ? "right" : "wrong"}`, "data-example": String(idx), tabindex: "0", role: "button", "aria-label": `test example ${idx}, label ${E.labels[j]}, predicted ${pred}: show its logits` });
      if (E.images[j]) { const c = h("canvas"); drawImage(c, E.images[j]); d.appendChild(c); }
      d.appendChild(h("div", {}, `#${idx} y=${E.labels[j]} ŷ=${pred}`));
      if (idx === maskState.example) d.classList.add("sel");
      activate(d, () => { maskState.example = idx; examples(); $("examples").querySelector(`[data-example="${idx}"]`).focus(); saveView(); });
      box.appendChild(d);
    });
    if (maskState.example !== null && E.indices.includes(maskState.example)) detail(per, mi, E.indices.indexOf(maskState.example));
  }

  function detail(per, mi, j) {
    const E = M.examples; const z = per.logits[mi][j]; const y = E.labels[j];
    const box = $("example-detail"); box.innerHTML = "";
    const left = h("div"); if (E.images[j]) { const c = h("canvas"); drawImage(c, E.images[j]); left.appendChild(c); }
    const right = h("div", { id: "example-info" });
    right.appendChild(h("div", {}, `test example #${E.indices[j]}: label ${y}, predicted ${argmax(z)} under mask ${per.masks[mi]}, margin ${fmt(margin(z, y))} (logit of the label minus the largest other logit)`));
    const lt = h("table", { id: "logit-table" }); const lo = Math.min(...z), hi = Math.max(...z);
    z.forEach((v, c) => { const r = h("tr", { "data-class": String(c) }); r.appendChild(h("td", {}, `class ${c}${c === y ? " (label)" : ""}`)); r.appendChild(h("td", { class: "num" }, v.toFixed(3))); const b = h("td"); const bar = h("span", { class: "bar" }); bar.style.width = `${(100 * (v - lo)) / (hi - lo || 1)}px`; b.appendChild(bar); r.appendChild(b); lt.appendChild(r); });
    right.appendChild(lt);
    const keep = per.masks.filter((m, k) => argmax(per.logits[k][j]) === y);
    right.appendChild(h("div", {}, `correct under ${keep.length} of ${per.masks.length} masks:`));
    const chips = h("div", { id: "mask-chips" });
    per.masks.forEach((m, k) => chips.appendChild(h("span", { class: `chip ${argmax(per.logits[k][j]) === y ? "right" : "wrong"}` }, m)));
    right.appendChild(chips);
    box.append(left, right);
  }

  // Three selectors (arm, seed, checkpoint) pick one audited (run, checkpoint); every
  // audited seed of every arm has its masks, and its examples where the page kept them.
  function maskExplorer() {
    if (!M.tables || !M.tables.length) { $("mask-controls").style.display = "none"; $("mask-area").textContent = "No audit in this directory."; return; }
    const uniq = (xs) => Array.from(new Set(xs));
    const fill = (id, values, label) => {
      const sel = $(id); const cur = pending.has(id) ? pending.get(id) : sel.value; pending.delete(id); sel.innerHTML = "";
      for (const v of values) sel.appendChild(h("option", { value: String(v) }, label(v)));
      if (values.map(String).includes(cur)) sel.value = cur;
    };
    const pick = () => {
      const arm = $("mask-arm").value;
      const ofArm = M.tables.filter((t) => t.arm === arm);
      fill("mask-seed", uniq(ofArm.map((t) => t.seed)), (s) => `seed ${s}`);
      const ofSeed = ofArm.filter((t) => String(t.seed) === $("mask-seed").value);
      fill("mask-checkpoint", uniq(ofSeed.map((t) => t.checkpoint)), (c) => `${c}${M.examples.per && M.examples.per[ofSeed.find((t) => t.checkpoint === c).key] ? " · examples" : ""}`);
      const t = ofSeed.find((x) => x.checkpoint === $("mask-checkpoint").value) || ofSeed[0];
      if (t.key !== maskState.key) {
        maskState.key = t.key;
        if (!t.masks.some((m) => m.mask === maskState.mask)) maskState.mask = t.masks.reduce((a, b) => (b.kept > a.kept ? b : a)).mask;
      }
      maskTable(); examples(); saveView();
    };
    fill("mask-arm", uniq(M.tables.map((t) => t.arm)), (a) => a);
    for (const id of ["mask-arm", "mask-seed", "mask-checkpoint"]) $(id).addEventListener("change", pick);
    pick();
  }

  // ---- static tables: sorting, filters, the scroll cue of wide tables, lazy sections ------
  function wireTables(root) {
    for (const t of root.querySelectorAll("table.sortable")) {
      t.querySelectorAll("th").forEach((th, i) => th.addEventListener("click", () => {
        const rows = Array.from(t.tBodies[0].rows); const dir = th.dataset.dir === "1" ? -1 : 1; th.dataset.dir = dir === 1 ? "1" : "-1";
        rows.sort((a, b) => { const x = a.cells[i].textContent, y = b.cells[i].textContent; const nx = parseFloat(x), ny = parseFloat(y); return dir * (isNaN(nx) || isNaN(ny) ? x.localeCompare(y) : nx - ny); });
        rows.forEach((r) => t.tBodies[0].appendChild(r));
      }));
    }
    for (const f of root.querySelectorAll("input.table-filter")) f.addEventListener("input", () => {
      const q = f.value.toLowerCase();
      for (const r of $(f.dataset.table).tBodies[0].rows) r.style.display = r.textContent.toLowerCase().includes(q) ? "" : "none";
    });
  }

  // A table wider than its box scrolls inside it (CSS); here it gets a wrapper whose right
  // (left) edge fades while more columns lie to the right (left), and a line above it that
  // says so. Tables not laid out yet (in a closed section) are marked when it opens.
  function edges(wrap, t) {
    wrap.classList.toggle("more-right", t.scrollLeft + t.clientWidth < t.scrollWidth - 1);
    wrap.classList.toggle("more-left", t.scrollLeft > 1);
  }
  function markWide(root) {
    for (const t of root.querySelectorAll("table")) {
      if (!t.clientWidth) continue;
      const wide = t.scrollWidth > t.clientWidth + 1;
      let wrap = t.parentElement.classList.contains("scroll-wrap") ? t.parentElement : null;
      if (wide && !wrap) {
        wrap = h("div", { class: "scroll-wrap" }); t.before(wrap); wrap.appendChild(t);
        wrap.before(h("div", { class: "scroll-cue", "aria-hidden": "true" }, "⇆ wider than the page: scroll the table sideways for more columns"));
        t.addEventListener("scroll", () => edges(wrap, t), { passive: true });
      }
      if (wrap) { wrap.classList.toggle("wide", wide); wrap.previousElementSibling.style.display = wide ? "" : "none"; edges(wrap, t); }
    }
  }

  // A large collapsed section is stored gzip + base64 (fathom.report.lazy) and inserted the
  // first time it opens; window.fathomLazy counts the sections loaded.
  window.fathomLazy = 0;
  async function gunzip(b64) {
    const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
    return new Response(new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"))).text();
  }
  async function openLazy(d) {
    const s = d.querySelector(":scope > script[type='application/x-fathom-lazy']");
    if (!s) { markWide(d); return; }
    const body = h("div", { class: "lazy-body" });
    if (typeof DecompressionStream === "undefined") {
      body.textContent = "This browser cannot decompress this section (DecompressionStream: Chromium 80+, Firefox 113+, Safari 16.4+); the same data are in the study's JSON files.";
      s.replaceWith(body); return;
    }
    const stored = s.textContent;
    s.remove();
    body.innerHTML = await gunzip(stored); d.appendChild(body);
    wireTables(body); markWide(body);
    for (const inner of body.querySelectorAll("details")) inner.addEventListener("toggle", () => { if (inner.open) markWide(inner); });
    d.dataset.loaded = "1"; window.fathomLazy += 1;
  }

  // ---- wiring ----------------------------------------------------------------------------
  // The page starts after its first frame: the static first screen (the main table and the
  // verdicts) paints before the curves are drawn; a hidden tab (no frames) starts by a timer.
  if (section) history.scrollRestoration = "manual";
  let started = false;
  const begin = () => { if (!started) { started = true; start(); } };
  requestAnimationFrame(() => setTimeout(begin, 0));
  setTimeout(begin, 500);

  function start() {
    for (const [k, label] of Object.entries(D.axes)) if (k === "epoch" || nameIndex.has(k)) $("axis").appendChild(h("option", { value: k }, label));
    for (const s of D.splits) $("split").appendChild(h("option", { value: s }, s));
    if (D.splits.includes("val")) $("split").value = "val";
    for (const id of ["split", "axis", "band"]) if (pending.has(id) && Array.from($(id).options).some((o) => o.value === pending.get(id))) $(id).value = pending.get(id);
    for (const id of ["logy", "seeds", "zero-y"]) if (pending.has(id)) $(id).checked = true;
    renderCohorts(); fillFields();
    if (pending.has("field") && D.fields.includes(pending.get("field"))) $("field").value = pending.get("field");
    $("field-search").addEventListener("input", () => { fillFields(); charts(); });
    for (const id of ["field", "axis", "split", "logy", "band", "seeds", "zero-y"]) $(id).addEventListener("change", charts);
    charts();
    wireTables(document); markWide(document);
    // Nav links scroll to their section without touching the URL's view ("#view?..."); the
    // section is kept in the view as "at", so a reload or a shared link lands there too.
    for (const a of document.querySelectorAll("nav a[href^='#']")) a.addEventListener("click", (ev) => {
      const target = $(a.getAttribute("href").slice(1));
      if (!target) return;
      ev.preventDefault(); section = target.id; target.scrollIntoView(); saveView();
    });
    if (section && $(section)) {  // land on the view's section, not on a restored offset
      $(section).scrollIntoView();
      if (document.readyState !== "complete") window.addEventListener("load", () => $(section).scrollIntoView());
    }
    for (const d of document.querySelectorAll("details")) d.addEventListener("toggle", () => { if (d.open) { if (d.hasAttribute("data-lazy")) openLazy(d); else markWide(d); } });
    window.addEventListener("resize", () => markWide(document));
    (async () => {  // the curves are drawn; the masks decode off the first paint
      const stored = $("fathom-masks");
      if (typeof DecompressionStream === "undefined") $("mask-area").textContent = "This browser cannot decompress the mask data (DecompressionStream: Chromium 80+, Firefox 113+, Safari 16.4+); the same numbers are in audit/audit.json.";
      else if (stored.textContent) M = JSON.parse(await gunzip(stored.textContent));
      window.fathomMasks = M;
      maskExplorer(); viewReady = true; saveView();
      window.fathomReadyMs = performance.now();
      window.fathomReady = true;
    })();
  }
})();
