"""A study rerun after a source edit does not mix code versions silently: refused, or (with
--allow-source-change) every run's source hash listed and the mix flagged in the summary."""

from __future__ import annotations

import pytest

from fathom.base.provenance import source_hash
from fathom.errors import FathomError
from fathom.study.config import validate_study_config
from fathom.study.runner import run_study
from test_study import local, study_data

EDITED = "e" * 64  # the source hash after an edit


def _study(seeds: list[int]):
    return validate_study_config(
        study_data(
            study={"recipes": ["residual"], "seeds": seeds, "lr": 0.05},
            tuning={"enabled": False},
        )
    )


def test_a_rerun_after_a_source_edit_is_refused_or_flagged(tmp_path, monkeypatch) -> None:
    first = run_study(_study([101]), tmp_path, local())
    assert first.summary["sources"]["mixed"] is False
    assert first.summary["sources"]["hashes"] == {source_hash(): ["main-residual-s101"]}
    assert "one source version" in (first.root / "summary.md").read_text()

    monkeypatch.setattr("fathom.study.sources.source_hash", lambda: EDITED)
    monkeypatch.setattr("fathom.train.session.source_hash", lambda: EDITED)
    with pytest.raises(FathomError, match=r"main-residual-s101 \(.*would mix code versions"):
        run_study(_study([101, 102]), tmp_path, local())
    assert not (first.root / "main-residual-s102").exists()  # refused before any training

    mixed = run_study(_study([101, 102]), tmp_path, local(), allow_source_change=True)
    src = mixed.summary["sources"]
    assert src["mixed"] is True
    assert src["hashes"] == {source_hash(): ["main-residual-s101"], EDITED: ["main-residual-s102"]}
    md = (mixed.root / "summary.md").read_text()
    assert "MIXED SOURCE" in md and "main-residual-s101" in md and "main-residual-s102" in md
