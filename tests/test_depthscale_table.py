"""The results table feeds the statistics module's verdict: the log's table cannot claim."""

from __future__ import annotations

import hashlib
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fathom.depthscale.config import make_config, run_config
from fathom.depthscale.table import RunRecord, build_table, read_runs, render_markdown, write_table
from fathom.errors import FathomError
from fathom.rundir import RunDir

# the original log (CIFAR-100, one seed): final test accuracies per depth
LOG_VANILLA = {4: 0.614, 8: 0.522, 12: 0.102, 16: 0.037, 20: 0.010}
LOG_KAPPA = {4: 1.2e9, 8: 1.4e9, 12: 2.5e7, 16: 2.4e7, 20: 6.5e7}


def log_like_records() -> list[RunRecord]:
    recs = []
    for depth, acc in LOG_VANILLA.items():
        recs.append(
            RunRecord(
                depth, "vanilla", 0, "complete", acc, None, kappa=LOG_KAPPA[depth], n_test=10_000
            )
        )
        recs.append(
            RunRecord(
                depth,
                "Lyapunov",
                0,
                "complete",
                0.010,
                None,
                lyapunov=1.9 + depth / 40,
                n_test=10_000,
            )
        )
    return recs


def test_log_like_table_gives_no_conclusion_never_better_scaling():
    table = build_table(log_like_records(), classes=100, dataset="cifar100")
    v = table.verdict
    assert v.verdict == "no conclusion"
    assert v.sentence == "no conclusion: the Lyapunov arm failed to train at every depth"
    assert all(c["Lyapunov"] == "failed" for c in v.cells.values())
    assert v.cells[20]["vanilla"] == "failed" and v.cells[4]["vanilla"] == "trained"
    md = render_markdown(table)
    assert "better" not in md.lower()
    assert "Lyapunov s0: at_chance" in md
    # every row has the failure column filled for the Lyapunov arm
    assert all(any("Lyapunov" in f for f in r["failures"]) for r in table.rows)


def test_both_arms_train_gives_a_computed_claim_with_an_interval():
    recs = []
    accs = {
        ("vanilla", 4): (0.60, 0.62),
        ("vanilla", 8): (0.50, 0.52),
        ("Lyapunov", 4): (0.60, 0.61),
        ("Lyapunov", 8): (0.58, 0.60),
    }
    for (arm, depth), pair in accs.items():
        for seed, acc in enumerate(pair):
            recs.append(
                RunRecord(depth, arm, seed, "complete", acc, 0.9, fit_acc=0.9, n_test=10_000)
            )
    table = build_table(recs, classes=10)
    v = table.verdict
    # the level (mean over depths of Lyapunov − vanilla), per seed: +4.0 and +3.5 pp; the
    # change from depth 4 to 8 of that difference: +9.0 and +8.0 pp; two seeds, Holm over 5
    # (level, change, slope, two depths). The old rule called the level "scaling".
    lv, change = v.level_contrast, v.change
    assert lv.estimate == pytest.approx(3.75) and change.estimate == pytest.approx(8.5)
    assert v.slope.estimate == pytest.approx(8.5 / 4)
    assert lv.low is not None and lv.low < lv.estimate < lv.high and lv.family_size == 5
    assert v.level == ("better across depths" if lv.low > 0.5 else "not established")
    assert table.rows[0]["delta_acc"] == pytest.approx(-0.005)
    md = render_markdown(table)
    assert f"**Level (Lyapunov against vanilla across the depths):** {v.level}" in md
    assert f"**Scaling (how their difference changes with depth):** {v.trend}" in md
    one_seed = build_table([r for r in recs if r.seed == 0], classes=10).verdict
    assert (one_seed.verdict, one_seed.level, one_seed.trend) == (
        "judged",
        *["not established"] * 2,
    )
    no_size = [RunRecord(**{**r.__dict__, "n_test": None}) for r in recs]
    assert "test-set size is unknown" in build_table(no_size, classes=10).verdict.sentence


def test_kappa_notes_only_from_defined_kappa():
    table = build_table(log_like_records(), classes=100)
    assert len(table.conditioning) == 5  # vanilla κ > 1e6 at every depth; Lyapunov κ unknown
    assert all("vanilla" in c for c in table.conditioning)


def write_sealed(run, manifest: dict, rows: list[dict]) -> None:
    """``manifest.json`` sealed with the digest of ``history.jsonl`` (as a writer leaves it)."""
    from fathom.rundir.manifest import seal

    text = "".join(json.dumps(r) + "\n" for r in rows)
    digest = hashlib.sha256(text.encode()).hexdigest()
    history = {"bytes": len(text.encode()), "rows": len(rows), "sha256": digest}
    (run / "history.jsonl").write_text(text)
    sealed = seal({**manifest, "integrity": {"history": history}})
    (run / "manifest.json").write_text(json.dumps(sealed))


def test_reads_run_directories(tmp_path):
    run = tmp_path / "d04-vanilla-s0"
    run.mkdir()
    cfg = run_config(make_config("quick"), 4, "vanilla", 0, tmp_path.name)
    manifest = {
        "format": 2,
        "kind": "run",
        "run_id": run.name,
        "status": "complete",
        "config": cfg.model_dump(mode="json"),
        "data": {"dataset": "mnist", "info": {"classes": 10}, "sizes": {"test": 10_000}},
        "selected": {"epoch": 1, "val_ce": 2.0},
    }
    rows = [
        {"epoch": 0, "val/acc": 0.1, "test/acc": 0.1, "fit/ce": 2.3},
        {
            "epoch": 1,
            "val/acc": 0.5,
            "test/acc": 0.45,
            "fit/ce": 1.2,
            "fit/acc": 0.6,
            "lyap/maximal": -0.2,
            "jac/kappa": 12.0,
            "grad_norm/total": 0.7,
        },
    ]
    write_sealed(run, manifest, rows)
    (rec,) = read_runs(tmp_path)
    assert (rec.test_acc, rec.fit_ce, rec.lyapunov, rec.kappa, rec.grad_norm) == (
        0.45,
        1.2,
        -0.2,
        12.0,
        0.7,
    )
    assert rec.n_test == 10_000
    table = write_table(tmp_path)
    assert table.verdict.verdict == "no comparison"
    assert "1 depth(s)" in table.verdict.sentence
    with pytest.raises(FathomError, match="no run directories"):
        read_runs(tmp_path / "d04-vanilla-s0")
    other = tmp_path / "plain-run"
    other.mkdir()
    write_sealed(other, {**manifest, "config": {"name": "plain-run"}}, rows)
    with pytest.raises(FathomError, match="not a depth-scaling run"):
        read_runs(tmp_path)


def _one_run(tmp_path):
    run = tmp_path / "d04-vanilla-s0"
    run.mkdir()
    cfg = run_config(make_config("quick"), 4, "vanilla", 0, tmp_path.name)
    manifest = {
        "format": 2,
        "kind": "run",
        "run_id": run.name,
        "status": "complete",
        "config": cfg.model_dump(mode="json"),
        "data": {"dataset": "mnist", "info": {"classes": 10}},
        "selected": {"epoch": 1, "val_ce": 2.0},
    }
    rows = [
        {"epoch": 0, "val/acc": 0.1, "test/acc": 0.1, "fit/ce": 2.3},
        {"epoch": 1, "val/acc": 0.5, "test/acc": 0.45, "fit/ce": 1.2, "fit/acc": 0.6},
    ]
    write_sealed(run, manifest, rows)
    return run


def test_a_changed_test_accuracy_never_reaches_the_table(tmp_path):
    run = _one_run(tmp_path)
    path = run / "history.jsonl"
    path.write_text(path.read_text().replace('"test/acc": 0.45', '"test/acc": 0.95'))
    with pytest.raises(FathomError, match=r"d04-vanilla-s0: history.jsonl fails its digest check"):
        read_runs(tmp_path)
    with pytest.raises(FathomError, match="table and its verdict are not computed"):
        write_table(tmp_path)
    assert not (tmp_path / "table.json").exists()


@pytest.mark.parametrize("damage", ["deleted", "emptied", "unsealed"])
def test_a_missing_or_unverified_history_is_refused(tmp_path, damage):
    run = _one_run(tmp_path)
    if damage == "deleted":
        (run / "history.jsonl").unlink()
    elif damage == "emptied":
        (run / "history.jsonl").write_text("")
    else:
        m = json.loads((run / "manifest.json").read_text())
        del m["integrity"]
        (run / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(FathomError, match="fail their integrity checks"):
        read_runs(tmp_path)


def test_a_history_byte_that_is_not_utf8_is_refused_not_a_traceback(tmp_path):
    """Found by the byte-flip property: 0x80 at byte 0 raised UnicodeDecodeError."""
    run = _one_run(tmp_path)
    path = run / "history.jsonl"
    path.write_bytes(b"\xfb" + path.read_bytes()[1:])
    with pytest.raises(FathomError, match="history.jsonl line 1 is torn"):
        read_runs(tmp_path)


@settings(max_examples=30)
@given(st.data())
def test_any_byte_flip_of_the_history_is_refused(tmp_path_factory, data):
    root = tmp_path_factory.mktemp("flip")
    run = _one_run(root)
    path = run / "history.jsonl"
    raw = bytearray(path.read_bytes())
    i = data.draw(st.integers(0, len(raw) - 1))
    raw[i] ^= data.draw(st.integers(1, 255))
    path.write_bytes(bytes(raw))
    with pytest.raises(FathomError):
        read_runs(root)


def test_a_legacy_depth_scaling_manifest_opens_and_the_table_names_it(tmp_path):
    """Format 2 manifests of kind ``depth_scaling`` (the runner before it wrote ``run``
    directories) still open with their config as recorded; the table refuses them by name."""
    run = tmp_path / "d04-vanilla-s0"
    run.mkdir()
    config = {"depth": 4, "arm": "vanilla", "seed": 0, "lyap_reg": 0.0}
    manifest = {"format": 2, "kind": "depth_scaling", "run_id": run.name, "status": "complete"}
    write_sealed(run, {**manifest, "config": config}, [{"epoch": 0, "val/acc": 0.1}])
    rd = RunDir(run)
    assert (rd.kind, rd.config) == ("depth_scaling", config)
    with pytest.raises(FathomError, match="manifest format 2 .kind 'depth_scaling'.*Rerun"):
        read_runs(tmp_path)
