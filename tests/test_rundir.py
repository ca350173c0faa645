"""The run-directory contract (fathom.rundir): digests, locks, torn files, source changes.

Each test reproduces one way a run directory used to lose or mix data and checks that it is now detected, refused or reported.
"""

from __future__ import annotations

import errno
import json
import time
from pathlib import Path

import pytest

from conftest import synthetic_splits, tiny_config
from fathom.base.io import read_jsonl
from fathom.errors import FathomError
from fathom.rundir import DirLock, RunDir, RunWriter, load_resume, seal
from fathom.train.loop import resume, train


def interrupted(tmp_path: Path, splits, at_epoch: int = 1, epochs: int = 4) -> Path:
    """A run stopped (like Ctrl-C) at the end of epoch ``at_epoch``, before its checkpoints:
    its resume state is that of epoch ``at_epoch - 1``."""

    def stop(event: str, info: dict) -> None:
        if event == "epoch_end" and info["epoch"] == at_epoch:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(
            tiny_config(**{"optim.epochs": epochs}), tmp_path / "run", splits=splits, progress=stop
        )
    return tmp_path / "run"


def hold_lock(forked, path: Path, study: bool = False):
    """Another process (forked from this one, :mod:`forked`) holding the lock of ``path``
    until killed."""

    def hold() -> None:
        from fathom.rundir import DirLock, study_lock

        lock = (study_lock(path) if study else DirLock(path)).acquire()
        print("held", flush=True)
        time.sleep(120)
        del lock

    proc = forked(hold)
    wait_for_line(proc, "held")
    return proc


def wait_for_line(proc, prefix: str, timeout: float = 120) -> str:
    """The first line of ``proc``'s stdout starting with ``prefix`` (waiting for it)."""
    deadline = time.monotonic() + timeout
    while True:
        for line in proc.out.read_text().splitlines():
            if line.startswith(prefix):
                return line
        assert proc.poll() is None, f"exited {proc.returncode}: {proc.output()}"
        assert time.monotonic() < deadline, f"no line {prefix!r} in {timeout} s"
        time.sleep(0.01)


# -- defect 1: a flipped byte in the resume state ---------------------------------------------
def test_flipped_byte_in_resume_state_is_detected(tmp_path, splits):
    run = interrupted(tmp_path, splits)
    path = run / "checkpoints" / "resume.safetensors"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01  # inside the tensor data: safetensors alone accepts it
    path.write_bytes(bytes(data))
    with pytest.raises(FathomError, match="resume state .* fails its digest check"):
        resume(run, splits=splits)
    assert RunDir(run).status == "interrupted"  # nothing was written by the refused resume
    with pytest.raises(FathomError, match="fails its digest check"):
        load_resume(path)


def test_flipped_byte_in_an_epoch_checkpoint_stops_the_resume(tmp_path, splits):
    run = interrupted(tmp_path, splits, at_epoch=2)
    path = run / "checkpoints" / "epoch-0001.safetensors"
    data = bytearray(path.read_bytes())
    data[20] ^= 0x01  # in the safetensors header: the tensors alone still hash the same
    path.write_bytes(bytes(data))
    with pytest.raises(FathomError, match="epoch-0001.safetensors' fails its hash check"):
        resume(run, splits=splits)
    problems = RunDir(run).problems(deep=True)
    assert any("epoch-0001" in p for p in problems), problems


# -- defect 2: two writers -------------------------------------------------------------------
def test_second_writer_is_refused_naming_the_holder(tmp_path, splits, forked):
    run = tmp_path / "run"
    holder = hold_lock(forked, run)
    try:
        with pytest.raises(FathomError, match=f"PID {holder.pid}"):
            train(tiny_config(), run, splits=splits)
    finally:
        holder.kill()
        holder.wait()
    assert not (run / "manifest.json").exists()
    # the holder died (kill -9 semantics): its lock is stale, taken over and recorded
    res = train(tiny_config(), run, splits=splits)
    m = RunDir(res.run_dir).manifest
    assert {"event": "stale_lock_taken_over", "pid": holder.pid} in m["recovery"]
    assert [r["epoch"] for r in RunDir(run).history()] == [0, 1, 2, 3]


def test_two_resumes_cannot_interleave(tmp_path, splits, forked):
    run = interrupted(tmp_path, splits)
    holder = hold_lock(forked, run)  # stands for a first `fathom train --resume` still running
    try:
        with pytest.raises(
            FathomError, match=f"locked by another fathom process \\(PID {holder.pid}"
        ):
            resume(run, splits=splits)
    finally:
        holder.kill()
        holder.wait()
    res = resume(run, splits=splits)
    assert res.status == "complete"
    assert [r["epoch"] for r in res.history] == [0, 1, 2, 3, 4]
    assert not RunDir(run).problems(deep=True)


def test_concurrent_train_into_one_directory_leaves_the_first_intact(tmp_path, splits, forked):
    run = tmp_path / "run"

    def first_writer() -> None:  # in a process forked from this one (:mod:`forked`)
        def slow(event, info):
            if event == "epoch_end":
                print("epoch", info["epoch"], flush=True)
                time.sleep(0.3)

        train(tiny_config(**{"optim.epochs": 6}), run, splits=synthetic_splits(), progress=slow)

    first = forked(first_writer)
    wait_for_line(first, "epoch 1")
    with pytest.raises(FathomError, match=f"PID {first.pid}"):
        train(tiny_config(**{"optim.epochs": 6}), run, splits=splits)
    assert first.wait(timeout=120) == 0, first.output()
    rd = RunDir(run)
    assert rd.status == "complete" and not rd.problems(deep=True)
    assert [r["epoch"] for r in rd.history()] == list(range(7))


# -- defect 4: torn history lines ----------------------------------------------------------
def tear_last_line(run: Path) -> None:
    path = run / "history.jsonl"
    data = path.read_bytes()
    path.write_bytes(data[:-10])  # the last row loses its end (and its newline)


def test_torn_line_of_a_complete_run_is_reported(tiny_run_copy):
    from fathom.report.runs import load_runs

    tear_last_line(tiny_run_copy)
    problems = RunDir(tiny_run_copy).history_problems()
    assert any("line 4 is torn" in p for p in problems), problems
    assert any("shorter than its writer recorded" in p for p in problems), problems
    (run_data,) = load_runs(tiny_run_copy)
    assert run_data.flagged_lines == [4]
    assert any("shorter than its writer recorded" in r for r in run_data.flag_reasons)


def test_resume_truncates_a_torn_tail_and_records_it(tmp_path, splits):
    run = interrupted(tmp_path, splits, at_epoch=2)
    with open(run / "history.jsonl", "a") as f:
        f.write('{"epoch": 3, "val/acc": 0.')  # a kill inside the next row's write
    stray = run / "checkpoints" / ".resume.safetensors.abc.tmp"
    stray.write_bytes(b"half a file")  # a kill inside an atomic write
    assert any("leftover" in p for p in RunDir(run).problems())
    res = resume(run, splits=splits)
    m = RunDir(run).manifest
    events = {e["event"]: e for e in m["recovery"]}
    assert events["history_lines_unreadable"]["lines"] == [4]
    assert events["removed_temp_files"]["files"] == ["checkpoints/.resume.safetensors.abc.tmp"]
    assert not stray.exists()
    assert [r["epoch"] for r in res.history] == [0, 1, 2, 3, 4]
    assert not RunDir(run).problems(deep=True)


def test_appended_rows_from_another_writer_are_reported(tiny_run_copy):
    with open(tiny_run_copy / "history.jsonl", "a") as f:
        f.write(json.dumps({"epoch": 2, "diverged": True}) + "\n")
    problems = RunDir(tiny_run_copy).history_problems()
    assert any("appended by another writer" in p for p in problems), problems


# -- defect 5: source change and ignored --set on resume -----------------------------------
def test_source_change_on_resume_is_refused_unless_allowed(tmp_path, splits, monkeypatch):
    run = interrupted(tmp_path, splits)
    original = RunDir(run).manifest["source_hash"]
    monkeypatch.setattr("fathom.train.loop.source_hash", lambda: "f" * 64)
    with pytest.raises(FathomError, match="source changed .* --allow-source-change"):
        resume(run, splits=splits)
    res = resume(run, allow_source_change=True, splits=splits)
    m = RunDir(run).manifest
    assert res.status == "complete"
    assert m["source_hash"] == original  # the hash the run started with is kept
    assert m["source_changes"] == [{"from_epoch": 0, "source_hash": "f" * 64}]


def test_set_with_resume_is_refused(tmp_path, splits, capsys):
    from fathom.cli import main

    run = interrupted(tmp_path, splits)
    assert main(["train", "--resume", str(run), "--set", "optim.lr=0.5", "--quiet"]) == 2
    assert "--set cannot change a run being resumed" in capsys.readouterr().err
    assert RunDir(run).status == "interrupted"


# -- defect 8: clear errors ----------------------------------------------------------------
def enospc_on(monkeypatch, match: str) -> None:
    """Make atomic writes of files whose path contains ``match`` fail with ENOSPC."""
    import fathom.rundir.writer as writer

    real = writer.atomic_write_bytes

    def full(path, data):
        if match in str(path):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, data)

    import fathom.base.io
    import fathom.rundir.files

    for module in (writer, fathom.rundir.files, fathom.base.io):
        monkeypatch.setattr(module, "atomic_write_bytes", full)


def test_disk_full_during_train_is_reported_as_enospc(tmp_path, splits, monkeypatch, capsys):
    enospc_on(monkeypatch, "epoch-0002")
    with pytest.raises(FathomError, match="ENOSPC .* the disk is full"):
        train(tiny_config(), tmp_path / "run", splits=splits)
    m = RunDir(tmp_path / "run").manifest
    assert m["status"] == "failed" and "ENOSPC" in m["status_reason"]
    assert m["failure"] == {"type": "FathomError", "errno": "ENOSPC", "environment": True}
    assert not RunDir(tmp_path / "run").problems()  # what was written is intact


def test_a_file_where_a_directory_is_expected(tmp_path, splits, capsys):
    from fathom.cli import main

    (tmp_path / "runs").write_text("not a directory")
    rc = main(["train", "--runs-dir", str(tmp_path / "runs"), "--set", "model.widths=[8,8]"])
    err = capsys.readouterr().err
    assert rc == 2 and "is a file, not a directory" in err and "Traceback" not in err
    (tmp_path / "r2").mkdir()
    (tmp_path / "r2" / "run").write_text("a file")
    with pytest.raises(FathomError, match="is a file, not a run directory"):
        train(tiny_config(), tmp_path / "r2" / "run", splits=splits)


def test_audit_of_an_interrupted_run_says_it_is_incomplete(tmp_path, splits):
    from fathom.audit.checkpoint import AuditSettings
    from fathom.audit.run import audit_runs

    run = interrupted(tmp_path, splits)  # cut short in epoch 1: epoch 0 is the last complete
    with pytest.raises(FathomError, match="is incomplete .* 0 of 4 epochs"):
        audit_runs(run, AuditSettings(checkpoints=("final",), router=False), splits=splits)


def test_report_mentions_a_corrupt_checkpoint(tiny_run_copy):
    from fathom.report.runs import load_runs

    path = tiny_run_copy / "checkpoints" / "selected.safetensors"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))
    (run_data,) = load_runs(tiny_run_copy)
    assert any("selected.safetensors" in r and "hash check" in r for r in run_data.flag_reasons)


# -- the writer and lock on their own --------------------------------------------------------
def test_writer_refuses_without_lock_and_lock_is_exclusive_in_one_process(tmp_path):
    w = RunWriter(tmp_path / "r").acquire()
    with pytest.raises(FathomError, match=f"PID {__import__('os').getpid()}"):
        DirLock(tmp_path / "r").acquire()  # a second writer, even in the same process
    w.close()
    with pytest.raises(FathomError, match="holds no lock"):
        w.row({"epoch": 0})
    DirLock(tmp_path / "r").acquire().release()


def test_hand_edited_manifest_fails_its_digest_and_reseal_restores_it(tiny_run_copy):
    path = tiny_run_copy / "manifest.json"
    m = json.loads(path.read_text())
    m["hashes"]["final_params"] = "0" * 64
    path.write_text(json.dumps(m))
    with pytest.raises(FathomError, match="fails its digest check"):
        RunDir(tiny_run_copy)
    path.write_text(json.dumps(seal(m)))
    assert RunDir(tiny_run_copy).manifest["hashes"]["final_params"] == "0" * 64
    rows, bad = read_jsonl(tiny_run_copy / "history.jsonl")
    assert bad == [] and len(rows) == 4
