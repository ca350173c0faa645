"""A study never selects, summarises or runs on damaged or missing data: it is locked, retries what failed and says so, and its workers die with it."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import threading
import time
from functools import partial
from multiprocessing import resource_tracker
from pathlib import Path

import pytest

from fathom.errors import FathomError
from fathom.rundir import RunDir
from fathom.study import pool
from fathom.study.backends import LocalBackend
from fathom.study.config import validate_study_config
from fathom.study.runner import run_study
from test_rundir import hold_lock, tear_last_line
from test_study import local, study_data, synthetic_splits

TUNED = study_data(
    study={"recipes": ["residual"], "seeds": [101, 102]}, tuning={"lrs": [0.05, 0.1]}
)


def fail_writes(monkeypatch, match: str, error: OSError | Exception) -> None:
    """Atomic writes of paths containing ``match`` raise ``error`` (a full disk, ...)."""
    import fathom.rundir.writer as writer

    real = writer.atomic_write_bytes

    def broken(path, data):
        if match in str(path):
            raise error
        return real(path, data)

    import fathom.base.io
    import fathom.rundir.files

    for module in (writer, fathom.rundir.files, fathom.base.io):
        monkeypatch.setattr(module, "atomic_write_bytes", broken)


def test_disk_full_tuning_run_is_retried_never_left_out_of_the_grid(tmp_path, monkeypatch):
    study = validate_study_config(TUNED, "a")
    clean = run_study(study, tmp_path / "clean", local())
    # the better rate's run hits a full disk at its epoch-1 resume state
    best = clean.summary["tuning"]["selected_lr"]["residual"]
    full = OSError(errno.ENOSPC, "No space left on device")
    with monkeypatch.context() as m:
        fail_writes(m, f"tune-residual-lr{best:g}-s1/checkpoints/resume.safetensors", full)
        with pytest.raises(FathomError, match="ENOSPC No space left on device; the disk is full"):
            run_study(study, tmp_path / "full", local())
    rd = RunDir(tmp_path / "full" / "t" / f"tune-residual-lr{best:g}-s1")
    assert rd.status == "failed" and rd.manifest["failure"]["environment"] is True
    rerun = run_study(study, tmp_path / "full", local())  # the disk has space again
    retried = {o.run_id: o for o in rerun.outcomes if o.action == "retried"}
    assert list(retried) == [f"tune-residual-lr{best:g}-s1"]
    assert "its environment failed" in retried[f"tune-residual-lr{best:g}-s1"].note
    assert rerun.summary["execution"]["retried"][0]["run_id"] == f"tune-residual-lr{best:g}-s1"
    assert rerun.summary["tuning"]["selected_lr"] == clean.summary["tuning"]["selected_lr"]
    final = {k: v["final_params"] for k, v in rerun.summary["runs"].items()}
    assert final == {k: v["final_params"] for k, v in clean.summary["runs"].items()}
    assert "retried (its environment failed)" in (rerun.root / "summary.md").read_text()


def test_a_failed_grid_point_stops_selection_until_retried(tmp_path, monkeypatch):
    study = validate_study_config(TUNED, "a")
    with monkeypatch.context() as m:
        fail_writes(m, "tune-residual-lr0.1-s1/checkpoints/epoch-0002", RuntimeError("bug"))
        with pytest.raises(FathomError, match=r"tuning grid of recipe 'residual' is incomplete"):
            run_study(study, tmp_path, local())
    # without --retry-failed the run's own failure is kept, and selection still refuses
    with pytest.raises(FathomError, match=r"tune-residual-lr0.1-s1 \(failed: RuntimeError: bug\)"):
        run_study(study, tmp_path, local())
    result = run_study(study, tmp_path, local(), retry_failed=True)
    actions = {o.run_id: o.action for o in result.outcomes}
    assert actions["tune-residual-lr0.1-s1"] == "retried"
    assert actions["tune-residual-lr0.05-s1"] == "skipped"
    assert {p["status"] for p in result.summary["tuning"]["grid"]} == {"complete"}


def test_torn_history_of_a_complete_run_is_retrained_and_reported(tmp_path):
    study = validate_study_config(
        study_data(tuning={"enabled": False}, study={"lr": 0.05, "recipes": ["residual"]}), "a"
    )
    first = run_study(study, tmp_path, local())
    assert first.summary["stats"]["n_runs"] == 2 and not first.summary["stats"]["excluded"]
    tear_last_line(first.root / "main-residual-s102")
    again = run_study(study, tmp_path, local())
    out = {o.run_id: o for o in again.outcomes}
    assert out["main-residual-s101"].action == "skipped"
    assert out["main-residual-s102"].action == "retried"
    assert "line 3 is torn" in out["main-residual-s102"].note
    assert "another final hash" not in out["main-residual-s102"].note  # deterministic retrain
    stats = again.summary["stats"]  # not silently n=1
    assert stats["n_runs"] == 2 and stats["recipes"]["residual"]["seeds"] == [101, 102]
    assert again.summary["runs"] == first.summary["runs"]
    assert (
        "main-residual-s102: retrained: history.jsonl line 3 is torn"
        in (again.root / "summary.md").read_text()
    )


def test_the_same_study_twice_is_refused(tmp_path, forked):
    study = validate_study_config(
        study_data(tuning={"enabled": False}, study={"lr": 0.05, "recipes": ["residual"]}), "a"
    )
    holder = hold_lock(forked, tmp_path / "t", study=True)
    try:
        with pytest.raises(FathomError, match=f"study directory .* locked .*PID {holder.pid}"):
            run_study(study, tmp_path, local())
    finally:
        holder.kill()
        holder.wait()
    assert not (tmp_path / "t" / "main-residual-s101").exists()


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split()[2] == "Z")


def test_kill_9_of_a_two_worker_study_leaves_no_worker(tmp_path, forked):
    data = study_data(
        tuning={"enabled": False},
        study={"lr": 0.05, "recipes": ["residual", "sd_constant"], "seeds": [101]},
        base={**study_data()["base"], "optim": {"epochs": 50}, "data": {"fit_subset": 2048}},
    )
    study = validate_study_config(data, "kill")

    def study_with_two_workers() -> None:  # the parent: a process forked from this one
        run_study(study, tmp_path, LocalBackend(2, 1, partial(synthetic_splits, n_fit=2048)))

    parent = forked(study_with_two_workers)
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            started = list((tmp_path / "t").glob("main-*/manifest.json"))
            if len(started) == 2:  # both workers are training
                workers = [p for c in _children(parent.pid) for p in [c, *_children(c)]]
                break
            assert parent.poll() is None, "the study ended before it could be killed"
            time.sleep(0.05)
        else:
            pytest.fail("the workers did not start in time")
        parent.send_signal(signal.SIGKILL)  # the parent only, not its process group
        parent.wait()
        deadline = time.monotonic() + 10
        while any(_alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = [w for w in workers if _alive(w)]
        assert workers and not left, f"workers {left} outlived the killed study"
    finally:
        for w in workers:
            if _alive(w):
                os.kill(w, signal.SIGKILL)


def _server_parent(mark: str) -> tuple[int, str | None]:
    """Start a one-worker pool as the local backend does; ``(the PID that started the worker's
    forkserver, the mark the worker saw)``, the mark set only after this process's server may
    already run."""
    from fathom.study.pool import local_pool

    os.environ["FATHOM_TEST_MARK"] = mark
    with local_pool([None]) as executor:
        # the worker's parent and the mark as the worker sees it; builtins, pickled by name, so
        # the worker never imports this test module (seconds of fathom and torch imports)
        server = executor.submit(os.getppid).result()
        seen = executor.submit(os.getenv, "FATHOM_TEST_MARK").result()
    ppid = int(Path(f"/proc/{server}/stat").read_text().rsplit(")", 1)[1].split()[1])
    return ppid, seen


def test_pool_workers_come_from_this_process_own_forkserver_with_its_environment(
    tmp_path, forked, monkeypatch
):
    """The local pool's workers fork from a forkserver this process started (so they die
    with it) and see this process's environment of the moment, even when the server was
    started earlier or by the process this one was forked from (whose server is not ours),
    and even when another thread of that process held the resource tracker's lock at the
    fork (a lock the forked child inherits held, by a thread it does not have)."""
    monkeypatch.setenv("FATHOM_TEST_MARK", "unused")
    assert _server_parent("first") == (os.getpid(), "first")
    assert _server_parent("second") == (os.getpid(), "second")  # the server already ran

    def child() -> None:  # forked after this process started its server
        # the child's own server need not import torch: which server, and what environment
        # its worker sees, does not depend on the preload (saves seconds of import)
        pool.POOL_PRELOAD = ("fathom.study.pool_guard",)
        (tmp_path / "child").write_text(repr((os.getpid(), _server_parent("child"))))

    held, release = threading.Event(), threading.Event()

    def hold_tracker_lock() -> None:  # what a thread freeing a multiprocessing lock does
        with resource_tracker._resource_tracker._lock:
            held.set()
            release.wait()

    holder = threading.Thread(target=hold_tracker_lock)
    holder.start()
    held.wait()
    try:
        proc = forked(child)
    finally:
        release.set()
        holder.join()
    assert proc.wait(120) == 0, proc.output()
    pid, (ppid, seen) = eval((tmp_path / "child").read_text())
    assert (ppid, seen) == (pid, "child")


def test_no_thread_of_a_local_pool_outlives_it(monkeypatch):
    """Every semaphore a local pool registers with the resource tracker is unregistered by
    the thread that ran the pool, before the pool returns, and no thread of the pool is left:
    the queue feeder that used to free two of them later, taking the tracker's lock at any
    moment, could hang a fork made right after a pool (the CI failure of the test above)."""
    tracker = resource_tracker._resource_tracker
    real, sent = tracker._send, []

    def send(cmd: str, name: str, rtype: str) -> None:
        sent.append((cmd, name, threading.current_thread()))
        real(cmd, name, rtype)

    monkeypatch.setattr(tracker, "_send", send)
    before = set(threading.enumerate())
    assert _server_parent("pool") == (os.getpid(), "pool")
    assert set(threading.enumerate()) == before
    registered = sorted(name for cmd, name, _ in sent if cmd == "REGISTER")
    assert registered  # the pool's queues and locks
    assert sorted(name for cmd, name, _ in sent if cmd == "UNREGISTER") == registered
    assert {thread for _, _, thread in sent} == {threading.current_thread()}


def test_two_workers_still_match_sequential(tmp_path):
    study = validate_study_config(
        study_data(tuning={"enabled": False}, study={"lr": 0.05, "seeds": [101]}), "a"
    )
    seq = run_study(study, tmp_path / "seq", local())
    par = run_study(study, tmp_path / "par", LocalBackend(2, 1, synthetic_splits))
    assert {k: v["final_params"] for k, v in seq.summary["runs"].items()} == {
        k: v["final_params"] for k, v in par.summary["runs"].items()
    }
