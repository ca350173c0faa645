"""The SQLite run registry: concurrent writers, locked and corrupt files."""

from __future__ import annotations

import sqlite3
import subprocess
import sys

import pytest

from fathom.errors import FathomError
from fathom.study.registry import COLUMN_NAMES, Registry


def row(run_id: str, study: str = "s", **over) -> dict:
    base = dict.fromkeys(COLUMN_NAMES)
    base.update(
        run_id=run_id,
        study=study,
        phase="main",
        recipe="residual",
        seed=101,
        lr=0.01,
        status="complete",
        directory=f"/runs/{study}/{run_id}",
    )
    base.pop("updated_at")
    return {**base, **over}


WRITER = """
import sys
from fathom.study.registry import Registry, COLUMN_NAMES
reg = Registry(sys.argv[1])
for i in range(int(sys.argv[3])):
    r = dict.fromkeys(COLUMN_NAMES)
    r.update(run_id=f"{sys.argv[2]}-{i}", study="s", phase="main", recipe="residual", seed=i,
             lr=0.01, status="complete", directory="/x", final_test_acc=i / 1000)
    r.pop("updated_at")
    reg.upsert([r])
"""


def test_two_processes_write_at_once(tmp_path):
    path = tmp_path / "registry.sqlite"
    Registry(path)
    n = 150
    procs = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(path), tag, str(n)])
        for tag in ("a", "b")
    ]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    rows = Registry(path).query(study="s")
    assert len(rows) == 2 * n
    assert {r["run_id"] for r in rows} == {f"{t}-{i}" for t in "ab" for i in range(n)}
    con = sqlite3.connect(path)
    assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert con.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_upsert_replaces_whole_rows_and_filters(tmp_path):
    reg = Registry(tmp_path / "r.sqlite")
    reg.upsert([row("a", status="running"), row("b", seed=102, status="diverged")])
    reg.upsert([row("a", final_test_acc=0.9)])
    assert reg.get("a")[0]["status"] == "complete" and reg.get("a")[0]["final_test_acc"] == 0.9
    assert [r["run_id"] for r in reg.query(status="diverged")] == ["b"]
    assert [r["run_id"] for r in reg.query(seed=101)] == ["a"]
    with pytest.raises(FathomError, match="unknown registry filters"):
        reg.query(colour="red")


def test_locked_registry_is_a_clear_error_and_writes_nothing(tmp_path):
    path = tmp_path / "r.sqlite"
    Registry(path).upsert([row("kept")])
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(FathomError, match="is locked"):
            Registry(path, busy_timeout_s=0.2).upsert([row("new-1"), row("new-2")])
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert [r["run_id"] for r in Registry(path).query()] == ["kept"]


def test_corrupt_registry_is_a_clear_error_and_left_untouched(tmp_path):
    path = tmp_path / "registry.sqlite"
    garbage = b"this is not a database " * 200
    path.write_bytes(garbage)
    with pytest.raises(FathomError, match="is corrupt.*Move it aside"):
        Registry(path)
    assert path.read_bytes() == garbage


def test_row_missing_columns_is_refused(tmp_path):
    reg = Registry(tmp_path / "r.sqlite")
    with pytest.raises(FathomError, match="lacks columns"):
        reg.upsert([{"run_id": "x"}])
    assert reg.query() == []


def test_paths_are_relative_to_the_runs_folder_and_survive_a_move(tmp_path):
    import shutil
    from datetime import datetime

    runs = tmp_path / "runs"
    (runs / "s" / "r1").mkdir(parents=True)
    Registry(runs / "registry.sqlite").upsert([row("r1", directory=str(runs / "s" / "r1"))])
    shutil.move(runs, tmp_path / "moved")
    reg = Registry(tmp_path / "moved" / "registry.sqlite")
    (r,) = reg.get("r1")
    assert r["directory"] == "s/r1"
    assert reg.run_dir(r) == tmp_path / "moved" / "s" / "r1" and reg.run_dir(r).is_dir()
    stamp = datetime.fromisoformat(r["updated_at"])
    assert stamp.utcoffset().total_seconds() == 0 and r["updated_at"].endswith("+00:00")


def test_a_run_outside_the_runs_folder_keeps_its_absolute_path(tmp_path):
    reg = Registry(tmp_path / "runs" / "registry.sqlite")
    reg.upsert([row("r1", directory=str(tmp_path / "elsewhere" / "r1"))])
    assert reg.get("r1")[0]["directory"] == str((tmp_path / "elsewhere" / "r1").resolve())


def test_a_schema_1_registry_is_converted_on_opening(tmp_path):
    """Schema 1 stored absolute directories and Unix times (REAL)."""
    path = tmp_path / "runs" / "registry.sqlite"
    path.parent.mkdir()
    old_columns = ", ".join(
        f"{c} {'REAL' if c in ('lr', 'updated_at') else 'TEXT'}" for c in COLUMN_NAMES
    )
    con = sqlite3.connect(path)
    con.execute(f"CREATE TABLE runs ({old_columns}, PRIMARY KEY (study, run_id))")
    old = {**row("r1", directory=str(tmp_path / "runs" / "s" / "r1")), "updated_at": 1764627003.0}
    con.execute(
        f"INSERT INTO runs VALUES ({', '.join('?' for _ in COLUMN_NAMES)})",
        [old[c] for c in COLUMN_NAMES],
    )
    con.commit()
    con.close()
    (r,) = Registry(path).get("r1")
    assert r["directory"] == "s/r1" and r["updated_at"] == "2025-12-01T22:10:03+00:00"
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone() == (2,)


def test_runs_json_names_fractions_and_adds_percent():
    from fathom.study.runs_cli import row_json

    shown = row_json(row("a", selected_test_acc=0.9182, final_test_acc=None, final_test_ce=0.25))
    assert shown["selected_test_acc_fraction"] == 0.9182
    assert shown["selected_test_acc_pct"] == pytest.approx(91.82)
    assert shown["final_test_acc_fraction"] is None and shown["final_test_acc_pct"] is None
    assert shown["final_test_ce"] == 0.25 and "selected_test_acc" not in shown


def test_a_run_of_fathom_train_is_indexed_and_found_by_runs_list_and_show(tmp_path, capsys):
    """``fathom train`` indexes its run (phase ``train``, the config's recipe, seed and rate)
    in RUNS_DIR/registry.sqlite: ``runs list`` lists it, ``runs show`` prints its row."""
    import json

    from fathom import cli

    runs = tmp_path / "runs"
    sets = ("model.width_mult=0.02", "data.fit_subset=64", "data.eval_subset=64")
    sets += ("optim.epochs=1", "device=cpu", "seed=7", "optim.lr=0.05", "model.recipe=plain")
    argv = ["train", "--runs-dir", str(runs), "--name", "t1", "--quiet"]
    assert cli.main([*argv, *(a for s in sets for a in ("--set", s))]) == 0
    capsys.readouterr()
    (stored,) = Registry(runs / "registry.sqlite").query()
    assert (stored["run_id"], stored["phase"], stored["status"]) == ("t1", "train", "complete")
    assert (stored["recipe"], stored["seed"], stored["lr"]) == ("plain", 7, 0.05)
    assert stored["epochs_completed"] == 1 and stored["final_params"]
    assert cli.main(["runs", "list", "--runs-dir", str(runs)]) == 0
    out = capsys.readouterr().out
    assert "t1" in out and "complete" in out and "not listed" not in out
    assert cli.main(["runs", "show", "t1", "--runs-dir", str(runs)]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["status"] == "complete" and shown["state"] == "complete, 1 of 1 epochs"
    assert "registry_status" not in shown


def test_runs_list_and_show_say_the_state_of_the_directory_not_a_stale_row(tmp_path, capsys):
    """A row indexed ``running`` whose writer died (no process holds the lock) is shown
    ``interrupted`` with the command that continues it; ``--status`` filters on that state."""
    import json

    from fathom import cli
    from fathom.study.records import run_row
    from synthetic_runs import synthetic_history, write_run

    runs = tmp_path / "runs"
    run = runs / "s" / "r"
    write_run(run, study="s", recipe="plain", seed=1, lr=0.1, rows=synthetic_history(1, [0, 1]))
    manifest = json.loads((run / "manifest.json").read_text())
    Registry(runs / "registry.sqlite").upsert([{**run_row(run), "status": "running"}])
    assert manifest["status"] == "complete"
    assert cli.main(["runs", "show", "r", "--runs-dir", str(runs)]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["status"], shown["registry_status"]) == ("complete", "running")
    assert cli.main(["runs", "list", "--runs-dir", str(runs), "--status", "running"]) == 0
    assert "0 runs match" in capsys.readouterr().out
    write_run(run, study="s", recipe="plain", seed=1, lr=0.1, rows=[], status="running")
    assert cli.main(["runs", "list", "--runs-dir", str(runs), "--status", "interrupted"]) == 0
    out = capsys.readouterr().out
    assert "r: interrupted, 0 of" in out and f"fathom train --resume {run}" in out
    assert "killed or crashed" in out
