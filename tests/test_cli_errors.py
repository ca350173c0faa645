"""Errors met before any work say the fix, and cost no torch: each case reproduces a
mistake a new user made (a directory as the config, a table set to one word, an unknown
model kind, another command's preset, a pipeline name given to ``validate``, a run of
``fathom train`` looked up in the registry, a text file as ``.npz``, ``fathom ... | head``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fathom import cli
from test_cli import LIGHT_FORBIDDEN, SRC, run_fresh

CASES: tuple[tuple[tuple[str, ...], int, tuple[str, ...]], ...] = (
    (("train", "{d}/configs"), 2, ("is a directory, not a TOML file", "a.toml")),
    (("validate", "{d}/configs"), 2, ("is a directory, not a TOML file",)),
    (("study", "run", "{d}/configs"), 2, ("is a directory, not a TOML file",)),
    (("reproduce", "{d}/configs"), 2, ("pipeline", "is a directory, not a TOML file")),
    (
        ("train", "--runs-dir", "{d}/runs", "--set", "optim.schedule=cosine"),
        2,
        ("'optim.schedule' is a table of keys (kind, ", "--set optim.schedule.kind=cosine"),
    ),
    (
        ("train", "--runs-dir", "{d}/runs", "--set", "optim.schedule.kind=cosine"),
        2,
        ("(got 'cosine') (did you mean 'warmup_cosine'?)",),
    ),
    (
        ("train", "--runs-dir", "{d}/runs", "--set", "model.kind=resnet"),
        2,
        ("model.kind: unknown kind 'resnet'", "choose one of ciresan, staged_conv, python"),
    ),
    (
        ("study", "run", "ciresan-fast", "--runs-dir", "{d}/runs"),
        2,
        ("'ciresan-fast' is not a study", "train it with `fathom train ciresan-fast`"),
    ),
    (
        ("study", "run", "seed-003", "--runs-dir", "{d}/runs"),
        2,
        ("run it with `fathom reproduce seed-003`",),
    ),
    (
        ("validate", "quick"),
        0,
        (
            "'quick' names two presets",
            "valid depth_scaling config",
            "reproduce pipeline quick: valid pipeline (study ciresan-seed-003-quick",
        ),
    ),
    (
        ("validate", "seed-003"),
        0,
        ("reproduce pipeline seed-003: valid pipeline (study ciresan-seed-003: valid study",),
    ),
    (("validate", "seed-03"), 2, ("did you mean 'reproduce seed-003'?",)),
    (
        ("runs", "show", "toy", "--runs-dir", "{d}/runs"),
        2,
        (
            "not in the registry (`fathom train` and `fathom study run` index",
            "fathom.load_run(",
            "runs/lone/toy",
        ),
    ),
)
"""(argv, exit status, texts the output holds); ``{d}``: a folder holding ``configs/a.toml``
and ``runs/lone/toy/manifest.json`` (a run directory of ``fathom train``: no registry)."""


def test_errors_before_work_say_the_fix_and_import_no_torch(tmp_path: Path):
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "a.toml").write_text("[optim]\nlr = 0.1\n")
    (tmp_path / "runs" / "lone" / "toy").mkdir(parents=True)
    (tmp_path / "runs" / "lone" / "toy" / "manifest.json").write_text("{}")
    argvs = [[a.format(d=tmp_path) for a in argv] for argv, _, _ in CASES]
    for (argv, want, texts), (_, code, heavy, out) in zip(CASES, run_fresh(argvs)):
        assert [m for m in heavy if m in LIGHT_FORBIDDEN] == [], (argv, heavy)
        assert code == want, (argv, code, out[-800:])
        for text in texts:
            assert text in out, (argv, text, out[-800:])
        if want == 2:
            assert "Traceback" not in out and "got {" not in out, (argv, out[-800:])
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["lone"]  # nothing written


def test_a_closed_pipe_ends_quietly_like_a_unix_tool():
    """``fathom validate ciresan-sd | head``: the reader is gone before the first write; the
    command stops with no message and the status a shell gives ``yes | head`` (SIGPIPE)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "fathom", "validate", "ciresan-sd"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"},
    )
    proc.stdout.close()  # the reader leaves at once (the child is still importing)
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == cli.SIGPIPE_STATUS == 141
    assert err == ""


def test_a_reader_gone_inside_a_command_is_quiet(capsys, monkeypatch):
    """The same in-process: a ``BrokenPipeError`` raised by a command's print, or an
    ``EPIPE`` the command turned into its own :class:`FathomError`, prints nothing."""
    import errno
    import types

    from fathom.errors import os_error

    def broken(args):
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")

    def wrapped(args):
        raise os_error(BrokenPipeError(errno.EPIPE, "Broken pipe"), "write the table")

    for func in (broken, wrapped):
        parser = types.SimpleNamespace(
            parse_args=lambda argv, f=func: types.SimpleNamespace(func=f, command="x")
        )
        monkeypatch.setattr(cli, "build_parser", lambda command, p=parser: p)
        assert cli.main(["x"]) == 141
        assert capsys.readouterr() == ("", "")


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b"hello, these are my numbers\n1 2 3\n", "it starts with b'hell', e.g. a text file"),
        (b"", "it is empty"),
        (b"\x93NUMPY\x01\x00", "it is a .npy array"),
    ],
)
def test_a_file_that_is_no_npz_archive_is_named_without_numpy_pickle_talk(
    tmp_path: Path, capsys, content: bytes, said: str
):
    (tmp_path / "mine.npz").write_bytes(content)
    (tmp_path / "run.toml").write_text(
        f'[data]\ndataset = "tensors"\npath = "{tmp_path}/mine.npz"\n[model]\nwidth_mult = 0.1\n'
    )
    assert (
        cli.main(["train", str(tmp_path / "run.toml"), "--runs-dir", str(tmp_path / "runs")]) == 2
    )
    err = capsys.readouterr().err
    assert (
        "is not a readable .npz (not a zip archive: " in err
        and said in err
        and "numpy.savez" in err
    )
    assert "pickle" not in err
    assert not (tmp_path / "runs").exists()  # refused before anything is written


def test_runs_list_and_show_say_where_the_runs_of_fathom_train_are(tmp_path: Path, capsys):
    """A registry holding a study's run, and a run of ``fathom train`` beside it: ``runs
    list`` lists the study's run and says the other is not in the registry; ``runs show`` of
    the other names its directory and how to read it."""
    from fathom.study.registry import COLUMNS, Registry, registry_path

    runs = tmp_path / "runs"
    for run in ("s/main-plain-s101", "default/toy"):
        (runs / run).mkdir(parents=True)
        (runs / run / "manifest.json").write_text("{}")
    row = dict.fromkeys(name for name, _ in COLUMNS)
    row |= {"run_id": "main-plain-s101", "study": "s", "phase": "main", "recipe": "plain"}
    row |= {
        "seed": 101,
        "lr": 0.03,
        "status": "complete",
        "updated_at": "2026-12-01T00:00:00+00:00",
    }
    row["directory"] = str((runs / "s" / "main-plain-s101").resolve())
    Registry(registry_path(runs)).upsert([row])
    assert cli.main(["runs", "list", "--runs-dir", str(runs)]) == 0
    out = capsys.readouterr().out
    assert "main-plain-s101" in out
    assert f"note: 1 run directories not listed ({runs}/default/toy)" in out
    assert "a run trained by an older fathom, or copied here, is not indexed" in out
    assert cli.main(["runs", "show", "toy", "--runs-dir", str(runs)]) == 2
    err = capsys.readouterr().err
    assert "no run 'toy' in the registry" in err and f"fathom.load_run('{runs}/default/toy')" in err


FAST_CASES: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = (
    (("train", "--resume", "{run}"), ("is already complete (2 of 2 epochs)", "fathom report")),
    (
        ("train", "ciresan-fast", "--runs-dir", "{d}/runs", "--set", "study=s", "--name", "r"),
        ("already holds a run (complete, 2 of 2 epochs)", "choose another --name"),
    ),
    (("train", "ciresan-fast", "--runs-dir", "{d}/afile"), ("is a file, not a directory",)),
    (("study", "run", "ciresan-sd-quick", "--workers", "0"), ("--workers must be at least 1",)),
    (("study", "run", "ciresan-sd-quick", "--runs-dir", "{d}/afile"), ("--runs-dir",)),
    (("reproduce", "quick", "--workers", "0"), ("--workers must be at least 1",)),
    (("depth-scaling", "--preset", "quick", "--workers", "0"), ("--workers must be at least 1",)),
    (("report", "{run}", "--out", "{d}/afile"), ("--out", "is a file, not a directory")),
    (("report", "{d}/nowhere"), ("does not exist; pass a run directory",)),
    (("audit", "{run}", "--out", "{d}/afile"), ("--out", "is a file, not a directory")),
    (("curvature", "{run}", "--out", "{d}/afile"), ("--out", "is a file, not a directory")),
    (("train", "ciresan-fast", "--set", "loss.name=mes"), ("loss.name", "did you mean 'mse'")),
    (("curvature", "{run}", "--loss", "mes"), ("loss.name", "did you mean 'mse'")),
    (("curvature", "{run}", "--loss", "mse"), ("loss.target = 'one_hot'",)),
    (
        ("curvature", "{run}", "--label-smoothing", "0.1", "--loss", "bce_with_logits"),
        ("loss.label_smoothing is an option of cross_entropy",),
    ),
)
"""(argv, texts the error holds): mistakes refused before torch is imported; ``{d}`` holds a
file ``afile`` and ``runs/s/r``, a complete synthetic run ``{run}`` (2 epochs)."""

CUDA_CASES: tuple[tuple[str, ...], ...] = (
    ("train", "ciresan-fast", "--device", "cuda"),
    ("audit", "{run}", "--device", "cuda"),
    ("curvature", "{run}", "--device", "cuda"),
    ("diagnose", "head", "--device", "cuda"),
    ("telemetry", "qualify", "ciresan-fast", "--device", "cuda"),
    ("depth-scaling", "--preset", "quick", "--device", "cuda"),
)
"""``--device cuda`` where the installed torch is the CPU build the suite runs on."""


def test_errors_met_before_work_import_no_torch(tmp_path: Path):
    """Each is refused with exit 2, its fix named, without importing torch (each costs
    Python's start-up only; ``bench/bench_cli_startup.py`` times them)."""
    from fathom.base.preflight import cuda_impossible
    from synthetic_runs import synthetic_history, write_run

    run = tmp_path / "runs" / "s" / "r"
    write_run(run, study="s", recipe="plain", seed=1, lr=0.1, rows=synthetic_history(1, [0, 1, 2]))
    (tmp_path / "afile").write_text("x")
    cases = list(FAST_CASES)
    if cuda_impossible() is not None:  # the CPU build: every --device cuda is refused early
        cases += [(argv, ("no CUDA device is available", "--device cpu")) for argv in CUDA_CASES]
    argvs = [[a.format(d=tmp_path, run=run) for a in argv] for argv, _ in cases]
    for (argv, texts), (_, code, heavy, out) in zip(cases, run_fresh(argvs)):
        assert [m for m in heavy if m in LIGHT_FORBIDDEN] == [], (argv, heavy)
        assert code == 2, (argv, code, out[-800:])
        for text in texts:
            assert text in out, (argv, text, out[-800:])
        assert "Traceback" not in out, (argv, out[-800:])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "runs"]  # nothing written


def test_cuda_impossible_reads_the_build_from_version_text(monkeypatch):
    """The fields of torch's ``version.py`` as its builds write them."""
    from fathom.base import preflight

    text = "__version__ = '2.13.0+cpu'\ncuda: Optional[str] = None\nhip: Optional[str] = None\n"
    assert preflight._torch_build_field(text, "cuda") == "None"
    assert preflight._torch_build_field(text, "__version__") == "'2.13.0+cpu'"
    assert preflight._torch_build_field("cuda = '12.4'\n", "cuda") == "'12.4'"
    assert preflight._torch_build_field("cudnn = 1\n", "cuda") is None
    import torch  # imported: torch itself answers

    assert (preflight.cuda_impossible() is None) == torch.cuda.is_available()
