"""File-system failures of a run directory, exercised portably: read-only, immutable and
unwritable locations, and a full disk at each write a run makes.

We run as root, where permission bits do not apply, so :func:`failing_fs` makes the
low-level calls behind ``fathom.base.io`` and ``fathom.rundir`` (``os.open``, ``open``,
``os.mkdir``, ``os.replace`` ...) raise the ``OSError`` a kernel would for paths under one
directory, from a chosen moment on. Every case checks what a user sees (a ``FathomError``
naming the path, the errno and its meaning and the fix; CLI exit 2; no traceback) and
that nothing already written is lost: the run still verifies with ``RunDir``, and a resume
on a healthy disk ends byte-identical to an uninterrupted run. Where the tests do not run
as root, :func:`test_real_permissions` repeats the read-only case with ``chmod``.
"""

from __future__ import annotations

import builtins
import errno
import io
import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from done_means_models import write_toml
from fathom.cli import main
from fathom.rundir import RunDir
from interrupt_models import write_features_npz

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "tests") not in sys.path:  # the factory's module, as a user's would be
    sys.path.insert(0, str(ROOT / "tests"))

EPOCHS = 3
MEANING = {
    errno.EROFS: ("EROFS", "read-only", "choose a writable"),
    errno.EPERM: ("EPERM", "not permitted", "lsattr"),
    errno.EACCES: ("EACCES", "permission denied", "permissions"),
    errno.ENOSPC: ("ENOSPC", "the disk is full", "free space"),
}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


def failing_fs(
    monkeypatch: pytest.MonkeyPatch,
    root: Path,
    code: int,
    *,
    when: Callable[[str, Path], bool] = lambda _op, _path: True,
) -> None:
    """Make every write under ``root`` (creating, opening for writing, renaming, removing)
    raise ``OSError(code)`` whenever ``when(operation, path)`` is true; reads still work.

    ``when`` is called only for writes under ``root``; a stateful ``when`` picks the moment
    (the third history append, the second manifest commit).
    """
    root = Path(root).resolve()

    def hit(op: str, path: object) -> bool:
        if isinstance(path, int):
            return False
        p = Path(os.fsdecode(path)).resolve()
        return (p == root or root in p.parents) and when(op, p)

    def refuse(path: object) -> None:
        raise OSError(code, os.strerror(code), os.fsdecode(path))

    real = {n: getattr(os, n) for n in ("open", "mkdir", "replace", "rename", "unlink", "chmod")}
    real_open = io.open

    def fake_os_open(path, flags, mode=0o777, *, dir_fd=None):
        if flags & _WRITE_FLAGS and hit("open", path):
            refuse(path)
        return real["open"](path, flags, mode, dir_fd=dir_fd)

    def fake_mkdir(path, mode=0o777, *, dir_fd=None):
        if os.path.lexists(path):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), os.fsdecode(path))
        if hit("mkdir", path):
            refuse(path)
        return real["mkdir"](path, mode, dir_fd=dir_fd)

    def two_paths(name: str):
        def fake(src, dst, **kw):
            if hit(name, src) or hit(name, dst):
                refuse(dst)
            return real[name](src, dst, **kw)

        return fake

    def one_path(name: str):
        def fake(path, *args, **kw):
            if hit(name, path):
                refuse(path)
            return real[name](path, *args, **kw)

        return fake

    def fake_open(file, mode="r", *args, **kw):
        if any(c in mode for c in "wax+") and hit(f"open-{mode}", file):
            refuse(file)
        return real_open(file, mode, *args, **kw)

    monkeypatch.setattr(os, "open", fake_os_open)
    monkeypatch.setattr(os, "mkdir", fake_mkdir)
    for name in ("replace", "rename"):
        monkeypatch.setattr(os, name, two_paths(name))
    for name in ("unlink", "chmod"):
        monkeypatch.setattr(os, name, one_path(name))
    monkeypatch.setattr(io, "open", fake_open)
    monkeypatch.setattr(builtins, "open", fake_open)


def nth(n: int, op: str, name: str) -> Callable[[str, Path], bool]:
    """True from the ``n``-th write ``op`` of a file whose name starts with ``name`` on."""
    seen = [0]

    def when(o: str, path: Path) -> bool:
        if o.startswith(op) and path.name.startswith(name):
            seen[0] += 1
        return seen[0] >= n

    return when


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("oserr")
    npz = write_features_npz(tmp / "features.npz", n=300)
    return write_toml(
        tmp / "run.toml",
        {
            "name": "mlp",
            "study": "oserr",
            "seed": 5,
            "device": "cpu",
            "data": {"dataset": "tensors", "path": str(npz)},
            "model": {"kind": "python", "factory": "interrupt_models:interruptible_mlp"},
            "optim": {"lr": 0.05, "batch_size": 32, "epochs": EPOCHS},
            "eval": {"every": 1},
            "checkpoints": {"save_epochs": [0, 1, EPOCHS]},
            "telemetry": {"enabled": False},
        },
    )


@pytest.fixture(scope="module")
def reference(config, tmp_path_factory) -> str:
    """The final parameter hash of the run trained on a healthy disk."""
    runs = tmp_path_factory.mktemp("ref")
    assert main(["train", str(config), "--runs-dir", str(runs), "--quiet"]) == 0
    return RunDir(runs / "oserr" / "mlp").manifest["hashes"]["final_params"]


def train_cli(config: Path, runs: Path, capsys, *extra: str) -> str:
    """``fathom train`` that must fail cleanly: exit 2, no traceback; returns stderr."""
    rc = main(["train", str(config), "--runs-dir", str(runs), "--quiet", *extra])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err
    return err


def assert_explains(err: str, code: int, path: Path) -> None:
    """The message names the path, the errno, what it means and what to do."""
    name, meaning, fix = MEANING[code]
    assert str(path) in err, err
    assert name in err and meaning in err.lower() and fix in err, err


def assert_intact(run: Path, status: str) -> None:
    rd = RunDir(run)
    assert rd.problems() == [], rd.problems()
    assert rd.status == status


# -- where a run directory cannot be created ----------------------------------------------
@pytest.mark.parametrize("code", [errno.EROFS, errno.EPERM, errno.EACCES])
def test_unwritable_runs_dir(config, tmp_path, monkeypatch, capsys, code):
    runs = tmp_path / "runs"
    runs.mkdir()
    failing_fs(monkeypatch, runs, code)
    err = train_cli(config, runs, capsys)
    assert_explains(err, code, runs / "oserr")
    assert list(runs.iterdir()) == []


def test_unwritable_runs_dir_of_a_study(tmp_path, monkeypatch, capsys):
    runs = tmp_path / "runs"
    runs.mkdir()
    failing_fs(monkeypatch, runs, errno.EROFS)
    rc = main(["study", "run", "ciresan-sd-quick", "--runs-dir", str(runs), "--workers", "1"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err, err
    assert_explains(err, errno.EROFS, runs)


# -- an existing run on a file system that became read-only or immutable ------------------
@pytest.mark.parametrize("code", [errno.EROFS, errno.EPERM])
def test_resume_on_a_read_only_run_is_refused_at_the_lock(
    config, reference, tmp_path, monkeypatch, capsys, code
):
    runs = tmp_path / "runs"
    failing_fs(
        monkeypatch, runs, code, when=nth(2, "open", ".resume.safetensors.")
    )  # epoch 1 not saved
    err = train_cli(config, runs, capsys)
    run = runs / "oserr" / "mlp"
    assert_explains(err, code, run)
    assert "could not be recorded" in err  # the manifest cannot be written either
    monkeypatch.undo()
    assert_intact(run, "running")  # its last commit: epoch 0, resumable
    failing_fs(monkeypatch, runs, code)  # the whole run: not even the lock file opens
    rc = main(["train", "--resume", str(run), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err, err
    assert_explains(err, code, run)
    assert "lock" in err
    monkeypatch.undo()
    assert_intact(run, "running")
    assert main(["train", "--resume", str(run), "--quiet"]) == 0
    assert RunDir(run).manifest["hashes"]["final_params"] == reference


# -- a full disk at each write of a run ----------------------------------------------------
@pytest.mark.parametrize(
    ("moment", "when", "lasting"),
    [
        ("the third history append", lambda: nth(3, "open-a", "history.jsonl"), False),
        ("the third history append, disk stays full", lambda: nth(3, "open-a", "history"), True),
        ("the third manifest commit", lambda: nth(3, "open", ".manifest.json."), False),
        ("an epoch checkpoint", lambda: nth(1, "open", ".epoch-0001."), False),
    ],
)
def test_disk_full_during_training(
    config, reference, tmp_path, monkeypatch, capsys, moment, when, lasting
):
    runs = tmp_path / "runs"
    trigger = when()
    if lasting:  # once full, every later write fails too
        full = [False]

        def stays(op: str, path: Path) -> bool:
            full[0] = full[0] or trigger(op, path)
            return full[0]

        failing_fs(monkeypatch, runs, errno.ENOSPC, when=stays)
    else:  # one write fails (the disk was freed at once)
        fired = [False]

        def once(op: str, path: Path) -> bool:
            if not fired[0] and trigger(op, path):
                fired[0] = True
                return True
            return False

        failing_fs(monkeypatch, runs, errno.ENOSPC, when=once)
    err = train_cli(config, runs, capsys)
    run = runs / "oserr" / "mlp"
    assert_explains(err, errno.ENOSPC, run)
    monkeypatch.undo()
    rd = RunDir(run)
    assert rd.problems() == [], f"{moment}: {rd.problems()}"
    if lasting:
        assert rd.status == "running"  # the failure itself could not be recorded
        assert "could not be recorded" in err
    else:
        assert rd.status == "failed"
        assert rd.manifest["failure"] == {
            "type": "FathomError",
            "errno": "ENOSPC",
            "environment": True,
        }
    assert main(["train", "--resume", str(run), "--quiet"]) == 0
    assert RunDir(run).manifest["hashes"]["final_params"] == reference


# -- fathom curvature on a run it may not write into ---------------------------------------
@pytest.fixture(scope="module")
def trained(config, tmp_path_factory) -> Path:
    runs = tmp_path_factory.mktemp("curv")
    assert main(["train", str(config), "--runs-dir", str(runs), "--quiet"]) == 0
    return runs / "oserr" / "mlp"


@pytest.mark.parametrize("code", [errno.EROFS, errno.EPERM])
@pytest.mark.parametrize(
    ("command", "out"),
    [
        (["curvature", "--probe", "8"], "curvature"),
        (["audit", "--no-router", "--quiet"], "audit"),
        (["report", "--no-figures"], "report"),
        (["export", "--to", "jsonl"], "exports/jsonl"),
    ],
)
def test_analyses_of_a_read_only_run(trained, monkeypatch, capsys, code, command, out):
    failing_fs(monkeypatch, trained, code)
    rc = main([command[0], str(trained), *command[1:]])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err, err
    assert_explains(err, code, trained / out)
    assert "--out" in err
    monkeypatch.undo()
    assert_intact(trained, "complete")
    assert not (trained / out.split("/")[0]).exists()


def test_curvature_of_a_read_only_run_writes_elsewhere(trained, tmp_path, monkeypatch):
    failing_fs(monkeypatch, trained, errno.EROFS)
    out = tmp_path / "curv"
    assert main(["curvature", str(trained), "--probe", "8", "--out", str(out)]) == 0
    assert (out / "summary.json").exists()
    monkeypatch.undo()
    assert_intact(trained, "complete")


def test_curvature_output_write_fails_midway(trained, tmp_path, monkeypatch, capsys):
    out = tmp_path / "curv"
    failing_fs(monkeypatch, out, errno.ENOSPC, when=nth(2, "open", ".epoch-"))
    rc = main(["curvature", str(trained), "--probe", "8", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err, err
    assert_explains(err, errno.ENOSPC, out)
    monkeypatch.undo()
    assert_intact(trained, "complete")
    assert not list(out.glob(".*.tmp"))  # no half-written file left behind


# -- real permission bits ------------------------------------------------------------------
def _without_dac_override() -> None:
    """In this (forked) process: drop CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH from the
    effective and permitted capability sets (``capset(2)``), so that even root obeys
    permission bits from now on."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()  # 2 x {effective, permitted, inheritable}
    if libc.capget(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    dac = (1 << 1) | (1 << 2)  # linux/capability.h: CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
    data[0] &= ~dac  # effective (capabilities 0-31)
    data[1] &= ~dac  # permitted
    if libc.capset(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def cli_obeying_permissions(forked, *args: str) -> tuple[int, str]:
    """``fathom ARGS`` in a process for which permission bits apply (as root too): a fork of
    this one (:mod:`forked`) that drops the capabilities letting root ignore them."""
    from fathom.cli import main

    def obeying() -> int:
        if os.geteuid() == 0:
            _without_dac_override()
        return main(list(args))

    proc = forked(obeying)
    _, err = proc.communicate(timeout=600)
    return proc.returncode, err


def test_real_permissions(config, tmp_path, forked):
    """Real mode bits (no patching): a runs directory without write permission, then
    ``fathom curvature`` on a run whose files are all read-only; root included, by running
    the command without the capabilities that let root ignore permission bits."""
    runs = tmp_path / "runs"
    runs.mkdir()
    runs.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        rc, err = cli_obeying_permissions(
            forked, "train", str(config), "--runs-dir", str(runs), "--quiet"
        )
        assert rc == 2 and "Traceback" not in err, err
        assert_explains(err, errno.EACCES, runs / "oserr")
    finally:
        runs.chmod(stat.S_IRWXU)
    assert list(runs.iterdir()) == []
    assert main(["train", str(config), "--runs-dir", str(runs), "--quiet"]) == 0
    run = runs / "oserr" / "mlp"
    for p in [run, *run.rglob("*")]:
        p.chmod(p.stat().st_mode & ~0o222)
    try:
        rc, err = cli_obeying_permissions(forked, "curvature", str(run), "--probe", "8")
        assert rc == 2 and "Traceback" not in err, err
        assert_explains(err, errno.EACCES, run / "curvature")
        assert_intact(run, "complete")  # reading works; only writing is refused
    finally:
        for p in [run, *run.rglob("*")]:
            p.chmod(p.stat().st_mode | 0o200)
