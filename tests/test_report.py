"""Report: run loading, the embedded explorer data, optional sections, figures, summary.md."""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path
from typing import get_args

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fathom.base.io import read_jsonl
from fathom.base.units import percent
from fathom.cli import main
from fathom.errors import FathomError
from fathom.report import build_report, load_runs
from fathom.report.fields import concrete, is_accuracy, split_key
from fathom.report.html import explorer_payload
from fathom.report.lazy import expanded
from fathom.stats.verdicts import NOT_ESTABLISHED, VERDICTS, RankingVerdict
from synthetic_runs import write_study


def payload_of(html_path: Path) -> dict:
    text = html_path.read_text()
    m = re.search(r'<script type="application/json" id="fathom-data">(.*?)</script>', text, re.S)
    assert m is not None
    return json.loads(m.group(1))


def decode(v):
    return float(v) if isinstance(v, str) else v


@pytest.fixture
def study(tmp_path: Path) -> Path:
    root = tmp_path / "study"
    write_study(root, awkward=True)
    return root


def test_no_runs_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FathomError, match="no runs under"):
        load_runs(tmp_path)
    with pytest.raises(FathomError, match="does not exist"):
        load_runs(tmp_path / "missing")
    assert main(["report", str(tmp_path)]) == 2


def test_truncated_and_repeated_lines_are_flagged(tmp_path: Path) -> None:
    root = tmp_path / "s"
    (run,) = write_study(root, recipes=("residual",), seeds=(1,), epochs=(0, 1, 2))
    lines = (run / "history.jsonl").read_text().splitlines(keepends=True)
    (run / "history.jsonl").write_text(
        lines[0] + "{not json\n" + lines[1] + lines[1] + lines[2][:20]
    )
    (r,) = load_runs(root)
    assert [row["epoch"] for row in r.rows] == [0, 1]
    assert r.flagged_lines == [2, 5]
    assert any("repeats epoch 1" in x for x in r.flag_reasons)


def test_split_keys() -> None:
    assert split_key("val/acc") == ("{split}/acc", "val")
    assert split_key("split/test/class_acc/3") == ("split/{split}/class_acc/3", "test")
    assert split_key("probe/act/mean/blocks.0.res.branch") == (
        "probe/act/mean/blocks.0.res.branch",
        None,
    )
    assert split_key("clock/training_s") == ("clock/training_s", None)
    assert concrete("split/{split}/class_acc/3", "fit") == "split/fit/class_acc/3"


def test_embedded_data_equals_history(study: Path) -> None:
    out = build_report(study, with_figures=False)
    data = payload_of(out.html)
    assert out.runs == 5 and len(data["runs"]) == 5
    assert data["splits"] == ["fit", "val", "test"]
    assert data["meta"]["split/{split}/class_acc/{class}"]["facets"] == [str(c) for c in range(10)]
    assert data["meta"]["{split}/acc"]["units"] == "%"
    assert "split/val/confusion" not in data["names"]  # a matrix is not a curve
    checked = 0
    for run in data["runs"]:
        rows, _ = read_jsonl(study / run["id"] / "history.jsonl")
        rows = sorted(rows, key=lambda r: r["epoch"])
        assert run["epochs"] == [r["epoch"] for r in rows]
        for name, col in zip(data["names"], run["cols"]):
            if col is None:
                assert all(name not in r for r in rows)
                continue
            for r, v in zip(rows, col):
                if name not in r:  # not scheduled at this epoch: spanned, never a gap
                    assert v == "-"
                    continue
                want, got = r.get(name), decode(v)
                if is_accuracy(name) and isinstance(want, float):
                    want = percent(want)  # accuracy is embedded in percent
                assert (
                    (math.isnan(want) and math.isnan(got))
                    if isinstance(want, float) and math.isnan(want)
                    else want == got
                )
                checked += 1
    assert checked > 1000
    awkward = next(r for r in data["runs"] if r["id"] == "awkward-s7")
    col = awkward["cols"][data["names"].index("probe/act/mean/blocks.0.res.branch")]
    assert col[1:3] == ["Infinity", "-Infinity"]
    assert awkward["cols"][data["names"].index("val/acc")][2] is None
    assert awkward["epochs"] == [0, 1, 3, 4]
    assert any("line 5" in f for f in awkward["flagged"])


def test_page_is_self_contained(study: Path) -> None:
    html = build_report(study, with_figures=False).html.read_text()
    assert "default-src 'none'" in html
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)
    assert "<script src" not in html and "<link" not in html
    assert "truncated" in html  # the flagged line is shown


def test_real_trainer_run_and_real_audit(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from fathom.audit.checkpoint import AuditSettings
    from fathom.audit.run import audit_runs
    from fathom.config import RunConfig
    from fathom.data import DataSplits
    from fathom.train.loop import train

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)

    def mk(n: int):
        return torch.randint(0, 256, (n, 28, 28), dtype=torch.uint8, generator=g), torch.randint(
            0, 10, (n,), generator=g
        )

    (fx, fy), (vx, vy), (tx, ty) = mk(64), mk(64), mk(64)
    splits = DataSplits(
        fx, fy, vx, vy, tx, ty, split_hash="synthetic", info={"dataset": "synthetic", "classes": 10}
    )
    cfg = RunConfig.model_validate(
        {
            "name": "r1",
            "study": "s",
            "seed": 101,
            "device": "cpu",
            "model": {"widths": [16, 12, 12, 12, 8], "recipe": "sd_constant"},
            "optim": {"epochs": 2, "batch_size": 16},
            "eval": {"every": 1},
            "telemetry": {"enabled": True, "first": [0, 1], "every": 2, "probe_size": 8},
            "checkpoints": {"save_epochs": [0, 2]},
        }
    )
    train(cfg, tmp_path / "s" / "r1", splits=splits)
    settings = AuditSettings(router=False, margin_bins=1, timing_repeats=1, timing_batch_sizes=(1,))
    audit_runs(tmp_path / "s", settings, splits=splits)
    from fathom.curvature.rundir import run_curvature
    from fathom.rundir import RunDir

    class SyntheticRunDir(RunDir):
        def load_splits(self, device="cpu"):
            return splits

    run_curvature(SyntheticRunDir(tmp_path / "s" / "r1"), None, probe=8)
    out = build_report(tmp_path / "s")
    data = payload_of(out.html)
    assert "probe/act/zero_frac/{layer}" in data["fields"]
    meta = data["meta"]["probe/act/zero_frac/{layer}"]
    assert "blocks.0.res.branch" in meta["facets"]  # qualified module names as facets
    assert meta["source"] == "telemetry registry" and "N x units" in meta["formula"]
    acc = data["meta"]["{split}/acc"]
    assert acc["source"] == "telemetry registry" and acc["family"] == "trainer"
    assert data["fields"][0] in ("epoch", "step", "{split}/acc", "clock/elapsed_s")  # trainer first
    assert "split/{split}/class_acc/{class}" in data["fields"]
    html = expanded(out.html.read_text())  # every collapsed section as a reader opens it
    assert cfg.model_dump()["name"] in html and "config" in html  # provenance table
    explorer = html.split("Every audited mask", 1)[1].split("</table>", 1)[0]
    assert explorer.count("<tr>") == 1 + 16  # header + all 2^4 masks of the one run
    assert "<th>test.damage (nats)</th>" in explorer and "<th>test.acc (%)</th>" in explorer
    assert "Per-digit resilience" in html
    assert sorted(p.name for p in out.figures) == ["learning_curves.png", "mask_damage.png"]
    curv = html.split("Curvature summary: run r1", 1)[1].split("</table>", 1)[0]
    assert curv.count("<tr>") == 1 + 2 and "<th>rho</th>" in curv  # epochs 0 and 2
    assert "r1/epoch-0002.json" in html and '<figure class="spectrum">' in html


def _summary(tmp_path: Path) -> dict:
    from fathom.stats import RunRecord, summarise_study

    recs = [
        RunRecord(
            recipe=recipe,
            seed=seed,
            lr=0.01,
            status="complete",
            classes=10,
            selected={"test_acc": 0.9 + 0.01 * seed, "test_ce": 0.3, "val_ce": 0.3, "epoch": 3},
            final={"test_acc": 0.91 + d, "test_ce": 0.31, "val_ce": 0.3, "epoch": 4},
            fit_acc_final=1.0,
            training_clock_s=10.0 + seed,
            elapsed_s=12.0 + seed,
            curve=[(0, 0.0, 1.0, 0.1), (4, 10.0, 12.0, 0.95)],
        )
        for recipe, d in (("residual", 0.0), ("sd_constant", 0.002))
        for seed in (1, 2, 3)
    ]
    return summarise_study(recs, reference="residual", target_val_acc=0.9)


def test_optional_sections_and_figures(study: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    grid = [
        {
            "recipe": "residual",
            "lr": lr,
            "status": "complete",
            "val_ce": 0.3 + lr,
            "selected_epoch": 4,
            "diverged_epoch": None,
        }
        for lr in (0.01, 0.1)
    ]
    runner_summary = {
        "study": "quick",
        "description": "tiny",
        "scale_down": ["widths x 0.1"],
        "devices": ["cpu"],
        "tuning": {
            "enabled": True,
            "seed": 1,
            "lrs": [0.01, 0.1],
            "rule": "min val CE",
            "grid": grid,
            "selected_lr": {"residual": 0.01},
        },
        "runs": {
            "main-residual-s1": {"recipe": "residual", "seed": 1, "lr": 0.01, "status": "complete"}
        },
        "stats": _summary(tmp_path),
    }
    (study / "summary.json").write_text(json.dumps(runner_summary))
    (study / "summary.md").write_text("Study summary table from the study engineer.\n")
    masks = [
        {
            "mask": f"{m:03b}",
            "kept": bin(m).count("1"),
            "macs": 1000 - 100 * m,
            "val": {"acc": 0.9, "ce": 0.3, "damage": 0.1 * m},
            "test": {"acc": 0.8, "ce": 0.4, "damage": 0.2 * m},
        }
        for m in range(8)
    ]
    ckpt = {"epoch": 3, "masks": masks, "by_size": {"1": {"damage": 0.5}}}
    audit = {
        "runs": [
            {
                "run_id": "residual-s101",
                "arm": "residual",
                "recipe": "residual",
                "seed": 101,
                "checkpoints": {"selected": ckpt},
            }
        ],
        "aggregate": {
            "resilience": {"digit_1": {"mean": 0.9, "n": 3}, "digit_4": {"mean": 0.8, "n": 3}}
        },
    }
    (study / "audit").mkdir()
    (study / "audit" / "audit.json").write_text(json.dumps(audit))
    curv = study / "residual-s101" / "curvature"
    curv.mkdir()
    (curv / "epoch-0004.json").write_text(
        json.dumps({"epoch": 4, "kfac": {"A_eigenvalues": [2.0**-i for i in range(12)]}})
    )
    out = build_report(study)
    html = expanded(out.html.read_text())
    assert "Paired differences (recipe − residual)" in html and "Tuning grid (seed 1)" in html
    assert "widths x 0.1" in html and "main-residual-s1" in html
    assert "Layer-removal audit" in html and 'class="table-filter"' in html
    assert "<th>val.damage (nats)</th>" in html and "<th>test.acc (%)</th>" in html
    assert "digit_4" not in html and "/audit/audit.json" in html  # linked, not inlined
    assert (
        "residual-s101/epoch-0004.json" in html and "A_eigenvalues (12 values, log10 scale)" in html
    )
    names = sorted(p.name for p in out.figures)
    assert names == ["learning_curves.png", "mask_damage.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in out.figures)
    md = out.summary_md.read_text()
    assert "](figures/learning_curves.png)" in md and "](figures/mask_damage.png)" in md
    assert "Study summary table from the study engineer." in md and "awkward-s7" in md
    assert (
        not (study / "summary.md").read_text().startswith("# Fathom report")
    )  # study's file untouched


def test_corrupt_optional_input_is_a_warning(study: Path) -> None:
    (study / "summary.json").write_text("{broken")
    out = build_report(study, with_figures=False)
    assert any("summary.json does not parse" in n for n in out.notes)
    assert "summary.json does not parse" in out.html.read_text()


def test_missing_matplotlib_names_the_extra(study: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(FathomError, match=r"\.\[plot\]"):
        build_report(study)
    assert build_report(study, with_figures=False).html.exists()


def test_payload_order_and_cohorts(tmp_path: Path) -> None:
    from synthetic_runs import synthetic_history, write_run

    write_study(tmp_path / "s", recipes=("plain",), seeds=(5,), epochs=(0, 2))
    write_run(
        tmp_path / "s" / "tune-plain-lr0.1-s1",
        study="s",
        recipe="plain",
        seed=1,
        lr=0.1,
        rows=synthetic_history(1, [0, 1]),
        phase="tuning",
    )
    data = explorer_payload(load_runs(tmp_path / "s"))
    assert data["defaultField"] == "{split}/acc"
    assert data["fields"][0] == "clock/elapsed_s" and data["fields"].index("{split}/acc") < data[
        "fields"
    ].index("param/disp/{layer}")
    assert sorted(r["cohort"] for r in data["runs"]) == ["plain lr=0.01", "plain lr=0.1 (tuning)"]


def test_cli_report(study: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    assert main(["report", str(study), "--out", str(out), "--no-figures"]) == 0
    text = capsys.readouterr().out
    assert (out / "report.html").exists() and "flagged: awkward-s7" in text


def test_markup_in_names_is_escaped(tmp_path: Path) -> None:
    from synthetic_runs import synthetic_history, write_run

    name = "x<!--<script><b>bold"
    write_run(
        tmp_path / "s" / name,
        study="s",
        recipe="plain",
        seed=1,
        lr=0.1,
        rows=synthetic_history(1, [0, 1]),
    )
    html = build_report(tmp_path / "s", with_figures=False).html.read_text()
    assert "<b>bold" not in html and "&lt;b&gt;bold" in html
    assert payload_of(tmp_path / "s" / "report" / "report.html")["runs"][0]["id"] == name


verdict_names = st.sampled_from(VERDICTS)
ranking_verdicts = st.sampled_from(get_args(RankingVerdict))  # a decision of the ranking rule


@settings(max_examples=60, deadline=None)
@example(  # a text printed undecided, then decided: once, at its first place, decided
    sentences=[("s5", [NOT_ESTABLISHED], []), ("s0", [], []), ("s5", [], [])],
    decisions=("differs", "differs"),
)
@given(
    sentences=st.lists(
        st.tuples(
            st.sampled_from([f"s{i}" for i in range(8)]),  # repeated texts are shown once
            st.lists(verdict_names, max_size=3),
            st.lists(st.sampled_from(["d0", "d1"]), max_size=2),
        ),
        max_size=12,
    ),
    decisions=st.tuples(ranking_verdicts, ranking_verdicts),
)
def test_split_sentences_partitions_by_the_models_verdicts(sentences, decisions) -> None:
    """Undecided exactly when the sentence claims or decides something and every verdict is
    "not established"; every text once, at its first print (decided if any print is)."""
    from fathom.report.sections import split_sentences

    results = {
        "sentences": [
            {"text": t, "claims": [{"comparison": "c", "verdict": v} for v in vs], "decisions": ds}
            for t, vs, ds in sentences
        ],
        "decisions": [
            {"id": f"d{i}", "rule": "checkpoint ranking", "verdict": v}
            for i, v in enumerate(decisions)
        ],
    }
    decided, undecided = split_sentences({"results": results})
    idle = {}
    for t, vs, ds in sentences:
        every = [*vs, *(decisions[int(d[1])] for d in ds)]
        idle.setdefault(t, []).append(bool(every) and all(v == NOT_ESTABLISHED for v in every))
    assert decided == [t for t in dict.fromkeys(s[0] for s in sentences) if not all(idle[t])]
    assert undecided == [t for t in dict.fromkeys(s[0] for s in sentences) if all(idle[t])]


@settings(max_examples=80, deadline=None)
@given(text=st.text(st.sampled_from("0123456789.+-−±[], <>&pnats%"), max_size=40))
@example(text="+0.35 pp [-3.66 pp, +4.35 pp]")
@example(text="92.78 ± 0.37%")
def test_wrappable_cells_read_as_their_text(text: str) -> None:
    """A main-table cell may break before its interval or SD and after a comma, and reads
    (tags dropped, entities unescaped) exactly as the text."""
    import html as htmllib

    from fathom.report.tables import wrappable

    out = wrappable(text)
    assert htmllib.unescape(re.sub(r"<[^>]+>", "", out)) == text
    parts = re.findall(r"<span class='nw'>(.*?)</span>", out)
    assert all(" [" not in p and " ± " not in p and ", " not in p for p in parts)
