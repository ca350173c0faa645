"""report.html in headless Chromium: no console error, no request leaves the file, every
selector changes what is plotted, and plotted values equal the history's values.

Needs the ``browser`` extra (Playwright's Python package) and Debian's ``chromium`` at
/usr/bin/chromium (no browser download); CI installs both. Without them the test is
skipped with the reason printed.
"""

from __future__ import annotations

import json
import math
import random
import shutil
from pathlib import Path

import pytest

from fathom.io import read_jsonl
from fathom.report import build_report
from fathom.report.synthetic import write_study

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
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("browser") / "study"
    write_study(root, recipes=("residual", "sd_constant"), seeds=(101, 102), awkward=True)
    return root, build_report(root, with_figures=False).html


def test_report_in_chromium(report: tuple[Path, Path]) -> None:
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="install the browser extra: pip install -e '.[browser]'"
    )
    root, html = report
    url = html.resolve().as_uri()
    errors: list[str] = []
    outside: list[str] = []
    with sync_api.sync_playwright() as p:
        browser = launch(p)
        try:
            page = browser.new_page()
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))

            def guard(route):
                if route.request.url != url:
                    outside.append(route.request.url)
                    route.abort()
                else:
                    route.continue_()

            page.route("**/*", guard)
            page.on("request", lambda r: outside.append(r.url) if r.url != url else None)
            page.goto(url)
            page.wait_for_function("window.fathomReady === true")

            def plot() -> str:
                return page.evaluate(SNAPSHOT, "fathomPlot")

            def class_plot() -> str:
                return page.evaluate(SNAPSHOT, "fathomClassPlot")

            def drawn(svg: str = "#plot") -> str:
                return page.inner_html(svg)

            def changes(action, svg: str = "#plot") -> None:
                before = drawn(svg)
                action()
                assert drawn(svg) != before, f"selector {action.__name__} did not change the plot"

            start = json.loads(plot())
            assert start["field"] == "val/acc" and len(start["traces"]) == 5
            assert page.locator("#plot g.trace").count() == 5

            def field():
                page.select_option("#field", "{split}/ce")

            def search():
                page.fill("#field-search", "zero_frac")

            def axis():
                page.select_option("#axis", "clock/training_s")

            def split():
                page.select_option("#split", "test")

            def cohort():
                page.locator("#cohorts input[value='residual lr=0.01']").uncheck()

            def seed():
                page.locator("#seeds input[value='102']").uncheck()

            def log_y():
                page.check("#logy")

            def class_run():
                page.select_option("#class-run", "sd_constant-s102")

            def class_split():
                page.select_option("#class-split", "fit")

            for action in (field, axis, split, cohort, seed, log_y, search):
                changes(action)
            assert json.loads(plot())["field"].startswith("probe/act/zero_frac/")
            for action in (class_run, class_split):
                changes(action, "#class-plot")
            cls = json.loads(class_plot())
            assert len(cls["traces"]) == 10 and page.locator("#class-plot g.trace").count() == 10

            # Plotted values equal the history's, for sampled fields, every run, every axis.
            page.fill("#field-search", "")
            for box in page.locator("#cohorts input, #seeds input").all():
                box.check()
            page.uncheck("#logy")
            options = page.eval_on_selector_all("#field option", "os => os.map(o => o.value)")
            rng = random.Random(8)
            sampled = ["{split}/ce", *rng.sample(options, 6)]
            for key in sampled:
                page.select_option("#field", key)
                for axis_name in ("epoch", "clock/elapsed_s"):
                    page.select_option("#axis", axis_name)
                    shown = json.loads(plot())
                    assert_plot_matches_history(root, shown)
            # hovering a point reads out its recorded value
            page.locator("#plot").scroll_into_view_if_needed()
            pt = page.evaluate(
                """() => { const s = document.getElementById('plot'); const p = s.points[3];
                const b = s.getBoundingClientRect(); const k = b.width / s.viewBox.baseVal.width;
                const same = s.points.filter(q => Math.hypot(q.px - p.px, q.py - p.py) < 0.5);
                return {x: b.left + p.px * k, y: b.top + p.py * k, ys: same.map(q => q.y)}; }"""
            )
            page.mouse.move(pt["x"], pt["y"])
            text = page.inner_text("#readout")
            assert "y = " in text, text
            assert float(text.rsplit("y = ", 1)[1]) in pt["ys"]
            # the awkward run's NaN / inf / null reach the page as gaps, not numbers
            page.select_option("#split", "val")
            page.select_option("#field", "{split}/ce")
            shown = json.loads(plot())
            awk = next(t for t in shown["traces"] if t["run"] == "awkward-s7")
            assert awk["y"][1] == "NaN"
            assert page.locator("#plot g.trace path").nth(0).get_attribute("d").count("M") >= 1
        finally:
            browser.close()
    assert errors == []
    assert outside == []


def assert_plot_matches_history(root: Path, shown: dict) -> None:
    assert shown["traces"], f"nothing plotted for {shown['field']}"
    for tr in shown["traces"]:
        rows, _ = read_jsonl(root / tr["run"] / "history.jsonl")
        rows = sorted(rows, key=lambda r: r["epoch"])
        assert tr["epochs"] == [r["epoch"] for r in rows]
        for r, x, y in zip(rows, tr["x"], tr["y"]):
            want_y = r.get(shown["field"])
            want_x = r["epoch"] if shown["axis"] == "epoch" else r.get(shown["axis"])
            for want, got in ((want_y, y), (want_x, x)):
                if isinstance(want, float) and not math.isfinite(want):
                    assert got == str(want).replace("nan", "NaN").replace("inf", "Infinity")
                else:
                    assert got == want, (tr["run"], shown["field"], r["epoch"], want, got)
