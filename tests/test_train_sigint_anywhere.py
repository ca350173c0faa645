"""Ctrl-C at any point of a run leaves it recorded and resumable, never cut in two.

The property: a SIGINT sent to this process at any one trace event (call, line, return) of
Fathom's own code during an in-process :func:`fathom.train.loop.train` of a tiny MLP (about
50,000 such events over 2 epochs) ends with the ``KeyboardInterrupt`` raised to the caller
and, in the run directory, either

* nothing but the released lock (the interrupt came before the first record), or
* the run recorded ``interrupted``, every file it lists verifying, and a resume ending on the
  uninterrupted run's final hash, or
* the run recorded ``complete`` with that hash (the interrupt came while the last record
  was written: held back until it was).

Never ``running``, never ``failed``. The counter-examples kept below as named tests:

* SIGINT inside the last commit (``RunWriter.finish``): its ``finally`` released the lock,
  nothing was left to record ``interrupted``, and the manifest kept the ``running`` of the
  commit before (read back as "its process ended without recording it: killed or crashed");
* SIGINT inside the first record (``RunWriter.start``): an empty ``history.jsonl`` and no
  manifest, which kept the command from removing the directory it had created;
* SIGINT inside a pydantic ``model_serializer`` (a manifest section's, a config's): pydantic
  raised it as a ``PydanticSerializationError``, and the run was recorded ``failed``;
* SIGINT while the lock is taken: the lock stayed held by this process;
* SIGINT while ``fathom`` reads its command line: a Python traceback.

Sweeps run by hand with the same tracer (every 97th event of a run, every 61st of a resume,
every 5th of the last record; random events of a 4-run study, of ``fathom train``,
``fathom curvature``, ``fathom report`` and ``fathom audit``) found nothing else
(``FATHOM_HYPOTHESIS=long`` explores more here).
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import threading
from pathlib import Path

import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fathom
from conftest import synthetic_splits, tiny_config
from fathom.base.interrupts import cut_by_interrupt
from fathom.rundir import RunDir, RunManifest, RunWriter
from fathom.rundir.lock import RUN_LOCK
from fathom.train.loop import resume, train

pytestmark = pytest.mark.skipif(
    threading.current_thread() is not threading.main_thread(), reason="signals: main thread"
)

SOURCE = str(Path(fathom.__file__).parent) + os.sep
"""Events of frames whose code lives here are counted (torch's and the stdlib's are not)."""


def _call_traced(
    call, fire, sig: int = signal.SIGINT, where: str = SOURCE
) -> tuple[int, bool, object]:
    """``call()`` with a tracer that counts the events of code under ``where`` (Fathom's;
    ``""``: all) and sends ``sig`` at the first for which ``fire(index, frame, event)``
    holds: ``(events, sent, outcome)``, the outcome being what ``call`` returned or the
    ``KeyboardInterrupt`` it raised."""
    seen = 0
    sent = False

    def tracer(frame, event, arg):
        nonlocal seen, sent
        if frame.f_code.co_filename.startswith(where):
            if not sent and fire(seen, frame, event):
                sent = True
                os.kill(os.getpid(), sig)
            seen += 1
        return tracer

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        sys.settrace(tracer)
        try:
            outcome = call()
        finally:
            sys.settrace(None)
    except KeyboardInterrupt as e:
        outcome = e
    finally:
        signal.signal(signal.SIGINT, previous)
    return seen, sent, outcome


def _train_traced(run: Path, splits, cfg, fire) -> tuple[int, bool, bool]:
    """:func:`train` into ``run`` under :func:`_call_traced`: ``(events, sent, raised)``."""
    events, sent, outcome = _call_traced(lambda: train(cfg, run, splits=splits), fire)
    return events, sent, isinstance(outcome, KeyboardInterrupt)


def _first_call_after(entered, code):
    """A ``fire`` for :func:`_train_traced`: the first call of ``code`` once a frame of
    ``entered`` has run."""
    inside = {"entered": False}

    def fire(_, frame, event):
        if frame.f_code is entered:
            inside["entered"] = True
        return inside["entered"] and frame.f_code is code and event == "call"

    return fire


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    """The uninterrupted run, traced: its event count and final hash. A first run in a
    process makes ~1,300 events more than the next (imports, caches): the count is taken
    after a warm-up, so that every drawn event lies within a run."""
    splits, cfg = synthetic_splits(), tiny_config(**{"optim.epochs": 2})
    root = tmp_path_factory.mktemp("sigint-anywhere")
    train(cfg, root / "warm-up", splits=splits)  # first-call work (imports, caches) done
    run = root / "reference"
    events, sent, raised = _train_traced(run, splits, cfg, lambda *_: False)
    assert (sent, raised) == (False, False)
    m = RunDir(run).manifest
    assert m["status"] == "complete"
    return {
        "splits": splits,
        "cfg": cfg,
        "events": events,
        "final": m["hashes"]["final_params"],
        "root": run.parent,
    }


def _check_after_sigint(reference: dict, run: Path, sent: bool, raised: bool) -> str:
    """The outcome (``unstarted``, ``interrupted`` or ``complete``), checked as the module
    docstring says."""
    assert sent, "the interrupt point lies past the run's events"
    assert raised, "the interrupt was swallowed"
    if not (run / "manifest.json").exists():
        left = [p.name for p in run.rglob("*") if p.is_file()]
        assert set(left) <= {RUN_LOCK}, left
        assert all((run / name).stat().st_size == 0 for name in left)  # released
        return "unstarted"
    rd = RunDir(run)
    recorded = rd.status
    assert recorded in ("interrupted", "complete"), recorded
    assert rd.problems() == [], rd.problems()
    if recorded == "interrupted":
        resume(run, splits=reference["splits"])
        rd = RunDir(run)
        assert rd.status == "complete" and rd.problems() == []
    assert rd.manifest["hashes"]["final_params"] == reference["final"]
    return recorded


@settings(max_examples=8, deadline=None)
@given(data=st.data())
def test_sigint_at_any_event_is_recorded_and_resumes_to_the_same_hash(reference, data):
    at = data.draw(st.integers(0, reference["events"] - 1), label="event")
    run = Path(tempfile.mkdtemp(prefix=f"at-{at}-", dir=reference["root"])) / "run"
    _, sent, raised = _train_traced(
        run, reference["splits"], reference["cfg"], lambda i, *_: i == at
    )
    _check_after_sigint(reference, run, sent, raised)


def test_sigint_inside_the_last_commit_records_the_run_complete(reference):
    """The counter-example: SIGINT at the first event of the manifest's serialisation inside
    ``RunWriter.finish`` (it left ``running``); now the run is recorded ``complete`` and the
    interrupt raised after."""
    fire = _first_call_after(RunWriter.finish.__code__, RunManifest.to_json.__code__)

    run = reference["root"] / "last-commit"
    _, sent, raised = _train_traced(run, reference["splits"], reference["cfg"], fire)
    assert _check_after_sigint(reference, run, sent, raised) == "complete"


def test_sigterm_inside_the_last_commit_records_the_run_complete(reference):
    """The same under ``sigterm_interrupts`` (``fathom train``'s: ``kill PID``, a scheduler's
    stop): SIGTERM is held back like Ctrl-C."""
    from fathom.base.interrupts import sigterm_interrupts

    fire = _first_call_after(RunWriter.finish.__code__, RunManifest.to_json.__code__)

    def call():
        with sigterm_interrupts():
            return train(reference["cfg"], run, splits=reference["splits"])

    run = reference["root"] / "last-commit-sigterm"
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)  # what sigterm_interrupts takes over
    try:
        _, sent, outcome = _call_traced(call, fire, signal.SIGTERM)
    finally:
        signal.signal(signal.SIGTERM, previous)
    raised = isinstance(outcome, KeyboardInterrupt)
    assert _check_after_sigint(reference, run, sent, raised) == "complete"


def test_sigint_in_the_first_record_leaves_nothing_or_an_interrupted_run(reference):
    """The interrupt inside ``RunWriter.start`` (the first manifest): either nothing was
    written or the run was recorded ``interrupted`` and resumes to the same hash."""
    fire = _first_call_after(RunWriter.start.__code__, RunManifest.to_json.__code__)

    run = reference["root"] / "first-record"
    _, sent, raised = _train_traced(run, reference["splits"], reference["cfg"], fire)
    assert _check_after_sigint(reference, run, sent, raised) in ("unstarted", "interrupted")


def test_sigint_inside_a_manifest_serializer_is_recorded_interrupted(reference):
    """The counter-example of the serializers: SIGINT inside the ``selected`` section's
    ``model_serializer`` (nested in the manifest's) while epoch 0's manifest is written.
    It reached the trainer as a ``PydanticSerializationError`` and the run was recorded
    ``failed``."""
    from fathom.rundir.sections import Selected
    from fathom.train.session import Session

    code = Selected._val_loss_when_set.__code__
    fire = _first_call_after(Session.write_manifest.__code__, code)
    run = reference["root"] / "in-a-manifest-serializer"
    _, sent, raised = _train_traced(run, reference["splits"], reference["cfg"], fire)
    assert _check_after_sigint(reference, run, sent, raised) == "interrupted"


def test_sigint_inside_a_config_serializer_before_the_run_leaves_nothing(reference):
    """SIGINT inside the loss table's ``model_serializer`` (nested in the run config's) while
    the first manifest is built: it escaped ``train`` as a ``PydanticSerializationError``."""
    from fathom.config.run import LossConfig
    from fathom.train.session import build_session

    fire = _first_call_after(build_session.__code__, LossConfig._own_options.__code__)
    run = reference["root"] / "in-a-config-serializer"
    _, sent, raised = _train_traced(run, reference["splits"], reference["cfg"], fire)
    assert _check_after_sigint(reference, run, sent, raised) == "unstarted"


def test_sigint_while_the_lock_is_taken_gives_it_back(reference):
    """SIGINT inside ``DirLock.acquire``: the interrupt is raised with the lock released
    (it stayed held by this process, and a second writer here was refused)."""
    from fathom.rundir.lock import DirLock

    fire = _first_call_after(DirLock.acquire.__code__, DirLock._acquire.__code__)
    run = reference["root"] / "in-the-lock"
    _, sent, raised = _train_traced(run, reference["splits"], reference["cfg"], fire)
    assert _check_after_sigint(reference, run, sent, raised) == "unstarted"
    train(reference["cfg"], run, splits=reference["splits"])  # the lock is free again
    assert RunDir(run).manifest["hashes"]["final_params"] == reference["final"]


class _Inner(pydantic.BaseModel):
    x: int = 1

    @pydantic.model_serializer(mode="wrap")
    def _dump(self, handler):
        return _raise(handler(self))


class _Outer(pydantic.BaseModel):
    inner: _Inner = _Inner()

    @pydantic.model_serializer(mode="wrap")
    def _dump(self, handler):
        return handler(self)


_RAISED: list[type[BaseException]] = []


def _raise(data):
    if _RAISED:
        raise _RAISED[0]("from a serializer")
    return data


@pytest.mark.parametrize("model", [_Inner, _Outer], ids=["outermost", "nested"])
@pytest.mark.parametrize("raised", [KeyboardInterrupt, ValueError], ids=["ctrl-c", "error"])
def test_a_ctrl_c_in_disguise_is_told_from_a_serializer_error(model, raised):
    """pydantic wraps an exception raised in a serializer: with it as ``__cause__`` when
    that serializer is the outermost, by name only when it is nested. Either way a Ctrl-C is
    told apart from a real error."""
    _RAISED[:] = [raised]
    try:
        with pytest.raises(Exception) as caught:  # pydantic's wrapper, or the error itself
            model().model_dump()
    finally:
        _RAISED.clear()
    assert cut_by_interrupt(caught.value) == (raised is KeyboardInterrupt)


def test_fathom_train_says_a_late_ctrl_c_found_the_run_finished(tmp_path, capsys):
    """``fathom train`` interrupted inside its last commit: exit 130, and it says the run
    finished (it printed "complete, 1 of 1 epochs (completed epochs are kept)")."""
    from done_means_models import write_toml
    from fathom.cli import main
    from interrupt_models import write_features_npz

    npz = write_features_npz(tmp_path / "features.npz", n=200)
    config = write_toml(
        tmp_path / "run.toml",
        {
            "name": "late",
            "study": "sigint",
            "seed": 3,
            "device": "cpu",
            "data": {"dataset": "tensors", "path": str(npz)},
            "model": {"kind": "python", "factory": "interrupt_models:interruptible_mlp"},
            "optim": {"lr": 0.05, "batch_size": 16, "epochs": 1},
            "telemetry": {"enabled": False},
        },
    )
    runs = tmp_path / "runs"
    fire = _first_call_after(RunWriter.finish.__code__, RunManifest.to_json.__code__)
    argv = ["train", str(config), "--runs-dir", str(runs), "--quiet"]
    _, sent, rc = _call_traced(lambda: main(argv), fire)
    assert sent and rc == 130
    err = capsys.readouterr().err
    assert "interrupted once the run had finished: complete, 1 of 1 epochs" in err, err
    rd = RunDir(runs / "sigint" / "late")
    assert rd.status == "complete" and rd.problems() == []


def _ctrl_c_in_disguise() -> Exception:
    """The ``PydanticSerializationError`` a Ctrl-C inside a nested serializer becomes."""
    _RAISED[:] = [KeyboardInterrupt]
    try:
        _Outer().model_dump()
    except Exception as e:
        return e
    finally:
        _RAISED.clear()
    raise AssertionError("the serializer raised nothing")


def test_live_tracking_passes_a_ctrl_c_in_disguise_on():
    """Live tracking swallows its own errors (training goes on, the error is reported at
    close); a Ctrl-C that pydantic wrapped is not one of them."""
    from types import SimpleNamespace

    from fathom.export.live import LiveTracker

    def poll():
        raise wrapped

    wrapped = _ctrl_c_in_disguise()
    tracker = SimpleNamespace(error=None, poll=poll)
    with pytest.raises(KeyboardInterrupt):
        LiveTracker.__call__(tracker, "epoch", {})
    assert tracker.error is None

    def failing_poll():
        raise ValueError("the backend refused a row")

    tracker = SimpleNamespace(error=None, poll=failing_poll, last_epoch=3)
    LiveTracker.__call__(tracker, "epoch", {})  # a real error is kept for the close
    assert "ValueError: the backend refused a row" in tracker.error


def test_ctrl_c_while_the_command_line_is_read_is_said_without_a_traceback(capsys):
    """SIGINT while ``fathom`` builds its parser (the command's module imported): exit 130
    and one line (it escaped ``main`` as a ``KeyboardInterrupt``: a Python traceback)."""
    from fathom.cli import build_parser, main

    fire = _first_call_after(main.__code__, build_parser.__code__)
    _, sent, rc = _call_traced(lambda: main(["train", "--help-not-reached"]), fire)
    assert sent and rc == 130
    err = capsys.readouterr().err
    assert err == "fathom: interrupted before the command started; nothing was written\n"
