"""What a config file must say and what it names: a model chosen, factories that import,
data paths that exist, sizes within the limits, TOML that parses (``fathom.config.inputs``,
``fathom.config.limits``, ``fathom.config.tomlfile``). Every refusal is exit 2, names the
file and the fix, and writes nothing."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fathom.cli import main
from fathom.config import limits, load_toml, validate_run_config
from fathom.config.inputs import check_data_dir
from fathom.errors import FathomError
from fathom.study.family import MINIMAL_RUN, load_config


def _cli(argv: list[str], capsys) -> tuple[int, str, str]:
    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


def _tree(root: Path) -> list[Path]:
    return sorted(p.relative_to(root) for p in root.rglob("*"))


# -- a model must be chosen -------------------------------------------------------------

MODELLESS = {
    "empty": ("", "is empty"),
    "comment only": ("# nothing here\n", "is empty"),
    "no model table": ("[optim]\nlr = 0.05\n", "names no model"),
    "empty model table": ("[model]\n[optim]\nepochs = 2\n", "names no model"),
}


@pytest.mark.parametrize("case", MODELLESS, ids=list(MODELLESS))
def test_a_modelless_config_is_refused_by_validate_and_train(case, tmp_path, capsys) -> None:
    text, needle = MODELLESS[case]
    path = tmp_path / "cfg.toml"
    path.write_text(text)
    before = _tree(tmp_path)
    for argv in (["validate", str(path)], ["train", str(path), "--runs-dir", str(tmp_path)]):
        rc, _, err = _cli(argv, capsys)
        assert rc == 2 and f"{path} {needle}" in err, err
        assert "[model]" in err and "ciresan-fast" in err and "Traceback" not in err
        assert "for 100 epochs" in err  # the default it would have trained, from RunConfig
    assert _tree(tmp_path) == before


def test_the_example_the_refusal_shows_is_a_valid_small_run(tmp_path) -> None:
    path = tmp_path / "minimal.toml"
    path.write_text("\n".join(line.strip() for line in MINIMAL_RUN.splitlines()))
    cfg, _ = load_config(str(path))
    assert cfg.model.widths == (256, 128) and cfg.optim.epochs == 5  # type: ignore[union-attr]


def test_train_without_a_config_needs_model_keys(tmp_path, capsys) -> None:
    rc, _, err = _cli(["train", "--runs-dir", str(tmp_path / "runs")], capsys)
    assert rc == 2 and "no config is given" in err and "--set" in err
    assert not (tmp_path / "runs").exists()
    # with model keys the config is the user's choice: it passes validation (then fails on
    # the missing data path, before anything is written)
    sets = ["model.widths=[8,8]", "data.dataset=tensors", f"data.path={tmp_path / 'x.npz'}"]
    argv = ["train", "--runs-dir", str(tmp_path / "runs"), *[a for s in sets for a in ("--set", s)]]
    rc, _, err = _cli(argv, capsys)
    assert rc == 2 and "data.path" in err and "does not exist" in err
    assert not (tmp_path / "runs").exists()


def test_presets_and_studies_are_not_modelless() -> None:
    for name in ("ciresan-fast", "ciresan-fidelity", "staged-conv-lif-quick", "ciresan-sd-quick"):
        load_config(name)


# -- factories import and data paths exist ------------------------------------------------


@pytest.fixture
def user_module(tmp_path, monkeypatch) -> str:
    """A module ``fathom_user_mod`` on ``sys.path`` with a factory ``make`` and a constant."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "fathom_user_mod.py").write_text("def make(**kw):\n    pass\nN = 3\n")
    (tmp_path / "pkg" / "fathom_user_mod_broken.py").write_text("1 / 0\n")
    monkeypatch.syspath_prepend(str(tmp_path / "pkg"))
    monkeypatch.delitem(sys.modules, "fathom_user_mod", raising=False)
    return "fathom_user_mod"


FACTORY_CASES = {
    "model ok": ('[model]\nkind = "python"\nfactory = "{m}:make"\n', None),
    "model no module": (
        '[model]\nkind = "python"\nfactory = "{m}_typo:make"\n',
        "cannot import module 'fathom_user_mod_typo'",
    ),
    "model no attribute": (
        '[model]\nkind = "python"\nfactory = "{m}:mkae"\n',
        "has no attribute 'mkae'",
    ),
    "model not callable": ('[model]\nkind = "python"\nfactory = "{m}:N"\n', "not a function"),
    "model module fails": (
        '[model]\nkind = "python"\nfactory = "{m}_broken:make"\n',
        "importing its module raised ZeroDivisionError",
    ),
    "data factory missing": (
        '[data]\ndataset = "python"\nfactory = "{m}:nope"\n[model]\nwidths = [8, 8]\n',
        "data.factory",
    ),
    "data path missing": (
        '[data]\ndataset = "tensors"\npath = "{d}/none.npz"\n[model]\nwidths = [8, 8]\n',
        "data.path",
    ),
    "data path a directory": (
        '[data]\ndataset = "tensors"\npath = "{d}"\n[model]\nwidths = [8, 8]\n',
        "is a directory",
    ),
    "data dir missing": ('[data]\ndata_dir = "{d}/nope"\n[model]\nwidths = [8, 8]\n', "data_dir"),
    "study base data dir": (
        '[study]\nname = "s"\nrecipes = ["plain"]\nreference = "plain"\nlr = 0.05\n'
        '[tuning]\nenabled = false\n[base.model]\nwidths = [8, 8]\n[base.data]\ndata_dir = "{d}/nope"\n',
        "data.data_dir",
    ),
    "depth scaling data dir": (
        'kind = "depth_scaling"\ndepths = [4]\ndata_dir = "{d}/nope"\n',
        "data_dir",
    ),
}


@pytest.mark.parametrize("case", FACTORY_CASES, ids=list(FACTORY_CASES))
def test_validate_imports_factories_and_checks_paths(case, user_module, tmp_path, capsys):
    text, needle = FACTORY_CASES[case]
    path = tmp_path / "cfg.toml"
    path.write_text(text.format(m=user_module, d=tmp_path))
    rc, out, err = _cli(["validate", str(path)], capsys)
    if needle is None:
        assert rc == 0 and f"model.factory {user_module}:make: imported, callable" in out
        return
    assert rc == 2 and needle in err and str(path) in err, err
    assert "Traceback" not in err


def test_validate_of_a_python_model_does_not_build_it(tmp_path, monkeypatch, capsys) -> None:
    """The factory is found, never called (building a model is the run's work)."""
    (tmp_path / "fathom_user_boom.py").write_text(
        "def make(**kw):\n    raise SystemExit('called')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "cfg.toml"
    path.write_text('[model]\nkind = "python"\nfactory = "fathom_user_boom:make"\n')
    assert _cli(["validate", str(path)], capsys)[0] == 0


def test_data_fetch_and_verify_refuse_a_missing_data_dir(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("FATHOM_CACHE", str(tmp_path / "cache"))
    for action in ("fetch", "verify"):
        rc, out, err = _cli(["data", action, "mnist", "--data-dir", str(tmp_path / "no")], capsys)
        assert rc == 2 and out == "" and "does not exist" in err and "leave --data-dir out" in err
    assert _tree(tmp_path) == []  # no directory created, no cache written
    assert check_data_dir(str(tmp_path), "--data-dir", "mnist") == str(tmp_path)


# -- sizes within the limits -------------------------------------------------------------

LIMITS = [
    ("optim.epochs", limits.MAX_EPOCHS),
    ("optim.batch_size", limits.MAX_EXAMPLES),
    ("data.fit_subset", limits.MAX_EXAMPLES),
    ("data.eval_subset", limits.MAX_EXAMPLES),
    ("data.val_size", limits.MAX_EXAMPLES),
    ("eval.batch_size", limits.MAX_EXAMPLES),
    ("eval.every", limits.MAX_EPOCHS),
    ("telemetry.probe_size", limits.MAX_EXAMPLES),
    ("checkpoints.resume_every", limits.MAX_EPOCHS),
]


def _nested(key: str, value: object) -> dict:
    section, field = key.split(".")
    return {"model": {"widths": [8, 8]}, section: {field: value}}


@pytest.mark.parametrize(("key", "limit"), LIMITS, ids=[k for k, _ in LIMITS])
def test_sizes_beyond_their_limit_are_refused_naming_it(key: str, limit: int) -> None:
    validate_run_config(_nested(key, limit))  # the limit itself is accepted
    with pytest.raises(FathomError, match=f"{key}: Input should be less than or equal to {limit}"):
        validate_run_config(_nested(key, limit + 1))


@settings(max_examples=60, deadline=None)
@given(n=st.integers(min_value=-(2**70), max_value=2**70))
@example(n=10**12)
@example(n=limits.MAX_EPOCHS + 1)
@example(n=0)
def test_epochs_are_accepted_exactly_within_one_to_the_limit(n: int) -> None:
    ok = 1 <= n <= limits.MAX_EPOCHS
    try:
        cfg = validate_run_config({"model": {"widths": [8, 8]}, "optim": {"epochs": n}})
    except FathomError:
        assert not ok
    else:
        assert ok and cfg.optim.epochs == n


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[optim]\nepochs = 1e12\n", "optim.epochs: Input should be a valid integer"),
        ("[data]\nfit_subset = 1e10\n", "data.fit_subset: Input should be a valid integer"),
        ("[data]\nfit_subset = 10000000000\n", "less than or equal to 1000000000"),
        ("[model]\nwidths = [8, 8]\nwidth_mult = 1000.0\n", None),
        ("[model]\nwidths = [2000, 8]\nwidth_mult = 1000.0\n", "exceed 1048576 units"),
        ("[model]\nkind = 'staged_conv'\ndepth = 40000\n", "exceeds 10000 layers"),
        ("[model]\nkind = 'staged_conv'\ntimesteps = 1000000\n", "less than or equal to 10000"),
        ("seed = 9223372036854775808\n", "seed: Input should be less than 9223372036854775808"),
        ("[data]\nsplit_seed = -1\n", "data.split_seed: Input should be greater than or equal"),
    ],
)
def test_absurd_sizes_in_a_file_are_refused(text, needle, tmp_path, capsys) -> None:
    path = tmp_path / "cfg.toml"
    model = "" if "[model]" in text else "[model]\nwidths = [8, 8]\n"
    path.write_text(text + model)
    rc, _, err = _cli(["validate", str(path)], capsys)
    if needle is None:
        assert rc == 0, err
    else:
        assert rc == 2 and needle in err and str(path) in err, err


def test_depth_scaling_sizes_have_the_same_limits() -> None:
    with pytest.raises(FathomError, match="less than or equal to 100000"):
        load_config_data({"kind": "depth_scaling", "depths": [4], "epochs": 10**6})
    with pytest.raises(FathomError, match="exceeds 10000 layers"):
        load_config_data({"kind": "depth_scaling", "depths": [40000]})


def load_config_data(data: dict) -> object:
    from fathom.study.family import validate_config

    return validate_config(data, "case")


# -- every TOML failure is a FathomError -------------------------------------------------

TOML_CASES = {
    "deep array": ("a = " + "[" * 5000 + "]" * 5000, "nests arrays or inline tables too deeply"),
    "deep inline table": ("a = " + "{b = " * 3000 + "1" + "}" * 3000, "too deeply"),
    "syntax": ("[optim\nlr = 1\n", "is not valid TOML"),
    "duplicate key": ("a = 1\na = 2\n", "is not valid TOML"),
}


@pytest.mark.parametrize("case", TOML_CASES, ids=list(TOML_CASES))
def test_every_toml_failure_is_a_clean_error(case, tmp_path, capsys) -> None:
    text, needle = TOML_CASES[case]
    path = tmp_path / "cfg.toml"
    path.write_text(text)
    for argv in (["validate", str(path)], ["train", str(path), "--runs-dir", str(tmp_path)]):
        rc, _, err = _cli(argv, capsys)
        assert rc == 2 and needle in err and str(path) in err and "Traceback" not in err, err
    assert _tree(tmp_path) == [Path("cfg.toml")]


def test_unreadable_toml_files_are_clean_errors(tmp_path) -> None:
    (tmp_path / "bin.toml").write_bytes(b"a = '\xff\xfe'\n")
    with pytest.raises(FathomError, match="is not UTF-8 text"):
        load_toml(tmp_path / "bin.toml")
    (tmp_path / "dir.toml").mkdir()
    with pytest.raises(FathomError, match="is a directory, not a TOML file"):
        load_toml(tmp_path / "dir.toml")
    with pytest.raises(FathomError, match="does not exist"):
        load_toml(tmp_path / "none.toml")


@settings(max_examples=80, deadline=None)
@given(raw=st.binary(max_size=200) | st.text(alphabet="[]{}=a1\"'.,\n #", max_size=200))
@example(raw=b"a = " + b"[" * 2000)
@example(raw="x = [[[[[[[[[{y = 1}]]]]]]]]]")
def test_any_bytes_load_or_fail_with_a_fathom_error(raw, tmp_path_factory) -> None:
    """A file of any content: its tables, or a FathomError — never another exception."""
    path = tmp_path_factory.mktemp("toml") / "cfg.toml"
    path.write_bytes(raw if isinstance(raw, bytes) else raw.encode())
    try:
        assert isinstance(load_toml(path), dict)
    except FathomError as e:
        assert str(path) in str(e)


def test_a_run_refused_while_it_sets_up_leaves_nothing(tmp_path, capsys) -> None:
    """Bad input found once training began to set up (a subset larger than the data): exit 2
    and no directory left behind, neither the run's nor the parents the command made."""
    import numpy as np

    np.savez(tmp_path / "d.npz", x=np.zeros((20, 4), "float32"), y=np.arange(20) % 2)
    path = tmp_path / "cfg.toml"
    path.write_text(
        f'device = "cpu"\n[data]\ndataset = "tensors"\npath = "{tmp_path / "d.npz"}"\n'
        "fit_subset = 1000\n[model]\nwidths = [4, 4]\n[optim]\nepochs = 1\n"
    )
    rc, _, err = _cli(["train", str(path), "--runs-dir", str(tmp_path / "a" / "runs")], capsys)
    assert rc == 2 and "fit_subset" in err
    assert not (tmp_path / "a").exists()


def test_study_and_depth_scaling_check_what_they_name_before_running(tmp_path, capsys) -> None:
    study = tmp_path / "study.toml"
    study.write_text(
        '[study]\nname = "s"\nrecipes = ["plain"]\nreference = "plain"\nlr = 0.05\n'
        f'[tuning]\nenabled = false\n[base.model]\nwidths = [8, 8]\n[base.data]\ndata_dir = "{tmp_path / "nope"}"\n'
    )
    runs = tmp_path / "runs"
    rc, _, err = _cli(["study", "run", str(study), "--runs-dir", str(runs)], capsys)
    assert rc == 2 and "data.data_dir" in err and str(study) in err
    argv = ["depth-scaling", "--preset", "quick", "--data-dir", str(tmp_path / "nope")]
    rc, _, err = _cli([*argv, "--out", str(runs)], capsys)
    assert rc == 2 and "data_dir (--data-dir)" in err and "does not exist" in err
    assert _tree(tmp_path) == [Path("study.toml")]


def _without_base_model(text: str) -> str:
    """A study preset's text with its ``[base.model]`` table removed."""
    out, skipping = [], False
    for line in text.splitlines():
        if line.startswith("["):
            skipping = line.strip() == "[base.model]"
        if not skipping:
            out.append(line)
    return "\n".join(out) + "\n"


def test_a_study_file_without_a_base_model_is_refused_before_any_run(tmp_path, capsys) -> None:
    from importlib import resources

    text = (resources.files("fathom") / "presets" / "ciresan-sd-quick.toml").read_text("utf-8")
    assert "[base.model]" in text
    path = tmp_path / "study.toml"
    path.write_text(_without_base_model(text))
    assert "model" not in load_toml(path).get("base", {})
    runs = str(tmp_path / "runs")
    for argv in (["validate", str(path)], ["study", "run", str(path), "--runs-dir", runs]):
        before = _tree(tmp_path)
        code, _, err = _cli(argv, capsys)
        assert code == 2 and "names no model (no [base.model] table" in err, err
        assert _tree(tmp_path) == before
    path.write_text(text)  # the preset itself, with its model, is a valid study file
    cfg, _ = load_config(str(path))
    assert cfg.kind == "study"
