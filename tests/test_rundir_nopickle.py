"""A run directory is data, never code: nothing read back from it is unpickled.

The resume state is safetensors + JSON (:func:`fathom.rundir.files.encode_state`); a ``resume.pt``
of an older fathom is read by torch's weights-only unpickler only, and converted. A pickle
payload (an object whose ``__reduce__`` writes a marker file) planted as the resume state,
its digest header recomputed, is refused by ``fathom report``, ``fathom train --resume`` and
the study runner, and the marker is never written.
"""

from __future__ import annotations

import hashlib
import io
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fathom.cli import main
from fathom.errors import FathomError
from fathom.rundir import RunDir, files, load_resume
from fathom.rundir.files import decode_state, encode_state
from fathom.study.config import validate_study_config
from fathom.study.runner import run_study
from kill_points import copy_run, kill_at, snapshot
from test_study import local, study_data


# -- the codec: a nested state comes back value for value, type for type -------------------
def same(a, b) -> bool:
    """Equal values of equal types, tensors by dtype, shape and bytes (NaN equals NaN)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(-1), b.view(-1))
    if isinstance(a, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return a == b


DTYPES = [torch.uint8, torch.int64, torch.float32, torch.float64, torch.bfloat16, torch.bool]
tensors = st.builds(
    lambda shape, dtype, seed: (
        torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 5
    ).to(dtype),
    st.lists(st.integers(0, 3), max_size=3),
    st.sampled_from(DTYPES),
    st.integers(0, 2**16),
)
scalars = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text()
keys = st.text(max_size=6) | st.integers(-3, 3) | st.just("$tensor")
states = st.recursive(
    scalars | tensors,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.lists(inner, max_size=3).map(tuple)
        | st.dictionaries(keys, inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=60, deadline=None)
@given(states)
@example({0: {"step": torch.tensor(3.0)}, "$dict": (0.9, 0.999)})  # optimizer-like, a tag key
@example({"x": float("-inf"), "y": -0.0, "z": [torch.empty(0, dtype=torch.uint8)] * 2})
def test_state_round_trips_exactly(state):
    tensors_, text = encode_state({"s": state})
    assert same(decode_state(tensors_, text), {"s": state})
    data = files.encode_resume({"s": state})
    assert files.encode_resume(decode_state(*_parts(data))) == data  # canonical bytes


def _parts(data: bytes):
    from safetensors.torch import load

    meta = files._safetensors_metadata(data)
    return load(data), meta["state"]


@pytest.mark.parametrize(
    ("value", "named"),
    [(np.float32(1.0), "numpy.float32"), (torch.float32, "torch.dtype"), ({1, 2}, "set")],
)
def test_a_value_json_has_no_form_for_is_refused_by_where_it_is(value, named):
    with pytest.raises(FathomError, match=rf"{named} at state\['opt'\]\[0\].*never pickled"):
        encode_state({"opt": [value]})


def test_resume_state_bytes_other_than_the_canonical_ones_are_refused(tmp_path):
    path = tmp_path / "resume.safetensors"
    files.save_resume(path, {"epoch": 1, "w": torch.ones(2)})
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = data[8 : 8 + n].replace(b'{"__metadata__"', b'{ "__metadata__"', 1)[:-1]
    path.write_bytes(len(header).to_bytes(8, "little") + header + data[8 + n :])  # same JSON
    with pytest.raises(FathomError, match="header is not written the way this fathom writes it"):
        load_resume(path)


@pytest.mark.parametrize("bit", [0x01, 0x80])
def test_every_flipped_byte_of_a_resume_state_is_refused(tmp_path, bit):
    path = tmp_path / "resume.safetensors"
    files.save_resume(path, {"epoch": 1, "opt": {0: (0.9, None)}, "w": torch.arange(6.0)})
    data = path.read_bytes()
    accepted = []
    for i in range(len(data)):  # every byte, brute force
        path.write_bytes(data[:i] + bytes([data[i] ^ bit]) + data[i + 1 :])
        try:
            load_resume(path)
            accepted.append(i)
        except FathomError:
            pass
    assert accepted == []


# -- a pickle payload is never run -----------------------------------------------------------
class Payload:
    """Unpickling this object writes ``marker`` (what a crafted ``resume.pt`` would do)."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('ran')",))


def legacy_bytes(state) -> bytes:
    """``state`` as an older fathom wrote ``resume.pt``: magic, sha256 of payload, payload."""
    buf = io.BytesIO()
    torch.save(state, buf)
    payload = buf.getvalue()
    return files.RESUME_MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload


def plant(run: Path, marker: Path) -> bytes:
    """Replace the run's resume state by a ``resume.pt`` carrying :class:`Payload`, its
    digest header recomputed; prove the payload is armed (an unchecked load runs it)."""
    data = legacy_bytes({"epoch": 0, "model": Payload(marker)})
    armed = marker.with_name("armed")
    torch.load(
        io.BytesIO(legacy_bytes(Payload(armed))[len(files.RESUME_MAGIC) + 65 :]), weights_only=False
    )
    assert armed.read_text() == "ran"
    (run / "checkpoints" / files.RESUME_NAME).unlink(missing_ok=True)
    (run / "checkpoints" / files.LEGACY_RESUME).write_bytes(data)
    return data


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory) -> Path:
    """A run trained by the CLI on a user's tensors, killed at its epoch-1 resume state."""
    root = tmp_path_factory.mktemp("cli")
    g = np.random.default_rng(0)
    np.savez(root / "d.npz", x=g.normal(size=(120, 6)).astype("float32"), y=g.integers(0, 3, 120))
    sets = [f"data.path={root / 'd.npz'}", "data.dataset=tensors", "model.widths=[8, 8]"]
    args = ["train", "--runs-dir", str(root / "runs"), "--name", "t", "--quiet"]
    args += [a for s in [*sets, "optim.epochs=3", "device=cpu"] for a in ("--set", s)]
    with pytest.MonkeyPatch.context() as mp:
        kill_at(mp, "replace", files.RESUME_NAME, 2)
        with pytest.raises(BaseException, match="killed at replace"):
            main(args)
    return next((root / "runs").glob("*/t"))


@pytest.fixture
def run(cli_run, tmp_path) -> Path:
    return copy_run(cli_run, tmp_path / "run")


def test_a_planted_pickle_is_refused_by_train_resume(run, tmp_path, capsys):
    plant(run, tmp_path / "marker")
    before = snapshot(run)
    assert main(["train", "--resume", str(run), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "resume.pt" in err and "unpickler will not read it (it calls or builds exec)" in err
    assert "train the run again" in err
    assert not (tmp_path / "marker").exists()
    assert snapshot(run) == before


def test_a_planted_pickle_is_refused_by_report(run, tmp_path, capsys):
    plant(run, tmp_path / "marker")
    assert main(["report", str(run), "--out", str(tmp_path / "out"), "--no-figures"]) == 0
    flagged = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("flagged:")]
    assert any("resume.pt" in ln and "is refused" in ln for ln in flagged), flagged
    assert not (tmp_path / "marker").exists()


def test_a_pickle_beside_the_resume_state_is_never_read(run, cli_run, tmp_path):
    resumable = copy_run(cli_run, tmp_path / "twin")
    (run / "checkpoints" / files.LEGACY_RESUME).write_bytes(
        legacy_bytes({"epoch": 0, "model": Payload(tmp_path / "marker")})
    )
    assert RunDir(run).problems(deep=True) == RunDir(resumable).problems(deep=True)
    assert main(["train", "--resume", str(run), "--quiet"]) == 0
    assert main(["train", "--resume", str(resumable), "--quiet"]) == 0
    assert RunDir(run).manifest["hashes"] == RunDir(resumable).manifest["hashes"]
    assert not (tmp_path / "marker").exists()


def test_an_older_resume_pt_is_converted_and_resumes_exactly(run, cli_run, tmp_path):
    reference = copy_run(cli_run, tmp_path / "reference")
    assert main(["train", "--resume", str(reference), "--quiet"]) == 0
    new = run / "checkpoints" / files.RESUME_NAME
    (run / "checkpoints" / files.LEGACY_RESUME).write_bytes(legacy_bytes(load_resume(new)))
    new.unlink()
    assert main(["train", "--resume", str(run), "--quiet"]) == 0
    rd = RunDir(run)
    assert (
        rd.manifest["hashes"]["final_params"]
        == RunDir(reference).manifest["hashes"]["final_params"]
    )
    assert not (run / "checkpoints" / files.LEGACY_RESUME).exists() and new.exists()
    (event,) = [e for e in rd.recovery() if e["event"] == "resume_state_converted"]
    assert event["old"] == "checkpoints/resume.pt"


def test_a_planted_pickle_is_refused_by_the_study_runner(tmp_path):
    study = validate_study_config(
        study_data(
            study={"recipes": ["residual"], "seeds": [101], "lr": 0.05}, tuning={"enabled": False}
        ),
        "a",
    )
    first = run_study(study, tmp_path / "s", local())
    (run_dir,) = [Path(o.run_dir) for o in first.outcomes]
    plant(run_dir, tmp_path / "marker")
    again = run_study(study, tmp_path / "s", local())
    (outcome,) = again.outcomes  # the refused state is damage: the run is trained again
    assert outcome.action == "retried" and "resume.pt" in outcome.note
    assert "will not read it (it calls or builds exec)" in outcome.note
    assert outcome.final_params == first.outcomes[0].final_params
    assert not (tmp_path / "marker").exists()


# -- writes never leave their tree -------------------------------------------------------------
def test_a_report_folder_linked_out_of_the_run_is_refused(run, tmp_path, capsys):
    outside = tmp_path / "outside"
    outside.mkdir()
    (run / "report").symlink_to(outside)
    assert main(["report", str(run), "--no-figures"]) == 2
    err = capsys.readouterr().err
    assert "symbolic link that leads out of" in err and "Nothing was written" in err
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize("command", ["report", "export"])
def test_an_out_inside_another_run_is_refused(run, cli_run, tmp_path, capsys, command):
    other = copy_run(cli_run, tmp_path / "other")
    before = snapshot(other)
    args = [command, str(run), "--out", str(other / "sub")]
    assert main([*args, *(["--no-figures"] if command == "report" else ["--to", "jsonl"])]) == 2
    assert "lies inside another run or study directory" in capsys.readouterr().err
    assert snapshot(other) == before and not (other / "sub").exists()


@pytest.mark.parametrize("name", ["checkpoints", "history.jsonl"])
def test_a_resume_never_writes_through_a_link_out_of_the_run(run, tmp_path, capsys, name):
    moved = tmp_path / f"moved-{name}"
    (run / name).rename(moved)
    (run / name).symlink_to(moved)
    before = {p: p.read_bytes() for p in sorted(moved.rglob("*")) if p.is_file()} or {
        moved: moved.read_bytes()
    }
    assert main(["train", "--resume", str(run), "--quiet"]) == 2
    assert "symbolic link that leads out of the run directory" in capsys.readouterr().err
    after = {p: p.read_bytes() for p in sorted(moved.rglob("*")) if p.is_file()} or {
        moved: moved.read_bytes()
    }
    assert after == before


# -- a factory named in a config is code: never imported from a run directory ----------------
def test_a_factory_found_inside_a_run_directory_is_not_imported(run, tmp_path, monkeypatch):
    from fathom.base.user_code import resolve_factory

    marker = tmp_path / "marker"
    (run / "np_shared_factory.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\ndef build(**kw):\n    return 1\n"
    )
    monkeypatch.syspath_prepend(str(run))  # e.g. `python -m fathom` run from inside it
    with pytest.raises(FathomError, match=r"np_shared_factory.* inside the run or study dir"):
        resolve_factory("np_shared_factory:build", "model.factory")
    assert not marker.exists()
    own = tmp_path / "own"
    own.mkdir()
    (own / "np_own_factory.py").write_text("def build(**kw):\n    return 2\n")
    monkeypatch.syspath_prepend(str(own))
    assert resolve_factory("np_own_factory:build", "model.factory")() == 2


def test_a_study_never_writes_through_a_run_linked_out_of_it(tmp_path):
    study = validate_study_config(
        study_data(
            study={"recipes": ["residual"], "seeds": [101], "lr": 0.05}, tuning={"enabled": False}
        ),
        "a",
    )
    first = run_study(study, tmp_path / "s", local())
    (run_dir,) = [Path(o.run_dir) for o in first.outcomes]
    outside = tmp_path / "outside"
    run_dir.rename(outside)
    run_dir.symlink_to(outside)
    before = snapshot(outside)
    with pytest.raises(FathomError, match="leads out of the study directory"):
        run_study(study, tmp_path / "s", local())
    assert snapshot(outside) == before
