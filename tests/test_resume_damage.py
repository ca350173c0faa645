"""Randomized damage of an interrupted run: resume refuses or is exact, never a third outcome.

One template run is killed at an exact write (the rename of epoch 3's resume state, see
:mod:`kill_points`): its resume state is that of epoch 2; its history holds rows 0..3; its
``selected.safetensors`` may already hold epoch 3. Each example copies it, damages one of
its files (a flipped bit, a truncation, a deletion, a duplicated line, another file copied
over it, the same file of a *twin*: the same config and run id killed at the same write but
trained with two threads, whose numbers differ and whose files verify among themselves, or
the twin's whole ``checkpoints/`` with its history) and resumes. The property (DESIGN.md, "Refuse or be exact"): the resume either
raises a :class:`~fathom.errors.FathomError` that names the problem, or ends ``complete``
with the uninterrupted run's final parameter hash and a directory that verifies.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from hypothesis import event, example, given, settings
from hypothesis import strategies as st

from conftest import synthetic_splits, tiny_config
from fathom.errors import FathomError
from fathom.rundir import RunDir
from fathom.train.loop import resume, train
from kill_points import killed_run

EPOCHS = 4
CFG = {"optim.epochs": EPOCHS, "checkpoints.save_epochs": [0, 2, EPOCHS]}
FILES = (
    "manifest.json",
    "history.jsonl",
    "checkpoints/resume.safetensors",
    "checkpoints/epoch-0000.safetensors",
    "checkpoints/epoch-0002.safetensors",
    "checkpoints/selected.safetensors",
    ".fathom-run.lock",
)
OPS = ("flip", "truncate", "delete", "duplicate_line", "copy_over", "from_twin", "twin_pair")


@pytest.fixture(scope="module")
def data():
    return synthetic_splits()


@pytest.fixture(scope="module")
def reference(data, tmp_path_factory) -> str:
    return train(
        tiny_config(**CFG), tmp_path_factory.mktemp("ref") / "run", splits=data
    ).final_params


@pytest.fixture(scope="module")
def twin(data, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("twin") / "run"
    torch.set_num_threads(2)
    try:
        with pytest.MonkeyPatch.context() as mp:
            killed_run(mp, tiny_config(**CFG), run, data, "replace", "resume.safetensors", n=4)
    finally:
        torch.set_num_threads(1)
    return run


@pytest.fixture(scope="module")
def template(data, tmp_path_factory, twin) -> Path:
    run = tmp_path_factory.mktemp("template") / "run"
    with pytest.MonkeyPatch.context() as mp:
        killed_run(mp, tiny_config(**CFG), run, data, "replace", "resume.safetensors", n=4)
    for name in FILES[:-1]:
        assert (run / name).is_file(), name
    return run


def damage(run: Path, name: str, op: str, where: int, bit: int, other: str, twin: Path) -> None:
    """Apply ``op`` to ``run/name`` at byte/line ``where`` (modulo its size)."""
    path = run / name
    data = path.read_bytes() if path.exists() else b""
    if op == "from_twin":
        shutil.copyfile(twin / name, path)
    elif op == "twin_pair":
        shutil.rmtree(run / "checkpoints")
        shutil.copytree(twin / "checkpoints", run / "checkpoints")
        shutil.copyfile(twin / "history.jsonl", run / "history.jsonl")
    elif op == "delete":
        path.unlink(missing_ok=True)
    elif op == "copy_over":
        if other != name:
            shutil.copyfile(run / other, path)
    elif not data:
        return
    elif op == "flip":
        flipped = bytearray(data)
        flipped[where % len(data)] ^= 1 << bit
        path.write_bytes(bytes(flipped))
    elif op == "truncate":
        path.write_bytes(data[: where % len(data)])
    elif op == "duplicate_line":
        lines = data.splitlines(keepends=True)
        i = where % len(lines)
        path.write_bytes(b"".join([*lines[: i + 1], lines[i], *lines[i + 1 :]]))


def resume_damaged(template, twin, tmp_path_factory, data, reference, name, op, where, bit, other):
    run = tmp_path_factory.mktemp("damaged") / "run"
    shutil.copytree(template, run)
    damage(run, name, op, where, bit, other, twin)
    try:
        try:
            res = resume(run, splits=data)
        except FathomError as e:
            assert len(str(e)) > 40, f"refusal without an explanation: {e!r}"
            return "refused"
        return res.status, res.final_params == reference, RunDir(run).problems(deep=True)
    finally:
        shutil.rmtree(run.parent, ignore_errors=True)


@settings(max_examples=100)
@given(
    name=st.sampled_from(FILES),
    op=st.sampled_from(OPS),
    where=st.integers(0, 2**31),
    bit=st.integers(0, 7),
    other=st.sampled_from(FILES[:-1]),
)
@example(name="manifest.json", op="flip", where=40, bit=7, other="history.jsonl")  # not UTF-8
@example(name="history.jsonl", op="duplicate_line", where=3, bit=0, other="manifest.json")
@example(name="history.jsonl", op="truncate", where=10**9, bit=0, other="manifest.json")
@example(
    name=".fathom-run.lock", op="copy_over", where=0, bit=0, other="checkpoints/resume.safetensors"
)
@example(name="manifest.json", op="copy_over", where=0, bit=0, other="manifest.json")  # no-op
@example(name="history.jsonl", op="twin_pair", where=0, bit=0, other="manifest.json")
@example(
    name="checkpoints/resume.safetensors", op="from_twin", where=0, bit=0, other="manifest.json"
)
@example(name="manifest.json", op="from_twin", where=0, bit=0, other="manifest.json")
def test_damage_is_refused_or_resumed_exactly(
    template, twin, tmp_path_factory, data, reference, name, op, where, bit, other
):
    outcome = resume_damaged(
        template, twin, tmp_path_factory, data, reference, name, op, where, bit, other
    )
    event(f"{op} {name}: {outcome if outcome == 'refused' else 'exact'}")
    assert outcome in ("refused", ("complete", True, [])), (name, op, where, bit, other, outcome)
