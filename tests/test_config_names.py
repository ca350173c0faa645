"""Names are one directory component: run, study and depth-scaling names never leave
``--runs-dir`` (:func:`fathom.config.models.check_name`, the one validator)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fathom.config import RunConfig
from fathom.config.models import NAME_MAX_BYTES, check_name
from fathom.errors import FathomError
from fathom.study.config import validate_study_config

BAD = ["", ".", "..", "../../outside", "/abs/path", "a/b", "a\\b", "a\x00b", ".hidden", "a\nb"]


def _study(name: str) -> dict:
    return {"study": {"name": name, "reference": "plain", "recipes": ["plain"], "lr": 0.1}}


def _refused(name: str) -> bool:
    """The rule, written independently of check_name: what a path join could escape or hide."""
    return (
        name == ""
        or name.startswith(".")
        or any(c in "/\\" or ord(c) < 32 or ord(c) == 127 for c in name)
        or len(name.encode("utf-8")) > NAME_MAX_BYTES
    )


@settings(max_examples=200)
@given(st.text(st.characters(codec="utf-8"), max_size=20) | st.sampled_from(BAD))
@example("x" * (NAME_MAX_BYTES + 1))
@example("é" * (NAME_MAX_BYTES // 2 + 1))
def test_every_name_is_one_component_or_refused(name: str) -> None:
    for key in ("name", "study"):
        if _refused(name):
            with pytest.raises(
                FathomError, match=rf"{key}: the name .*use one plain directory name"
            ):
                RunConfig().with_updates({key: name})
        else:
            cfg = RunConfig().with_updates({key: name})
            root = Path("/r")
            path = root / cfg.study / cfg.name
            assert path.parent.parent == root and ".." not in path.parts
    if _refused(name):
        with pytest.raises(FathomError, match="study.name: the name"):
            validate_study_config(_study(name))
    else:
        assert validate_study_config(_study(name)).study.name == name


def test_check_name_is_the_one_rule() -> None:
    assert check_name("main-plain-s101") == "main-plain-s101"
    with pytest.raises(ValueError, match="empty"):
        check_name("")


@pytest.mark.parametrize(
    "setting", ["name=../../outside", "name=", "study=/abs/path", "study=..", "study="]
)
def test_train_refuses_an_escaping_name_and_writes_nothing(
    setting: str, tmp_path: Path, capsys, monkeypatch
) -> None:
    from fathom.cli import main

    runs = tmp_path / "a" / "b" / "runs"
    runs.mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert (
        main(["train", "--runs-dir", str(runs), "--set", setting, "--set", "optim.epochs=1"]) == 2
    )
    err = capsys.readouterr().err
    assert "use one plain directory name" in err
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == [
        Path("a"),
        Path("a/b"),
        Path("a/b/runs"),
    ]
