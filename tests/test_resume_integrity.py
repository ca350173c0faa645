"""Resume verifies everything it continues from.

Each test is one way a resume used to turn a damaged directory into a run that verifies:
history rows changed or lost, a resume state from another run, a thread count or dataset
that changed, options it ignored, a renamed digest key, an epoch-0 stop that could not be
resumed, advice that could not work. Interrupted runs are made by kill points
(:mod:`kill_points`: an injected failure at an exact ``os.replace``/``fsync``), never sleeps.
The template run is killed while writing epoch 3's resume state: its resume state is that of
epoch 2, its history holds rows 0..3.
"""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
import torch

from conftest import synthetic_splits, tiny_config
from fathom.cli import main
from fathom.errors import FathomError
from fathom.rundir import RunDir, files, load_resume, load_weights, save_resume
from fathom.train.loop import resume, train
from kill_points import copy_run, kill_at, killed_run, snapshot

EPOCHS = 4
CFG = {"optim.epochs": EPOCHS, "checkpoints.save_epochs": [0, 2, EPOCHS]}


@pytest.fixture(scope="module")
def data():
    return synthetic_splits()


@pytest.fixture(scope="module")
def reference(data, tmp_path_factory) -> str:
    res = train(tiny_config(**CFG), tmp_path_factory.mktemp("ref") / "run", splits=data)
    assert res.status == "complete"
    return res.final_params


@pytest.fixture(scope="module")
def template(data, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("template") / "run"
    with pytest.MonkeyPatch.context() as mp:
        killed_run(mp, tiny_config(**CFG), run, data, "replace", "resume.safetensors", n=4)
    assert load_resume(run / "checkpoints" / "resume.safetensors")["epoch"] == 2
    assert [r["epoch"] for r in RunDir(run).history()] == [0, 1, 2, 3]
    return run


@pytest.fixture
def run(template, tmp_path) -> Path:
    return copy_run(template, tmp_path / "run")


def refused(run: Path, data, match: str) -> FathomError:
    """``resume`` raises a ``FathomError`` matching ``match`` and leaves every file as it was."""
    before = snapshot(run)
    with pytest.raises(FathomError, match=match) as info:
        resume(run, splits=data)
    assert snapshot(run) == before, "a refusal must not change the run directory"
    return info.value


def lines(run: Path) -> list[bytes]:
    return (run / "history.jsonl").read_bytes().splitlines(keepends=True)


def set_lines(run: Path, new: list[bytes]) -> None:
    (run / "history.jsonl").write_bytes(b"".join(new))


# -- 1. the history up to the resume point is verified -------------------------------------
def change_a_value(run: Path) -> None:
    rows = lines(run)
    row = json.loads(rows[1])
    row["val/acc"] = 0.99
    rows[1] = (json.dumps(row) + "\n").encode()
    set_lines(run, rows)


HISTORY_DAMAGE = {
    "a changed value": change_a_value,
    "an emptied history": lambda run: set_lines(run, []),
    "a deleted history": lambda run: (run / "history.jsonl").unlink(),
    "a deleted middle line": lambda run: set_lines(
        run, [r for i, r in enumerate(lines(run)) if i != 1]
    ),
    "a duplicated row": lambda run: set_lines(
        run, [*lines(run)[:2], lines(run)[1], *lines(run)[2:]]
    ),
    "a torn row before the resume point": lambda run: set_lines(
        run, [lines(run)[0], lines(run)[1][:-9], *lines(run)[2:]]
    ),
}


@pytest.mark.parametrize("damage", list(HISTORY_DAMAGE))
def test_damaged_history_up_to_the_resume_point_is_refused(run, data, damage):
    HISTORY_DAMAGE[damage](run)
    err = refused(run, data, "cannot resume .*history.jsonl")
    assert "Restore history.jsonl from a copy" in str(err) and "epoch(s) are lost" in str(err)
    assert RunDir(run).status == "running"  # never sealed as complete


def test_rows_after_the_resume_point_are_cut_and_shown(run, data, reference, capsys):
    with open(run / "history.jsonl", "ab") as f:
        f.write(b'{"epoch": 4, "val/acc": 0.')  # torn: a kill inside the next row's write
    res = resume(run, splits=data)
    assert res.final_params == reference
    assert [r["epoch"] for r in res.history] == list(range(EPOCHS + 1))
    events = {e["event"]: e for e in RunDir(run).recovery()}
    assert events["history_truncated"]["dropped_epochs"] == [3]
    assert events["history_lines_unreadable"]["lines"] == [5]
    assert RunDir(run).problems(deep=True) == []


# -- 2. the resume state is bound to its run ----------------------------------------------
def test_checkpoints_of_an_identical_run_at_another_lr_are_refused(run, data, tmp_path):
    import shutil

    other = tmp_path / "other" / "run"  # the same run id, another learning rate
    with pytest.MonkeyPatch.context() as mp:
        killed_run(
            mp,
            tiny_config(**CFG, **{"optim.lr": 0.03}),
            other,
            data,
            "replace",
            "resume.safetensors",
            4,
        )
    shutil.rmtree(run / "checkpoints")
    shutil.copytree(other / "checkpoints", run / "checkpoints")
    refused(run, data, "belongs to another run: its config_hash")


def test_a_resume_state_without_its_binding_is_refused(run, data):
    path = run / "checkpoints" / "resume.safetensors"
    state = load_resume(path)
    for key in ("format", "run_id", "config_hash", "history"):
        del state[key]
    save_resume(path, state)  # as an older fathom wrote it: no binding
    refused(run, data, "has no run binding .* older fathom")


def test_a_resume_state_at_an_epoch_the_manifest_cannot_have_is_refused(run, data):
    path = run / "checkpoints" / "resume.safetensors"
    state = load_resume(path)
    save_resume(path, {**state, "epoch": 0})  # a state kept from an earlier moment
    refused(run, data, "resume state .* is at epoch 0 but the manifest records 2")


def twin_killed(data, tmp_path: Path, threads: int, **updates) -> Path:
    """A twin of the template run (same config and run id) killed at the same write, trained
    with ``threads`` threads: its record differs, its files verify among themselves. Its
    numbers may or may not differ (CPU reductions split by thread count where a kernel
    parallelizes: on one Intel CPU the tiny run's checkpoints differ, on an AMD EPYC with
    torch 2.13 they are bit-identical), so a resume refuses it by the record, not the bits."""
    run = tmp_path / f"twin-{threads}" / "run"
    torch.set_num_threads(threads)
    try:
        with pytest.MonkeyPatch.context() as mp:
            killed_run(
                mp, tiny_config(**CFG, **updates), run, data, "replace", "resume.safetensors", 4
            )
    finally:
        torch.set_num_threads(1)
    return run


@pytest.fixture(scope="module")
def twin(data, tmp_path_factory) -> Path:
    return twin_killed(data, tmp_path_factory.mktemp("twin"), threads=2)


def copy_twin_files(twin: Path, run: Path) -> None:
    import shutil

    shutil.rmtree(run / "checkpoints")
    shutil.copytree(twin / "checkpoints", run / "checkpoints")
    shutil.copyfile(twin / "history.jsonl", run / "history.jsonl")


def test_a_twin_records_another_thread_count_and_its_files_verify_among_themselves(run, twin):
    ours, theirs = RunDir(run), RunDir(twin)
    assert ours.manifest["config_hash"] == theirs.manifest["config_hash"]
    assert ours.run_id == theirs.run_id
    assert ours.manifest["environment"]["threads"] == 1
    assert theirs.manifest["environment"]["threads"] == 2
    assert theirs.problems(deep=True) == []


def test_the_files_of_a_twin_with_another_thread_count_are_refused(run, twin, data):
    copy_twin_files(twin, run)
    err = refused(run, data, "computed with environment.threads = 2, the manifest records 1")
    assert "Put this run's own checkpoints/ and history.jsonl back" in str(err)
    assert RunDir(run).status == "running"


def test_the_cli_refuses_a_twin_with_exit_2_and_writes_nothing(run, twin, capsys):
    copy_twin_files(twin, run)
    before = snapshot(run)
    assert main(["train", "--resume", str(run), "--quiet"]) == 2
    assert "is not the one its manifest recorded" in capsys.readouterr().err
    assert snapshot(run) == before


def test_the_files_of_a_twin_are_refused_without_the_state_record(run, twin, data):
    # a state written before states carried their manifest record: the history decides
    copy_twin_files(twin, run)
    path = run / "checkpoints" / "resume.safetensors"
    state = load_resume(path)
    del state["manifest_record"]
    save_resume(path, state)
    refused(run, data, "rows the manifest sealed at epoch 2.* are not the ones it recorded")


def test_the_files_of_a_twin_trained_on_other_data_are_refused(run, data, tmp_path):
    twin = twin_killed(synthetic_splits(seed=1), tmp_path, threads=1)
    copy_twin_files(twin, run)
    refused(run, data, "computed with data.tensors_sha256 = ")


STATE_DAMAGE = {
    "another checkpoint file": (
        lambda s: s["checkpoints"]["2"].update(sha256="0" * 64),
        "lists checkpoint 'checkpoints/epoch-0002.safetensors' .* for epoch 2",
    ),
    "a checkpoint the manifest lacks": (
        lambda s: s["checkpoints"].update({"1": dict(s["checkpoints"]["0"])}),
        "for epoch 1, the manifest none",
    ),
    "a checkpoint the state lacks": (
        lambda s: s["checkpoints"].pop("2"),
        "lists checkpoint none for epoch 2",
    ),
    "other selected weights": (
        lambda s: s["selected_ckpt"].update(params_sha256="0" * 64),
        "selected weights of epoch",
    ),
    "another training order": (
        lambda s: s.update(order_digest="0" * 64),
        "order_digest .* the manifest's hashes.training_order",
    ),
    "another step count": (lambda s: s.update(step=s["step"] + 1), "steps_completed"),
}


@pytest.mark.parametrize("damage", list(STATE_DAMAGE))
def test_a_state_the_manifest_did_not_record_is_refused(run, damage):
    from fathom.rundir.resume import verify_against_manifest

    change, match = STATE_DAMAGE[damage]
    state, manifest = load_resume(run / "checkpoints" / "resume.safetensors"), RunDir(run).recorded
    history = (run / "history.jsonl").read_bytes()
    verify_against_manifest(state, manifest, history, run)  # as written: agrees
    change(state)
    with pytest.raises(FathomError, match=match):
        verify_against_manifest(state, manifest, history, run)


@pytest.mark.parametrize(
    ("op", "match", "n"), [("replace", "resume.safetensors", 3), ("fsync", "history", 6)]
)
def test_a_state_behind_the_manifest_resumes_exactly(data, tmp_path, op, match, n):
    # resume state every 2 epochs: the state is at epoch 2 while the manifest reached 3
    cfg = tiny_config(**CFG, **{"checkpoints.resume_every": 2})
    reference = train(cfg, tmp_path / "ref" / "run", splits=data).final_params
    run = tmp_path / "run"
    with pytest.MonkeyPatch.context() as mp:
        killed_run(mp, cfg, run, data, op, match, n)
    done = RunDir(run).manifest["epochs_completed"]
    assert load_resume(run / "checkpoints" / "resume.safetensors")["epoch"] == 2 < done == 3
    with pytest.MonkeyPatch.context() as mp:  # killed again after the cut, before its commit
        killed_run_resume(mp, run, data)
    assert resume(run, splits=data).final_params == reference
    assert RunDir(run).problems(deep=True) == []


def test_a_state_ahead_of_the_manifest_resumes_exactly(data, reference, tmp_path):
    # killed at the commit of epoch 2: the resume state (and history) reached epoch 2, the
    # manifest still records epoch 1
    run = tmp_path / "run"
    with pytest.MonkeyPatch.context() as mp:
        killed_run(mp, tiny_config(**CFG), run, data, "replace", "manifest.json", n=4)
    assert load_resume(run / "checkpoints" / "resume.safetensors")["epoch"] == 2
    assert RunDir(run).manifest["epochs_completed"] == 1
    assert resume(run, splits=data).final_params == reference
    assert RunDir(run).problems(deep=True) == []


def killed_run_resume(mp: pytest.MonkeyPatch, run: Path, data) -> None:
    from kill_points import Killed

    kill_at(mp, "replace", "manifest.json", 1)
    with pytest.raises(Killed):
        resume(run, splits=data)


# -- 3. what resume must not let change silently ------------------------------------------
def test_resume_uses_the_recorded_thread_count(run, data, reference):
    seen: list[int] = []
    torch.set_num_threads(2)
    try:
        res = train(
            tiny_config(**CFG),
            run,
            splits=data,
            resume=True,
            progress=lambda event, info: seen.append(torch.get_num_threads()),
        )
        assert torch.get_num_threads() == 2  # the caller's count is given back
    finally:
        torch.set_num_threads(1)
    assert set(seen) == {1} and res.final_params == reference
    m = RunDir(run).manifest
    assert m["environment"]["threads"] == 1
    events = [e for e in RunDir(run).recovery() if e["event"] == "threads_set_to_recorded"]
    assert events == [{"event": "threads_set_to_recorded", "recorded": 1, "found": 2}]


def test_changed_dataset_content_is_refused(run, data):
    relabelled = synthetic_splits()
    relabelled.fit_y[0] = (relabelled.fit_y[0] + 1) % 10  # same files, same split, one label
    refused(run, relabelled, r"data.tensors_sha256 recorded")


def test_changed_dataset_file_is_refused(tmp_path):
    import numpy as np

    npz = tmp_path / "features.npz"
    g = np.random.default_rng(0)
    x, y = g.normal(size=(240, 12)).astype("float32"), g.integers(0, 3, 240)
    np.savez(npz, x=x, y=y)
    sets = ["data.dataset=tensors", f"data.path={npz}", "model.widths=[8, 8]"]
    args = ["train", "--runs-dir", str(tmp_path / "runs"), "--name", "t", "--quiet"]
    args += [a for s in [*sets, "optim.epochs=2", "device=cpu"] for a in ("--set", s)]
    with pytest.MonkeyPatch.context() as mp:
        kill_at(mp, "replace", "resume.safetensors", 2)
        with pytest.raises(BaseException, match="killed at replace"):
            main(args)
    run = next((tmp_path / "runs").glob("*/t"))
    y[0] = (y[0] + 1) % 3  # relabelled between the kill and the resume
    np.savez(npz, x=x, y=y)
    assert main(["train", "--resume", str(run), "--quiet"]) == 2
    assert RunDir(run).status == "running"


@pytest.mark.parametrize(
    ("option", "value"), [("--device", "cpu"), ("--runs-dir", "elsewhere"), ("--name", "x")]
)
def test_options_a_resume_would_ignore_are_refused(run, option, value, capsys):
    before = snapshot(run)
    assert main(["train", "--resume", str(run), option, value, "--quiet"]) == 2
    assert f"{option} cannot change a run being resumed" in capsys.readouterr().err
    assert snapshot(run) == before


# -- 4. readers cannot be switched off ----------------------------------------------------
@pytest.mark.parametrize(
    ("path", "renamed"),
    [(("integrity",), "manifest_sha256"), (("integrity", "history"), "sha256")],
)
def test_a_renamed_digest_key_is_reported(run, path, renamed):
    m = json.loads((run / "manifest.json").read_text())
    section = m
    for key in path:
        section = section[key]
    section[renamed[:-1] + "7"] = section.pop(renamed)  # one byte renamed
    (run / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(FathomError, match=f"lacks key {renamed!r}"):
        RunDir(run)


def test_selected_weights_newer_than_the_manifest_are_not_called_corrupt(data, tmp_path):
    # killed at the commit of epoch 2's manifest: selected.safetensors already holds epoch 2
    run = tmp_path / "run"
    with pytest.MonkeyPatch.context() as mp:
        killed_run(mp, tiny_config(**CFG), run, data, "replace", "manifest.json", n=4)
    rd = RunDir(run)
    sel = run / rd.manifest["selected_checkpoint"]["file"]
    assert rd.manifest["selected_checkpoint"]["epoch"] < 2 == int(load_weights(sel)[1]["epoch"])
    assert rd.problems(deep=True) == []
    data_bytes = bytearray(sel.read_bytes())
    data_bytes[-3] ^= 0x10  # a flipped weight byte is still corrupt
    sel.write_bytes(bytes(data_bytes))
    assert any("selected" in p for p in RunDir(run).problems(deep=True))


# -- 5. epoch 0 is resumable --------------------------------------------------------------
@pytest.mark.parametrize(
    ("op", "match", "n"),
    [
        ("replace", "manifest.json", 1),  # the first manifest commit
        ("replace", "epoch-0000", 1),  # the epoch-0 checkpoint
        ("replace", "resume.safetensors", 1),  # the epoch-0 resume state
        ("replace", "manifest.json", 2),  # epoch 0's boundary commit
        ("fsync", "history.jsonl", 2),  # the epoch-0 history row (1: the empty history)
    ],
)
def test_a_kill_anywhere_in_epoch_0_resumes(data, reference, tmp_path, op, match, n):
    run = tmp_path / "run"
    with pytest.MonkeyPatch.context() as mp:
        killed_run(mp, tiny_config(**CFG), run, data, op, match, n)
    if not (run / "manifest.json").exists():  # killed before the first commit: start again
        res = train(tiny_config(**CFG), run, splits=data)
    else:
        res = resume(run, splits=data)
    assert res.final_params == reference
    assert RunDir(run).problems(deep=True) == []


def test_ctrl_c_in_epoch_0_evaluation_resumes_and_is_recorded(data, reference, tmp_path):
    def stop(event: str, info: dict) -> None:
        if event == "epoch" and info["epoch"] == 0:
            raise KeyboardInterrupt

    run = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        train(tiny_config(**CFG), run, splits=data, progress=stop)
    assert not (run / "checkpoints" / "resume.safetensors").exists()
    assert resume(run, splits=data).final_params == reference
    (event,) = [e for e in RunDir(run).recovery() if e["event"] == "restarted"]
    assert "stopped inside epoch 0" in event["reason"] and event["found"] == "interrupted"


def test_disk_full_in_epoch_0_says_how_much_space_finishing_needs(data, reference, tmp_path):
    import re
    import shutil

    run = tmp_path / "run"
    real = files.encode_resume

    def full(state):
        raise OSError(errno.ENOSPC, "No space left on device")

    few_kib = shutil.disk_usage(tmp_path)._replace(free=4096)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(files, "encode_resume", full)  # the epoch-0 resume state does not fit
        mp.setattr("fathom.train.guards.shutil.disk_usage", lambda path: few_kib)
        with pytest.raises(FathomError) as info:
            train(tiny_config(**CFG), run, splits=data)
    assert files.encode_resume is real
    msg = str(info.value)
    assert "ENOSPC" in msg and "4.0 KiB free now: free at least" in msg, msg
    assert msg.endswith(f"then continue with `fathom train --resume {run}`")
    assert RunDir(run).status == "failed"
    assert resume(run, splits=data).final_params == reference  # the advice works
    number, unit = re.search(r"needs about ([0-9.]+) (B|KiB|MiB|GiB)", msg).groups()
    need = float(number) * 1024 ** ["B", "KiB", "MiB", "GiB"].index(unit)
    written = sum(p.stat().st_size for p in run.rglob("*") if p.is_file())
    assert need >= written  # the estimate covers every byte the run went on to write


def test_a_deleted_resume_state_at_epoch_2_says_what_is_lost(run, data):
    (run / "checkpoints" / "resume.safetensors").unlink()
    err = str(refused(run, data, "missing although the manifest records 2 completed epoch"))
    assert "before its first epoch boundary" not in err
    assert "its 2 completed epoch(s) are lost and retrained" in err


# -- 6. deterministic bytes ---------------------------------------------------------------
def test_checkpoint_bytes_do_not_depend_on_the_process(tmp_path):
    # one run in this process, one in a fresh interpreter whose string-hash seed differs
    # from this process's (a set PYTHONHASHSEED other than ours; ours random otherwise)
    import os
    import subprocess
    import sys

    tests = Path(__file__).resolve().parent
    code = (
        "import sys, torch; torch.set_num_threads(1); "
        "from conftest import tiny_config, synthetic_splits; from fathom.train.loop import train; "
        "train(tiny_config(**{'optim.epochs': 1}), sys.argv[1], splits=synthetic_splits())"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tests.parent / "src"), str(tests)])}
    ours = os.environ.get("PYTHONHASHSEED", "random")
    other = "1" if not ours.isdigit() else str(int(ours) + 1)
    train(tiny_config(**{"optim.epochs": 1}), tmp_path / "1" / "run", splits=synthetic_splits())
    subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "2" / "run")],
        env={**env, "PYTHONHASHSEED": other},
        check=True,
    )
    names = ["epoch-0000.safetensors", "epoch-0001.safetensors", "selected.safetensors"]
    for name in names:
        a, b = (tmp_path / s / "run" / "checkpoints" / name for s in ("1", "2"))
        assert a.read_bytes() == b.read_bytes(), name
    m1, m2 = (RunDir(tmp_path / s / "run").manifest["checkpoints"] for s in ("1", "2"))
    assert m1 == m2  # the recorded file digests reproduce


def test_recovery_is_shown_by_runs_show_and_the_report(run, data, tmp_path):
    from fathom.report.build import build_report
    from fathom.study.runs_cli import run_directory_state

    with open(run / "history.jsonl", "ab") as f:
        f.write(b'{"epoch": 4, "val/acc": 0.')
    resume(run, splits=data)
    state = run_directory_state(run)
    assert state["problems"] == []
    assert any("history lines [5] were torn" in note for note in state["recovery"])
    assert any("epochs [3] after the resume point were cut" in n for n in state["recovery"])
    out = build_report(run, tmp_path / "report", with_figures=False)
    summary = (tmp_path / "report" / "summary.md").read_text()
    assert "recovered: history lines [5] were torn" in summary, out
