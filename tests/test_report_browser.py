"""report.html in headless Chromium: no console error, no request leaves the file, the first
screen shows the verdicts and the main table, recipe and layer toggles and zoom change the
charts, an example opens under a mask, and plotted values equal the history's values.

Needs the ``browser`` extra (Playwright's Python package) and Debian's ``chromium`` at
/usr/bin/chromium (no browser download); CI installs both. Without them the test is
skipped with the reason printed.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path
from urllib.parse import parse_qs

import pytest

from fathom.base.io import read_jsonl
from fathom.report import build_report
from fathom.report.lazy import stored_json
from synthetic_runs import (
    layer_names,
    synthetic_history,
    telemetry_names,
    write_run,
    write_study,
)

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
# The plotted data as JSON text, non-finite numbers spelled out (JSON has none).
SNAPSHOT = """(which) => JSON.stringify(window[which], (k, v) =>
    typeof v === 'number' && !isFinite(v) ? String(v) : v)"""


def launch(p):
    if not Path(CHROMIUM).exists():
        pytest.skip(
            f"no Chromium at {CHROMIUM}: install Debian's `chromium` (apt-get install chromium)"
        )
    return p.chromium.launch(executable_path=CHROMIUM, args=ARGS)


@pytest.fixture(scope="module")
def browser():
    """One headless Chromium for the module's tests (each page opens in a context of its own)."""
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="install the browser extra: pip install -e '.[browser]'"
    )
    with sync_api.sync_playwright() as p:
        b = launch(p)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from synthetic_audit import write_audit, write_summary

    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("browser") / "study"
    write_study(
        root, recipes=("residual", "sd_constant"), seeds=(101, 102), awkward=True, layer_lists=True
    )
    shutil.rmtree(root / "awkward-s7")  # the summary compares the two recipes only
    write_summary(root, "residual")
    _decide_final_checkpoint(root)
    write_audit(root, ["residual-s101", "residual-s102", "sd_constant-s101", "sd_constant-s102"])
    write_study(root, recipes=(), awkward=True)  # the awkward run again, for the curves
    # A plain recipe (layers named blocks.N.res, residual's blocks.N.res.branch): its
    # head-layer ‖mean g‖ is 0.10x / 0.11x residual's in every epoch.
    for seed, factor in ((101, 0.10), (102, 0.11)):
        res = _history(root, f"residual-s{seed}")
        rows = synthetic_history(
            seed + 7, (0, 1, 2, 3, 4), telemetry=telemetry_names(6, plain=True)
        )
        for r in rows:
            r[NORM] = factor * res[r["epoch"]][NORM]
        write_run(root / f"plain-s{seed}", study=root.name, recipe="plain", seed=seed, lr=0.01,
                  rows=rows, layers=layer_names(6, plain=True))  # fmt: skip
    # residual-s101 records the head-layer moments only at epochs 0 and 4 (not scheduled
    # between): the chart must connect them, not show gaps.
    hist = root / "residual-s101" / "history.jsonl"
    rows = [json.loads(line) for line in hist.read_text().splitlines()]
    for r in rows:
        if r["epoch"] not in (0, 4):
            del r["grad/pex/diversity/head"]
    hist.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root, build_report(root, with_figures=False).html


def _decide_final_checkpoint(root: Path) -> None:
    """The summary of the same runs with sd_constant's final test scores set to residual's
    + 5 pp accuracy and the same CE in every seed: two decided verdicts at the final
    checkpoint (better, equivalent), the selected checkpoint as measured (undecided)."""
    import dataclasses

    from fathom.base.io import atomic_write_json
    from fathom.rundir import find_runs
    from fathom.stats import summarise_study
    from fathom.study.records import run_record

    records = []
    for rd in find_runs(root):
        c = rd.manifest["config"]
        records.append(run_record(rd, c["model"]["recipe"], c["seed"], c["optim"]["lr"]))
    ref = {r.seed: r for r in records if r.recipe == "residual"}

    def shifted(r):
        if r.recipe != "sd_constant":
            return r
        b = ref[r.seed].final
        final = dict(r.final, test_acc=b["test_acc"] + 0.05, test_ce=b["test_ce"])
        return dataclasses.replace(r, final=final)

    summary = json.loads((root / "summary.json").read_text())
    records = [shifted(r) for r in records]
    summary["stats"] = summarise_study(records, reference="residual", target_val_acc=0.5)
    atomic_write_json(root / "summary.json", summary)


NORM = "grad/mean/weight_norm/head"
ALIGNED = [
    "stem",
    *(f"{a} / {b}" for a, b in zip(layer_names(6)[1:-1], layer_names(6, plain=True)[1:-1])),
    "head",
]


def _history(root: Path, run_id: str) -> dict[int, dict]:
    rows, _ = read_jsonl(root / run_id / "history.jsonl")
    return {r["epoch"]: r for r in rows if isinstance(r.get("epoch"), int)}


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-12)


def test_report_in_chromium(report: tuple[Path, Path], browser) -> None:
    root, html = report
    url = html.resolve().as_uri()
    errors: list[str] = []
    outside: list[str] = []
    try:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("request", lambda r: outside.append(r.url) if r.url != url else None)
        page.goto(url)
        page.wait_for_function("() => window.fathomReady === true")

        # First screen: verdict sentences and the main table, above the fold.
        verdicts = page.locator("#verdicts li")
        assert verdicts.count() >= 1 and "sd_constant vs residual" in verdicts.first.inner_text()
        for sel in ("#verdicts", "#main-table"):
            box = page.locator(sel).bounding_box()
            assert box is not None and box["y"] < 900, f"{sel} is not on the first screen"
        assert page.locator("#main-table tbody tr").count() == 2

        def plot() -> dict:
            return json.loads(page.evaluate(SNAPSHOT, "fathomPlot"))

        start = plot()
        assert start["field"] == "{split}/acc" and start["split"] == "val"
        cohorts = {s["cohort"] for s in start["charts"][0]["series"]}
        assert cohorts == {
            "residual lr=0.01",
            "sd_constant lr=0.01",
            "plain lr=0.03",
            "plain lr=0.01",
        }

        # Plotted means and seeds equal the history (accuracy in percent).
        page.check("#seeds")
        for s in plot()["charts"][0]["series"]:
            if s["kind"] == "seed":
                hist = _history(root, s["run"])
                for x, y in zip(s["x"], s["y"]):
                    want = hist[int(x)].get("val/acc")
                    if isinstance(want, float) and math.isfinite(want):
                        assert _close(y, 100 * want), (s["run"], x)
                    else:
                        assert y is None
            if s["kind"] == "mean" and s["cohort"] == "residual lr=0.01":
                for x, y in zip(s["x"], s["y"]):
                    vals = [
                        100 * _history(root, f"residual-s{k}")[int(x)]["val/acc"]
                        for k in (101, 102)
                    ]
                    assert _close(y, sum(vals) / 2)

        # The awkward run: epoch 2 has no row (due, missing) and val/acc is null at
        # epoch 3: both are gaps.
        awk = next(s for s in plot()["charts"][0]["series"] if s["cohort"] == "plain lr=0.03")
        got = dict(zip(awk["x"], awk["y"]))
        assert got[2] is None and got[3] is None
        assert _close(got[1], 100 * _history(root, "awkward-s7")[1]["val/acc"])

        # Toggle a recipe off.
        page.locator("#cohorts input[data-cohort='sd_constant lr=0.01']").uncheck()
        assert "sd_constant lr=0.01" not in {s["cohort"] for s in plot()["charts"][0]["series"]}

        # A per-layer field: one small multiple per layer; toggle one layer off.
        page.fill("#field-search", "grad/pex/diversity")
        page.select_option("#field", "grad/pex/diversity/{layer}")
        facets = [c["facet"] for c in plot()["charts"]]
        assert facets == ALIGNED  # one panel per network layer, in model order
        # The aligned panel holds both recipes' own layer: plain's blocks.1.res and
        # residual's blocks.1.res.branch, each plotted from its own history field.
        block1 = next(c for c in plot()["charts"] if c["facet"] == ALIGNED[2])
        for run_id, own in (
            ("plain-s101", "blocks.1.res"),
            ("residual-s102", "blocks.1.res.branch"),
        ):
            seed = next(s for s in block1["series"] if s["run"] == run_id)
            hist = _history(root, run_id)
            assert seed["y"] == [hist[int(x)][f"grad/pex/diversity/{own}"] for x in seed["x"]]
        title = page.locator(f"#charts .chart[data-facet='{ALIGNED[2]}'] h4").inner_text()
        assert title == f"layer {ALIGNED[2]}"
        page.locator(f"#facets input[data-facet='{ALIGNED[2]}']").uncheck()
        assert [c["facet"] for c in plot()["charts"]] == [f for f in ALIGNED if f != ALIGNED[2]]
        l5 = next(c for c in plot()["charts"] if c["facet"] == "head")
        seed = next(s for s in l5["series"] if s["run"] == "residual-s102")
        hist = _history(root, "residual-s102")
        assert [hist[int(x)]["grad/pex/diversity/head"] for x in seed["x"]] == seed["y"]
        sparse = next(s for s in l5["series"] if s["run"] == "residual-s101")
        assert sparse["y"][1:4] == ["not scheduled"] * 3 and None not in sparse["y"]
        # uPlot spans undefined (not scheduled) but breaks at null: the series' data
        # between epochs 0 and 4 hold undefined, which JSON cannot carry (null here
        # would mean a gap), so count them in the page.
        undefined = page.evaluate(
            """() => { const u = window.fathomCharts.find(c => c.root.parentNode.dataset.facet === 'head');
            const i = u.fathomSeries.findIndex(s => s.run === 'residual-s101') + 1;
            return [u.data[i].filter(v => v === undefined).length, u.data[i].filter(v => v === null).length]; }"""
        )
        assert undefined[0] >= 3 and undefined[1] == 0

        # Zoom: a drag across the first chart narrows x on every chart.
        page.locator("#charts .u-over").first.scroll_into_view_if_needed()
        over = page.locator("#charts .u-over").first.bounding_box()
        assert over is not None
        page.mouse.move(over["x"] + 0.2 * over["width"], over["y"] + over["height"] / 2)
        page.mouse.down()
        page.mouse.move(over["x"] + 0.6 * over["width"], over["y"] + over["height"] / 2, steps=5)
        page.mouse.up()
        ranges = page.evaluate("window.fathomCharts.map(u => [u.scales.x.min, u.scales.x.max])")
        assert all(r == ranges[0] for r in ranges) and ranges[0][1] - ranges[0][0] < 4 * 0.7

        # Open an example under a mask.
        page.locator("#mask-table tbody tr").nth(3).click()
        mask = page.locator("#mask-table tr.sel").get_attribute("data-mask")
        page.locator("#examples .ex").first.click()
        info = page.locator("#example-info").inner_text()
        assert f"under mask {mask}" in info and "correct under" in info
        assert page.locator("#mask-chips .chip").count() == 8  # all 2^3 masks
        assert page.locator("#logit-table tr").count() == 3

        # Every audited seed: the seed selector switches to sd_constant's second seed,
        # keeping the mask; its examples show its own logits.
        page.select_option("#mask-arm", "sd_constant")
        page.select_option("#mask-seed", "102")
        assert page.locator("#mask-seed option").count() == 2
        caption = page.locator("#mask-table caption").inner_text()
        assert "sd_constant-s102" in caption and "seed 102" in caption
        assert page.locator("#mask-table tr.sel").get_attribute("data-mask") == mask
        key = f"sd_constant-s102|{page.locator('#mask-checkpoint').input_value()}"
        masks = json.loads(page.evaluate("JSON.stringify(window.fathomMasks)"))
        assert masks == stored_json(html.read_text(), "fathom-masks")  # decoded as stored
        per = masks["examples"]["per"][key]
        page.locator("#examples .ex").first.click()
        shown = [float(x) for x in page.locator("#logit-table td.num").all_inner_texts()]
        want = per["logits"][per["masks"].index(mask)][0]
        assert shown == [float(f"{v:.3f}") for v in want]

        # Telemetry: the computed contrast sentences lead the gradient table.
        out = json.loads((html.parent / "summary.json").read_text())
        grad = next(t for t in out["tables"] if t["name"] == "gradients")
        lower = next(v for v in grad["verdicts"] if v["recipe"] == "plain" and v["epoch"] == 4
                     and v["quantity"] == "grad_norm")  # fmt: skip
        # the awkward residual seed 7 leaves the arms with unequal seeds: no comparison,
        # named (a paired contrast never silently drops a seed)
        assert lower["verdict"] == "no comparison"
        assert lower["sentence"].startswith(
            "plain vs residual on head-layer ‖mean g‖ (epoch 4): no comparison (unequal seeds"
        )
        item = page.locator("#verdicts-gradients li", has_text=lower["sentence"])
        item.scroll_into_view_if_needed()
        assert item.count() == 1 and item.is_visible()
        box = page.locator("#verdicts-gradients").bounding_box()
        table_box = page.locator("#x-gradients").bounding_box()
        assert box is not None and table_box is not None and box["y"] < table_box["y"]
        assert not errors, errors
        assert not outside, outside
    finally:
        for context in browser.contexts:  # each page its own context
            context.close()


def test_report_view_details_in_chromium(report: tuple[Path, Path], browser) -> None:
    """The y range follows the visible data (epoch 0 out of the autoscale), the hover shows
    mean ± SD and the range over seeds with units, wide tables scroll inside their box at a
    narrow window, a nav click lands below the sticky nav, the view is in the URL hash and
    restored from it, and masks and examples open from the keyboard."""
    _root, html = report
    errors: list[str] = []
    try:
        page = browser.new_page(viewport={"width": 900, "height": 900})
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(html.resolve().as_uri())
        page.wait_for_function("() => window.fathomReady === true")

        def y_range() -> list[float]:
            return page.evaluate(
                "[window.fathomCharts[0].scales.y.min, window.fathomCharts[0].scales.y.max]"
            )

        def plotted(lo_epoch: float = -1, hi_epoch: float = 1e9) -> list[float]:
            out = json.loads(page.evaluate(SNAPSHOT, "fathomPlot"))
            return [y for s in out["charts"][0]["series"] for x, y in zip(s["x"], s["y"])
                    if isinstance(y, float | int) and lo_epoch <= x <= hi_epoch]  # fmt: skip

        # y autoscale: epoch 0 (10% accuracy before training) is left out by default
        after0 = plotted(lo_epoch=1)
        lo, hi = y_range()
        assert min(plotted()) < lo <= min(after0) and max(after0) <= hi
        page.check("#zero-y")
        assert y_range()[0] <= min(plotted())
        page.uncheck("#zero-y")
        # after a zoom to the last epochs, y follows the points inside the window
        page.evaluate("window.fathomCharts[0].setScale('x', {min: 2.5, max: 4})")
        lo, hi = y_range()
        inside = plotted(lo_epoch=2.5, hi_epoch=4)
        assert min(inside) - 0.1 * (max(inside) - min(inside)) <= lo <= min(inside)
        assert lo > min(plotted(lo_epoch=1))
        # the zoom is in the URL, with the field and the recipes
        view = page.evaluate("location.hash")
        assert view.startswith("#view?")
        state = parse_qs(view.removeprefix("#view?"))
        assert state["x"] == ["2.5~4"] and state["field"] == ["{split}/acc"]
        assert "residual lr=0.01" in state["cohorts"][0].split("|")

        # hover: mean ± SD, range over seeds, units
        over = page.locator("#charts .u-over").first
        over.scroll_into_view_if_needed()
        box = over.bounding_box()
        assert box is not None
        page.mouse.move(box["x"] + 0.9 * box["width"], box["y"] + box["height"] / 2)
        text = page.locator("#readout").inner_text()
        assert "residual lr=0.01:" in text and " ± " in text and "SD %" in text
        assert "(n=2, range " in text

        # wide tables scroll inside their own box; the page itself never scrolls sideways
        widths = page.evaluate(
            """() => Array.from(document.querySelectorAll('table')).map(t =>
            [t.getBoundingClientRect().right, t.scrollWidth, t.clientWidth])"""
        )
        page_width = page.evaluate("document.documentElement.clientWidth")
        assert all(right <= page_width + 1 for right, _, _ in widths)
        assert any(sw > cw for _, sw, cw in widths)  # at 900 px some table does scroll
        assert page.evaluate("document.documentElement.scrollWidth") <= page_width + 1

        # a nav click lands the section title below the sticky nav
        page.click("nav a[href='#audit']")
        page.wait_for_timeout(100)
        nav = page.locator("nav").bounding_box()
        title = page.locator("#audit").bounding_box()
        assert nav is not None and title is not None and title["y"] >= nav["y"] + nav["height"] - 1

        # keyboard: every mask row and example tile is focusable; Enter opens it
        rows = page.locator("#mask-table tbody tr")
        assert rows.count() == 8 and all(
            rows.nth(i).get_attribute("tabindex") == "0" for i in range(rows.count())
        )
        rows.nth(2).focus()
        page.keyboard.press("Enter")
        mask = page.locator("#mask-table tr.sel").get_attribute("data-mask")
        assert mask == rows.nth(2).get_attribute("data-mask")
        tile = page.locator("#examples .ex").nth(1)
        assert tile.get_attribute("tabindex") == "0"
        tile.focus()
        page.keyboard.press(" ")
        assert f"under mask {mask}" in page.locator("#example-info").inner_text()

        # the URL restores the view: field, split, zoom and mask
        page.select_option("#split", "test")
        url = page.evaluate("location.href")
        other = browser.new_page(viewport={"width": 1280, "height": 900})
        other.goto(url)
        other.wait_for_function("() => window.fathomReady === true")
        assert other.input_value("#split") == "test"
        assert other.locator("#mask-table tr.sel").get_attribute("data-mask") == mask
        assert other.locator("#examples .ex.sel").count() == 1
        assert other.evaluate("window.fathomCharts[0].scales.x.min") == 2.5
        assert not errors, errors
    finally:
        for context in browser.contexts:  # each page its own context
            context.close()


def _png_size(path: Path) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR"
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def test_first_screen_in_chromium(report: tuple[Path, Path], browser, tmp_path: Path) -> None:
    """At 1240 x 800 the first screen holds the main table (every row) and the decided
    verdicts; the undecided comparisons are one line, a count that opens onto them. The
    geometry is checked in the DOM and the screen saved as a screenshot."""
    from fathom.report.sections import split_sentences

    root, html = report
    stats = json.loads((root / "summary.json").read_text())["stats"]
    decided, undecided = split_sentences(stats)
    assert decided and undecided  # the fixture has both
    page = browser.new_page(viewport={"width": 1240, "height": 800})
    try:
        page.goto(html.resolve().as_uri())
        page.wait_for_function("() => window.fathomReady === true")
        shot = tmp_path / "first-screen.png"
        page.screenshot(path=str(shot))
        assert _png_size(shot) == (1240, 800)
        box = page.locator("#main-table").bounding_box()
        assert box is not None
        table_shot = page.screenshot(clip=box)  # the table as painted, not a blank box:
        assert len(table_shot) > 20 * len(page.screenshot(clip={**box, "y": 0, "height": 8}))

        def bottom(sel: str) -> float:
            box = page.locator(sel).bounding_box()
            assert box is not None, sel
            return box["y"] + box["height"]

        # every row of the main table, its header and the decided verdicts are on screen
        assert bottom("#main-table") <= 800 and page.locator("#main-table tbody tr").count() == 2
        assert page.locator("#verdicts li").all_inner_texts() == decided
        assert bottom("#verdicts") <= 800
        assert all("not established" not in t.split(":")[1][:20] for t in decided)
        # the main table is whole in its box (no cut header at this width)
        sw, cw = page.evaluate(
            "(() => { const t = document.getElementById('main-table'); "
            "return [t.scrollWidth, t.clientWidth]; })()"
        )
        assert sw <= cw + 1
        # undecided: one summary line with the count, closed, on the first screen
        summary = page.locator("#undecided > summary")
        assert summary.inner_text().startswith(f"{len(undecided)} comparison(s) not established")
        assert bottom("#undecided > summary") <= 800
        assert not page.locator("#undecided li").first.is_visible()
        summary.click()
        assert page.locator("#undecided li").all_inner_texts() == undecided
    finally:
        page.context.close()


def test_lazy_sections_nav_and_time_axes_in_chromium(report: tuple[Path, Path], browser) -> None:
    """A large collapsed section holds no table until opened, then exactly the tables the
    page stores for it; a nav click keeps the view in the URL (and adds the section); a
    reload lands on that section; clock axes read as times; a wide table shows its cue."""
    from fathom.report.lazy import LAZY_TYPE, decode

    _root, html = report
    text = html.read_text()
    stored = re.findall(rf'<script type="{LAZY_TYPE}">([A-Za-z0-9+/=]*)</script>', text)
    assert stored, "the fixture's raw sections are large enough to be stored compressed"
    errors: list[str] = []
    page = browser.new_page(viewport={"width": 900, "height": 800})
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(html.resolve().as_uri())
        page.wait_for_function("() => window.fathomReady === true")

        # lazy sections: no table before opening; the decoded tables after
        lazy = page.locator("details[data-lazy]")
        assert lazy.count() == len(stored)
        for i, body in enumerate(stored):
            d = lazy.nth(i)
            assert d.locator("table").count() == 0
            d.locator(":scope > summary").click()
            page.wait_for_function("(n) => window.fathomLazy === n", arg=i + 1)
            assert d.locator("table").count() == decode(body).count("<table")
            d.locator(":scope > summary").click()  # closed again: the tables stay
        # a filter input inside a loaded section works (tables wired after insertion)
        flt = page.locator("details[data-lazy] input.table-filter").first
        if flt.count():
            flt.locator("xpath=ancestor::details[1]").evaluate("d => d.open = true")
            tid = flt.get_attribute("data-table")
            rows = page.locator(f"#{tid} tbody tr")
            flt.fill("no-row-holds-this-text")
            assert all(not rows.nth(k).is_visible() for k in range(rows.count()))

        # time axes: the Unix timestamp as UTC clock times, the clocks as durations
        page.fill("#field-search", "clock/unix_s")
        page.select_option("#field", "clock/unix_s")
        ticks = page.evaluate("window.fathomCharts[0].axes[1]._values")
        # (these runs' clocks span weeks: each tick says its date; within a day, the time)
        stamp = r"(\d{4}-\d\d-\d\d )?\d\d:\d\d:\d\d"
        assert ticks and all(re.fullmatch(stamp, t) for t in ticks), ticks
        assert len(set(ticks)) == len(ticks)
        page.select_option("#axis", "clock/training_s")
        xt = page.evaluate("window.fathomCharts[0].axes[0]._values")
        assert xt and all(re.fullmatch(r"−?\d+(\.\d+)? s|\d+:\d\d(\.\d)?", t) for t in xt), xt

        # a nav click keeps the view and records the section; a reload lands there
        before = parse_qs(page.evaluate("location.hash").removeprefix("#view?"))
        page.click("nav a[href='#curvature']")
        after = parse_qs(page.evaluate("location.hash").removeprefix("#view?"))
        assert after.pop("at") == ["curvature"] and after == before
        page.reload()
        page.wait_for_function("() => window.fathomReady === true")
        assert page.input_value("#field") == "clock/unix_s"
        top = page.locator("#curvature").bounding_box()
        at_end = page.evaluate("scrollY + innerHeight >= document.body.scrollHeight - 1")
        assert top is not None and 0 <= top["y"] < 800 and (top["y"] < 200 or at_end)
        assert page.evaluate("scrollY") > 0

        # a wide table (at 900 px): a cue line above it and a fading right edge that goes
        # once the table is scrolled to its end
        page.evaluate("document.querySelectorAll('details').forEach(d => d.open = true)")
        page.wait_for_timeout(200)
        wrap = page.locator(".scroll-wrap.wide").first
        assert wrap.count() == 1
        assert "more-right" in (wrap.get_attribute("class") or "")
        cue = wrap.locator("xpath=preceding-sibling::div[1]")
        assert "scroll the table sideways" in cue.inner_text()
        wrap.locator("table").evaluate("t => { t.scrollLeft = t.scrollWidth; }")
        page.wait_for_timeout(100)
        assert "more-right" not in (wrap.get_attribute("class") or "")
        assert not errors, errors
    finally:
        page.context.close()
