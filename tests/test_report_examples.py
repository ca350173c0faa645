"""The mask and example explorer's data: every audited seed, within the stated page budget."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fathom.report.examples import (
    EXAMPLE_BUDGET_BYTES,
    MAX_EXAMPLES,
    MIN_EXAMPLES,
    choose_examples,
    mask_payload,
)
from synthetic_runs import write_study

RUNS = [f"{r}-s{s}" for r in ("residual", "sd_constant") for s in (101, 102, 103)]


@pytest.fixture(scope="module")
def audited(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)
    from synthetic_audit import write_audit

    root = tmp_path_factory.mktemp("examples") / "study"
    write_study(root, recipes=("residual", "sd_constant"), seeds=(101, 102, 103), layers=4)
    return root, write_audit(root, RUNS, examples=300)


def _size(per: dict) -> int:
    return len(json.dumps(per, separators=(",", ":")))


def test_every_audited_seed_has_examples(audited: tuple[Path, dict]) -> None:
    root, audit = audited
    payload = mask_payload(audit, root / "audit", {})
    keys = {t["key"] for t in payload["tables"]}
    assert keys == {f"{r}|{w}" for r in RUNS for w in ("selected", "final")}
    ex = payload["examples"]
    assert set(ex["per"]) == keys  # every seed of every arm, not only the first
    assert len(ex["indices"]) <= MAX_EXAMPLES and _size(ex["per"]) <= EXAMPLE_BUDGET_BYTES
    # a later seed's logits are its own .npz values on the shared example indices
    with np.load(root / "audit" / "sd_constant-s103" / "final.npz") as z:
        want = np.round(z["test/logits"][:, ex["indices"], :].astype(float), 3)
        masks = ["".join(str(int(b)) for b in m) for m in z["test/masks"]]
    got = ex["per"]["sd_constant-s103|final"]
    assert got["masks"] == masks and np.array_equal(np.array(got["logits"]), want)
    assert "12 audited (run, checkpoint) pairs" in ex["note"]


def test_budget_shrinks_the_example_set_then_names_what_it_drops(
    audited: tuple[Path, dict],
) -> None:
    root, audit = audited
    full = mask_payload(audit, root / "audit", {})["examples"]
    budget = _size(full["per"]) // 2
    half = mask_payload(audit, root / "audit", {}, budget=budget)["examples"]
    assert set(half["per"]) == set(full["per"])  # still every seed
    assert MIN_EXAMPLES <= len(half["indices"]) < len(full["indices"])
    assert _size(half["per"]) <= budget
    tiny = mask_payload(audit, root / "audit", {}, budget=budget // 8)["examples"]
    assert len(tiny["indices"]) <= MIN_EXAMPLES and _size(tiny["per"]) <= budget // 8
    dropped = sorted(set(full["per"]) - set(tiny["per"]))
    assert dropped and all(k in tiny["note"] for k in dropped)
    assert "over budget, mask tables only" in tiny["note"]


def test_choose_examples_by_hand() -> None:
    # 2 runs x 2 masks over 6 examples; counts of masks keeping each example right:
    a = np.array([[1, 1, 0, 1, 0, 0], [1, 0, 0, 1, 1, 0]], dtype=bool)
    b = np.array([[1, 1, 0, 0, 0, 0], [1, 1, 0, 1, 0, 0]], dtype=bool)
    # counts = [4, 3, 0, 3, 1, 0]: always right {0}, always wrong {2, 5}, mixed {1, 3, 4}
    assert choose_examples([a, b], 48) == [0, 1, 2, 3, 4, 5]
    # n_max = 9 keeps one mixed example (the one fewest masks keep right) plus 4 + 4
    assert choose_examples([a, b], 9) == [0, 2, 4, 5]
