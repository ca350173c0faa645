"""Randomized damage of a complete study directory: a rerun refuses or ends as the clean one.

One small study (two seeds of one recipe, two epochs, synthetic data) is run once per module
into a template directory, and once more as a *twin* (the same study, every run trained with
two threads: the same run ids and configs, other numbers). Each example copies the template,
damages one of its files (a flipped bit, a truncation, a deletion, of the file or of the
directory holding it, the same file of the other seed's run, the twin's file, the SQLite registry held locked by another connection) and runs
the study again. The property (DESIGN.md, "Refuse or be exact"): the rerun either raises a
:class:`~fathom.errors.FathomError` that explains itself, or ends with every run's final
parameter hash and weights files equal to the clean study's, every run directory verifying
(``problems(deep=True)`` empty) and the registry holding the clean final hashes.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest
from hypothesis import Phase, event, example, given, settings
from hypothesis import strategies as st

from fathom.errors import FathomError
from fathom.rundir import RunDir
from fathom.rundir.filecheck import RESUME_NAME
from fathom.study.backends import LocalBackend
from fathom.study.config import validate_study_config
from fathom.study.registry import Registry
from fathom.study.runner import run_study
from test_study import local, study_data, synthetic_splits

STUDY = study_data(tuning={"enabled": False}, study={"lr": 0.05, "recipes": ["residual"]})
RUNS = ("main-residual-s101", "main-residual-s102")
RUN_FILES = (
    ".fathom-run.lock",
    "checkpoints/epoch-0000.safetensors",
    "checkpoints/epoch-0002.safetensors",
    "checkpoints/resume.safetensors",
    "checkpoints/selected.safetensors",
    "history.jsonl",
    "manifest.json",
)
FILES = (
    "registry.sqlite",
    *(f"t/{name}" for name in (".fathom-study.lock", "study.json", "summary.json", "summary.md")),
    *(f"t/{run}/{name}" for run in RUNS for name in RUN_FILES),
)
"""Every file of the study, relative to its runs directory (the template holds exactly these)."""
OPS = ("flip", "truncate", "delete", "delete_dir", "other_seed", "twin", "lock_registry")


@pytest.fixture(scope="module")
def study():
    return validate_study_config(STUDY, "a")


@pytest.fixture(scope="module")
def template(study, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("study")
    run_study(study, root, local())
    return root


@pytest.fixture(scope="module")
def twin(study, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("twin")
    run_study(study, root, LocalBackend(workers=1, threads=2, splits_for=synthetic_splits))
    return root


def finals(root: Path) -> dict[str, str]:
    return {r: RunDir(root / "t" / r).manifest["hashes"]["final_params"] for r in RUNS}


def weights(root: Path) -> dict[str, bytes]:
    """The weights files (not the resume states: they hold the clocks of their attempt)."""
    files = sorted(p for p in root.rglob("*.safetensors") if p.name != RESUME_NAME)
    return {str(p.relative_to(root)): p.read_bytes() for p in files}


def test_the_twin_differs_from_the_template(template, twin):
    assert set(finals(template).values()).isdisjoint(finals(twin).values())
    for root in (template, twin):
        assert sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) == sorted(
            FILES
        )


def damage(root: Path, twin: Path, name: str, op: str, where: int, bit: int) -> None:
    """Apply ``op`` to ``root/name`` at byte ``where`` (modulo its size)."""
    path = root / name
    if op == "delete":
        path.unlink()
    elif op == "delete_dir":  # the directory holding it: checkpoints/, a run, the study
        shutil.rmtree(path.parent) if path.parent != root else path.unlink()
    elif op == "other_seed":
        a, b = RUNS
        other = name.replace(a, b) if a in name else name.replace(b, a)
        if other != name and (root / other).exists():
            shutil.copyfile(root / other, path)
    elif op == "twin":
        if (twin / name).exists():
            shutil.copyfile(twin / name, path)
    elif data := path.read_bytes():
        if op == "flip":
            flipped = bytearray(data)
            flipped[where % len(data)] ^= 1 << bit
            path.write_bytes(bytes(flipped))
        elif op == "truncate":
            path.write_bytes(data[: where % len(data)])


def rerun(study, root: Path, twin: Path, name: str, op: str, where: int, bit: int):
    """``"refused"`` or what the rerun ended with: (finals equal, weights equal, problems)."""
    clean = finals(root), weights(root)
    damage(root, twin, name, op, where, bit)
    holder = None
    try:
        if op == "lock_registry":
            holder = sqlite3.connect(root / "registry.sqlite", isolation_level=None)
            holder.execute("BEGIN EXCLUSIVE")
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(Registry.__init__, "__kwdefaults__", {"busy_timeout_s": 0.2})
            run_study(study, root, local())
    except FathomError as e:
        assert len(str(e)) > 40, f"refusal without an explanation: {e!r}"
        return "refused"
    finally:
        if holder is not None:
            holder.execute("ROLLBACK")
            holder.close()
    problems = [p for r in RUNS for p in RunDir(root / "t" / r).problems(deep=True)]
    registry = {
        row["run_id"]: row["final_params"] for row in Registry(root / "registry.sqlite").query()
    }
    return finals(root) == clean[0] == registry, weights(root) == clean[1], problems


@settings(max_examples=30, phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink])
@given(
    name=st.sampled_from(FILES),
    op=st.sampled_from(OPS),
    where=st.integers(0, 2**31),
    bit=st.integers(0, 7),
)
@example(name="registry.sqlite", op="delete", where=0, bit=0)
@example(name="registry.sqlite", op="truncate", where=100, bit=0)
@example(name="registry.sqlite", op="lock_registry", where=0, bit=0)
@example(name="t/study.json", op="truncate", where=10, bit=0)
@example(name="t/study.json", op="delete_dir", where=0, bit=0)  # the whole study directory
@example(name="t/main-residual-s101/manifest.json", op="delete_dir", where=0, bit=0)
@example(name="t/main-residual-s102/checkpoints/resume.safetensors", op="twin", where=0, bit=0)
@example(name="t/main-residual-s102/history.jsonl", op="twin", where=0, bit=0)
# found: a complete run's corrupt epoch checkpoint was skipped (only history and final checked)
@example(name="t/main-residual-s101/checkpoints/epoch-0000.safetensors", op="flip", where=0, bit=0)
def test_study_damage_is_refused_or_rerun_exactly(
    study, template, twin, tmp_path_factory, name, op, where, bit
):
    root = tmp_path_factory.mktemp("damaged") / "runs"
    shutil.copytree(template, root)
    try:
        outcome = rerun(study, root, twin, name, op, where, bit)
    finally:
        shutil.rmtree(root.parent, ignore_errors=True)
    event(f"{op} {name.split('/')[-1]}: {outcome if outcome == 'refused' else 'rerun'}")
    assert outcome in ("refused", (True, True, [])), (name, op, where, bit, outcome)
