"""Report and export benchmark: report.html size, build time, load-and-render time and time
to first contentful paint in headless Chromium (1240 x 800), tables in the DOM at load,
whether the main table and the verdicts lie on the first screen, field-switch time, and
export + read-back verification time per target (``--targets`` with none: no exports).

Studies are synthetic run directories (``tests/synthetic_runs.py``, written through ``RunWriter``) of the quick study's
shape (``ciresan-sd-quick``: 5 recipes x 3 main seeds + 5 recipes x 3 tuning rates = 30
runs, epochs 0..5 evaluated every epoch):

* ``quick``: telemetry off, as the preset runs it (the trainer's fields and per-class scores);
* ``quick+telemetry``: every registry field of a 6-affine-layer model on three splits;
* ``seed-scale``: 18 runs x 22 rows x ~840 scalar fields, the size of the explorer the
  seed report describes (401 rows, 838 fields).

``--study DIR`` adds a real study directory (copied first; nothing is written into it),
e.g. the output of ``fathom study run ciresan-sd-quick``.

Prints the machine and repeats; quotes medians; ratios are measured side by side.
Usage: ``python bench/bench_report.py [--repeats 3] [--study DIR] [--shapes ...] [--targets ...]``.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from fathom.export import export, verify
from fathom.report import build_report, load_runs

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the test fixtures
from synthetic_runs import synthetic_history, write_run

RECIPES = ("plain", "residual", "residual_dropout", "sd_constant", "sd_decreasing")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def registry_fields() -> list[str]:
    from fathom.telemetry.registry import FAMILIES, expected_names

    names = expected_names(FAMILIES, 6, ["fit", "val", "test"], 10)
    return [n for n in names if not n.startswith("split/")]


def make_study(root: Path, shape: str) -> int:
    """Write one study; return its number of runs."""
    if shape == "seed-scale":
        tel = registry_fields()
        tel += [f"extra/synthetic_{i}" for i in range(max(0, 840 - 120 - len(tel)))]
        epochs = [0, 1, *range(5, 101, 5)]
        runs = [
            (r, s, 0.01)
            for r in (
                "plain",
                "residual",
                "sd_constant",
                "sd_decreasing",
                "residual_dropout",
                "optimized",
            )
            for s in (101, 102, 103)
        ]
    else:
        tel = registry_fields() if shape == "quick+telemetry" else []
        epochs = list(range(6))
        runs = [(r, s, 0.01) for r in RECIPES for s in (101, 102, 103)]
        runs += [(r, 1, lr) for r in RECIPES for lr in (0.01, 0.03, 0.1)]
    for i, (recipe, seed, lr) in enumerate(runs):
        rows = synthetic_history(1000 + i, epochs, layers=6, classes=10, telemetry=tel)
        write_run(
            root / f"{recipe}-lr{lr:g}-s{seed}",
            study=root.name,
            recipe=recipe,
            seed=seed,
            lr=lr,
            rows=rows,
        )
    return len(runs)


FIRST_SCREEN = """() => {
    const fcp = performance.getEntriesByName('first-contentful-paint')[0];
    const bottom = (id) => { const e = document.getElementById(id);
        return e ? e.getBoundingClientRect().bottom : null; };
    return [fcp ? fcp.startTime : null, document.querySelectorAll('table').length,
            bottom('main-table'), bottom('verdicts')];
}"""


def browser_times(html: Path) -> dict[str, float]:
    """Wall ms from navigation to ready, in-page ms to ready and to first contentful paint,
    tables at load, the main table's and the verdicts' bottom edge (px, first screen 800),
    median ms per field switch."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1240, "height": 800})
            t0 = time.perf_counter()
            page.goto(html.resolve().as_uri())
            page.wait_for_function("() => window.fathomReady === true")
            wall = (time.perf_counter() - t0) * 1e3
            ready = page.evaluate("window.fathomReadyMs")
            fcp, tables, main_bottom, verdicts_bottom = page.evaluate(FIRST_SCREEN)
            switch = page.evaluate(
                """() => {
                const sel = document.getElementById('field');
                const opts = Array.from(sel.options).map(o => o.value).slice(0, 60);
                const ts = [];
                for (const v of opts) {
                    const t = performance.now();
                    sel.value = v; sel.dispatchEvent(new Event('change'));
                    ts.push(performance.now() - t);
                }
                ts.sort((a, b) => a - b);
                return ts[Math.floor(ts.length / 2)];
            }"""
            )
        finally:
            browser.close()
    return {
        "wall": wall,
        "ready": ready,
        "fcp": fcp,
        "tables": tables,
        "main_bottom": main_bottom,
        "verdicts_bottom": verdicts_bottom,
        "switch": switch,
    }


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--shapes", nargs="*", default=["quick", "quick+telemetry", "seed-scale"])
    ap.add_argument("--targets", nargs="*", default=["jsonl", "tensorboard", "wandb"])
    ap.add_argument("--no-figures", action="store_true", help="skip the build with PNG figures")
    ap.add_argument("--loads", type=int, default=1, help="page loads per build (medians)")
    ap.add_argument("--study", type=Path, help="also benchmark this study directory (copied)")
    args = ap.parse_args()
    if args.study is not None:
        args.shapes = [*args.shapes, f"study:{args.study}"]
    print(
        f"machine: {platform.platform()}, {os.cpu_count()} CPUs (shared with other engineers: loaded)"
    )
    print(f"repeats: {args.repeats} builds x {args.loads} page loads; medians reported")
    for shape in args.shapes:
        with tempfile.TemporaryDirectory() as tmp:
            if shape.startswith("study:"):
                src = Path(shape.split(":", 1)[1])
                root = Path(tmp) / src.name
                shutil.copytree(src, root)
                n = len(load_runs(root))
            else:
                root = Path(tmp) / shape.replace("+", "-")
                n = make_study(root, shape)
            build, build_fig = [], []
            pages: list[dict[str, float]] = []
            exp: dict[str, list[float]] = {t: [] for t in args.targets}
            ver: dict[str, list[float]] = {t: [] for t in args.targets}
            values: dict[str, int] = {}
            size = 0
            for rep in range(args.repeats):
                t = time.perf_counter()
                out = build_report(root, Path(tmp) / f"r{rep}", with_figures=False)
                build.append(time.perf_counter() - t)
                size = out.html.stat().st_size
                if not args.no_figures:
                    t = time.perf_counter()
                    build_report(root, Path(tmp) / f"f{rep}", with_figures=True)
                    build_fig.append(time.perf_counter() - t)
                pages += [browser_times(out.html) for _ in range(args.loads)]
                for target in args.targets:
                    dest = Path(tmp) / f"{target}{rep}"
                    t = time.perf_counter()
                    report = export(root, target, dest)
                    exp[target].append(time.perf_counter() - t)
                    assert report.ok, report.lines()
                    t = time.perf_counter()
                    again = verify(root, target, dest)
                    ver[target].append(time.perf_counter() - t)
                    assert again.ok
                    values[target] = again.values
            fields = len(out.html.read_text().split('"names":[', 1)[1].split("]", 1)[0].split(","))
            print(f"\n## {shape}: {n} runs, {fields} scalar fields per run")
            print(f"report.html size: {size / 1e6:.2f} MB")
            figs = f"; with PNG figures: {med(build_fig):.2f} s" if build_fig else ""
            print(f"build report (no figures): {med(build):.2f} s{figs}")

            def pm(key: str, pages: list[dict[str, float]] = pages) -> float:
                return med([p[key] for p in pages if p[key] is not None] or [math.nan])

            print(
                f"Chromium 1240x800 load-and-render: {pm('wall'):.0f} ms wall (goto -> ready), "
                f"{pm('ready'):.0f} ms in page, first contentful paint {pm('fcp'):.0f} ms; "
                f"{pm('tables'):.0f} tables at load; field switch median {pm('switch'):.1f} ms"
            )
            print(
                f"first screen (800 px): main table ends at {pm('main_bottom'):.0f} px, "
                f"verdicts at {pm('verdicts_bottom'):.0f} px"
            )
            if not args.targets:
                continue
            base = med(exp[args.targets[0]])
            for target in args.targets:
                print(
                    f"export {target}: {med(exp[target]):.2f} s (incl. read-back verification; "
                    f"{med(exp[target]) / base:.2f}x {args.targets[0]}); --verify-only {med(ver[target]):.2f} s; "
                    f"{values[target]} values checked"
                )


if __name__ == "__main__":
    main()
