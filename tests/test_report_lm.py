"""The language model in ``report.html``: a tiny ``gpt`` trained on a synthetic corpus,
audited and given a Monte-Carlo curvature snapshot, then reported. Every number of the
Language model section is read back from the page and compared with the run's own records
(history, audit.json, curvature summary) within the printed rounding; the curvature table
says the estimator the records name; the activation table names the model's nonlinearity;
the page opens in headless Chromium without an error, its explorer on nats per token."""

from __future__ import annotations

import json
import math
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest

from fathom.audit.checkpoint import AuditSettings
from fathom.audit.run import audit_runs
from fathom.config import validate_run_config
from fathom.curvature.rundir import Estimating, run_curvature
from fathom.report import build_report
from fathom.report.curvtables import trace_table
from fathom.report.lazy import expanded
from fathom.report.lm import lm_html
from fathom.report.runs import RunData, load_runs
from fathom.report.telemetry_tables import nonlinearity
from fathom.rundir import RunDir
from fathom.train.loop import train

TEXT = (
    "Call me Ishmael. Some years ago, never mind how long precisely, having little or no "
    "money in my purse, I thought I would sail about a little and see the watery part.\n"
) * 14


def lm_config(corpus: Path):
    return validate_run_config(
        {
            "name": "lm",
            "study": "test",
            "seed": 1,
            "device": "cpu",
            "data": {"dataset": "text", "path": str(corpus), "context": 16},
            "model": {"kind": "gpt", "layers": 3, "width": 16, "heads": 2, "layerdrop": 0.2},
            "optim": {
                "name": "adamw",
                "lr": 1e-2,
                "batch_size": 8,
                "epochs": 2,
                "schedule": {"kind": "warmup_cosine", "warmup_epochs": 0.5, "final": 0.1},
            },
            "eval": {"every": 1, "batch_size": 16},
            "execution": {"path": "eager", "precision": "fp32"},
            "telemetry": {"probe_size": 6, "first": [0, 2], "every": 5},
        }
    )


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    """A study directory: one trained gpt run, its audit, an MC curvature snapshot of its
    last epoch, and the report."""
    import torch

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("lm") / "study"
    root.mkdir()
    corpus = root.parent / "corpus.txt"
    corpus.write_text(TEXT, encoding="utf-8")
    train(lm_config(corpus), root / "run", telemetry=True)
    audit_runs(root, AuditSettings(router=False, checkpoints=("final",)), root / "audit")
    run_curvature(
        RunDir(root / "run"),
        epochs=[2],
        probe=4,
        estimator=Estimating(name="mc", samples=2, seed=5),
    )
    build_report(root, with_figures=False)
    return root


class _Tables(HTMLParser):
    """``{table id: [[cell text, ...], ...]}`` of a page (body rows only) and its ``<li>``s
    by their list's id."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self.lists: dict[str, list[str]] = {}
        self._table: str | None = None
        self._list: str | None = None
        self._cell: list[str] | None = None
        self._body = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table":
            self._table = a.get("id") or ""
            self.tables[self._table] = []
        elif tag == "tbody":
            self._body = True
        elif tag == "tr" and self._body and self._table is not None:
            self.tables[self._table].append([])
        elif tag in ("td",) and self._body:
            self._cell = []
        elif tag == "ul" and a.get("id"):
            self._list = a["id"]
            self.lists[self._list] = []
        elif tag == "li" and self._list:
            self._cell = []

    def handle_endtag(self, tag):
        if tag == "table":
            self._table, self._body = None, False
        elif tag == "td" and self._cell is not None and self._table is not None:
            self.tables[self._table][-1].append("".join(self._cell))
            self._cell = None
        elif tag == "li" and self._cell is not None and self._list:
            self.lists[self._list].append("".join(self._cell))
            self._cell = None
        elif tag == "ul":
            self._list = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def parsed(root: Path) -> _Tables:
    p = _Tables()
    p.feed(expanded((root / "report" / "report.html").read_text()))
    return p


def close(cell: str, want: float, *, decimals: int | None = None, sig: int = 4) -> bool:
    """The printed ``cell`` is ``want`` rounded to ``decimals`` places (or ``sig``
    significant digits), judged by its own rounding error, not by reformatting ``want``."""
    got = float(cell.rstrip("×").replace("+", ""))
    if decimals is not None:
        return abs(got - want) <= 0.5 * 10**-decimals + 1e-12
    return abs(got - want) <= 0.5 * 10 ** (math.floor(math.log10(abs(want))) - sig + 1) + 1e-12


def history(root: Path) -> list[dict]:
    return [json.loads(x) for x in (root / "run" / "history.jsonl").read_text().splitlines()]


def test_the_curves_table_equals_the_history(study):
    rows = parsed(study).tables["lm-curves-run"]
    hist = [r for r in history(study) if r.get("val/ce") is not None]
    assert [int(r[0]) for r in rows] == [h["epoch"] for h in hist]
    for cells, h in zip(rows, hist, strict=True):
        for j, split in enumerate(("fit", "val", "test")):
            assert close(cells[1 + 2 * j], h[f"{split}/ce"], decimals=4)
            assert close(cells[2 + 2 * j], h[f"{split}/ppl"])
            assert math.isclose(h[f"{split}/ppl"], math.exp(h[f"{split}/ce"]), rel_tol=1e-9)


def test_the_baseline_line_states_the_run_and_the_unigram(study):
    page = expanded((study / "report" / "report.html").read_text())
    info = json.loads((study / "run" / "manifest.json").read_text())["data"]["info"]
    last = [r for r in history(study) if r.get("val/ce") is not None][-1]
    line = page.split("<p class='lm-baseline'>")[1].split("</p>")[0]
    assert f"Epoch {last['epoch']}: validation {last['val/ce']:.4f} nats/token" in line
    assert f"unigram baseline {info['unigram_val_ce']:.4f} nats/token" in line
    assert "id='language-model'" in page and "href='#language-model'" in page
    assert "data: text, context 16 tokens" in page and "model: gpt, 3 blocks of width 16" in page


def test_the_audit_section_equals_audit_json(study):
    audit = json.loads((study / "audit" / "audit.json").read_text())
    rec = audit["runs"][0]["checkpoints"]["final"]
    page = parsed(study)
    assert page.lists["lm-sentences-run-final"] == rec["sentences"]
    assert len(rec["sentences"]) >= 1
    by_mask = {m["mask"]: m for m in rec["masks"]}
    greedy = page.tables["lm-greedy-run-final"]
    assert len(greedy) == len(rec["greedy"]) == rec["k"]
    for cells, step in zip(greedy, rec["greedy"], strict=True):
        m = by_mask[step["mask"]]
        assert [int(cells[0]), int(cells[1]), cells[2]] == [
            step["step"], step["removed"], step["mask"]
        ]  # fmt: skip
        assert close(cells[3], m["test"]["ce"], decimals=4)
        assert close(cells[4], m["test"]["ppl"])
        assert close(cells[5], step["test_damage"], decimals=4)
        assert close(cells[6], m["flops_fraction"], sig=3)
        assert cells[7] == step["verdict"]["verdict"]
    masks = page.tables["lm-masks-run-final"]
    assert sorted(r[0] for r in masks) == sorted(by_mask) and len(masks) == 2 ** rec["k"]
    for cells in masks:
        m = by_mask[cells[0]]
        assert int(cells[1]) == m["kept"] == cells[0].count("1")
        assert close(cells[2], m["val"]["ce"], decimals=4)
        assert close(cells[3], m["val"]["ppl"])
        assert close(cells[4], m["test"]["ce"], decimals=4)
        assert close(cells[5], m["test"]["ppl"])
        assert close(cells[6], m["test"]["damage"], decimals=4)
        assert close(cells[7], m["flops_per_token"], sig=6)
        assert close(cells[8], m["flops_fraction"], sig=3)
    full = next(c for c in masks if "0" not in c[0])
    assert float(full[8].rstrip("×")) == 1.0  # the full network is its own FLOPs


def test_the_curvature_table_reads_the_language_models_rows_and_estimator(study):
    summary = json.loads((study / "run" / "curvature" / "summary.json").read_text())
    (row,) = summary["rows"]
    assert (row["estimator"], row["samples"], row["seed"]) == ("mc", 2, 5)
    (cells,) = parsed(study).tables["x-curvature_traces"]
    assert "—" not in cells[3:]  # every column filled from the language model's row
    assert close(cells[3], row["ggn_trace"])
    assert close(cells[4], row["ggn_trace_se"])
    assert "mc, 2 samples/window, seed 5" in cells
    page = expanded((study / "report" / "report.html").read_text())
    note = page.split('data-table="curvature_traces"')[1].split('<p class="note">')[1]
    assert note.startswith("GGN estimator per row as recorded (mc, 2 samples/window, seed 5)")
    assert "Exact weight diagonals" not in page


def _curv(rows: list[dict]) -> dict:
    return {"run": {"summary": {"rows": rows}, "epochs": {}}}


def test_an_exact_language_model_snapshot_is_labelled_exact(study):
    runs = load_runs(study)
    rows = [{"epoch": 2, "estimator": "exact", "ggn_trace": 2.0, "ggn_trace_se": None,
             "empirical_fisher_trace": 1.0, "probe_ce_mean": 3.0, "probe_ppl": math.exp(3.0),
             "samples": None, "seed": None}]  # fmt: skip
    t = trace_table(runs, None, _curv(rows))
    assert t.note.startswith("Every trace exact")
    assert "ggn_trace_se" not in [c.key for c in t.columns]
    assert t.rows[0]["estimator"] == "exact" and t.rows[0]["ggn_trace"] == 2.0
    classifier = [{"epoch": 1, "ggn_weight_trace": 4.0, "probe_accuracy": 0.5}]
    t = trace_table(runs, None, _curv(classifier))
    assert [c.key for c in t.columns][3] == "ggn_weight_trace" and t.rows[0][
        "ggn_weight_trace"
    ] == 4.0
    assert "estimator" not in [c.key for c in t.columns] and t.note.startswith("Every trace exact")


def _run(model: dict) -> RunData:
    return RunData(Path("r"), "r", {"config": {"model": model}}, [])


def test_the_activation_table_names_the_models_nonlinearity():
    assert nonlinearity([_run({"kind": "gpt", "layers": 2, "width": 16, "heads": 2})]) == "GELU"
    assert nonlinearity([_run({"kind": "ciresan"})]) == "ReLU"
    assert nonlinearity([_run({})]) == "ReLU"  # an older config without a kind: the MLP
    staged = {"kind": "staged_conv", "depth": 4}
    assert nonlinearity([_run({**staged, "neuron": "relu"})]) == "ReLU"
    assert nonlinearity([_run({**staged, "neuron": "lif", "timesteps": 4})]) == (
        "spiking LIF (T=4)"
    )
    both = [_run({"kind": "ciresan"}), _run({"kind": "gpt", "layers": 2, "width": 16})]
    assert nonlinearity(both) == "ReLU / GELU"


def test_a_depth_scaling_verdict_is_shown_with_its_lines(study, tmp_path):
    root = tmp_path / "bench"
    shutil.copytree(study / "run", root / "run")
    verdict = {"level": "lvl-word", "trend": "trend-word", "lines": ["line one", "line two"]}
    (root / "table.json").write_text(
        json.dumps({"kind": "lm_depth_scaling", "metric": "test nats/token", "verdict": verdict})
    )
    html = lm_html(load_runs(root), None, root)
    assert "<b>Level:</b> lvl-word" in html and "<b>Scaling:</b> trend-word" in html
    assert "<li>line one</li><li>line two</li>" in html
    (root / "table.json").write_text(json.dumps({"kind": "other"}))
    assert "Depth scaling" not in lm_html(load_runs(root), None, root)


def test_the_explorer_lists_one_chart_per_block_of_the_block_fields(study):
    """The per-block fields are listed as the per-layer ones are, faceted by block (model
    order), each facet's values the history's own."""
    from fathom.report.html import explorer_payload

    runs = load_runs(study)
    payload = explorer_payload(runs)
    hist = history(study)
    for prefix in ("probe/block/update_rel", "grad/block/mean_norm"):
        meta = payload["meta"][f"{prefix}/{{block}}"]
        assert meta["facetKind"] == "block" and meta["family"] in ("activations", "gradients")
        assert meta["facets"] == ["blocks.0", "blocks.1", "blocks.2"]
        assert "||" in meta["formula"]
        for block in meta["facets"]:
            recorded = [r[f"{prefix}/{block}"] for r in hist if f"{prefix}/{block}" in r]
            assert recorded and all(v > 0 for v in recorded)


class _Images(HTMLParser):
    """``{figure id: img src}`` of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.images: dict[str, str] = {}
        self._figure: str | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "figure":
            self._figure = a.get("id")
        elif tag == "img" and self._figure:
            self.images[self._figure] = a["src"]


def test_the_figures_are_embedded_as_the_same_pngs(study, tmp_path):
    """With figures, the Language model section holds both PNGs as data-URI images (in
    collapsed sections), each decoding to a valid PNG byte-identical to the file beside
    summary.md; the page links nothing outside itself."""
    import base64
    import io

    import matplotlib.image as mpimg

    out = build_report(study, tmp_path / "rep", with_figures=True)
    page = out.html.read_text()
    section = expanded(page).split("<h2 id='language-model'>", 1)[1]
    p = _Images()
    p.feed(section)
    assert set(p.images) == {"lm-figure-lm_curves", "lm-figure-lm_removal"}
    for stem in ("lm_curves", "lm_removal"):
        src = p.images[f"lm-figure-{stem}"]
        head, data = src.split(",", 1)
        assert head == "data:image/png;base64"
        png = base64.b64decode(data, validate=True)
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        assert png == (tmp_path / "rep" / "figures" / f"{stem}.png").read_bytes()
        pixels = mpimg.imread(io.BytesIO(png), format="png")
        assert pixels.ndim == 3 and min(pixels.shape[:2]) > 50
    assert "src='http" not in expanded(page) and 'src="http' not in expanded(page)
    # without figures the page embeds none (the study fixture's report)
    assert "data:image/png" not in expanded((study / "report" / "report.html").read_text())


def test_the_page_opens_in_chromium_on_nats_per_token(study):
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="install the browser extra: pip install -e '.[browser]'"
    )
    from test_report_browser import SNAPSHOT, launch

    url = (study / "report" / "report.html").resolve().as_uri()
    errors: list[str] = []
    outside: list[str] = []
    with sync_api.sync_playwright() as p:
        browser = launch(p)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("request", lambda r: outside.append(r.url) if r.url != url else None)
            page.goto(url)
            page.wait_for_function("() => window.fathomReady === true")
            assert page.locator("#language-model").is_visible()
            plot = json.loads(page.evaluate(SNAPSHOT, "fathomPlot"))
            assert plot["field"] == "{split}/ce"
            hist = {r["epoch"]: r for r in history(study)}
            (series,) = [s for s in plot["charts"][0]["series"] if s["kind"] == "mean"]
            split = plot["split"]
            assert series["x"] and all(
                y == hist[int(x)][f"{split}/ce"] for x, y in zip(series["x"], series["y"])
            )
            # the unigram baseline, flat and dashed across the plotted epochs, on val
            info = json.loads((study / "run" / "manifest.json").read_text())["data"]["info"]
            assert split == "val"
            (base,) = [s for s in plot["charts"][0]["series"] if s["kind"] == "baseline"]
            assert base["x"] == series["x"] and set(base["y"]) == {info["unigram_val_ce"]}
            page.select_option("#field", "{split}/ppl")
            plot = json.loads(page.evaluate(SNAPSHOT, "fathomPlot"))
            (base,) = [s for s in plot["charts"][0]["series"] if s["kind"] == "baseline"]
            assert set(base["y"]) == {info["unigram_val_ppl"]}
            page.select_option("#split", "test")  # no baseline stated for test
            plot = json.loads(page.evaluate(SNAPSHOT, "fathomPlot"))
            assert not [s for s in plot["charts"][0]["series"] if s["kind"] == "baseline"]
        finally:
            browser.close()
    assert not errors and not outside
