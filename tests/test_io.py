"""Atomic writes, JSONL reading, digests."""

from __future__ import annotations

import os
import stat

import torch

from fathom.base.io import (
    atomic_write_json,
    dumps,
    read_jsonl,
    state_dict_digest,
    tensor_digest,
)


def _append_jsonl(path, row) -> None:
    """One JSON line as a history writer appends it (canonical ``dumps`` plus newline)."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(dumps(row) + "\n")


def test_digest_covers_zero_dim_tensors_and_changes_with_bytes():
    a = {"n": torch.tensor(3), "w": torch.ones(2, 2)}
    b = {"n": torch.tensor(4), "w": torch.ones(2, 2)}
    assert state_dict_digest(a) != state_dict_digest(b)
    assert state_dict_digest(a) == state_dict_digest(dict(reversed(list(a.items()))))
    assert tensor_digest([("x", torch.zeros(0))]) != tensor_digest([("y", torch.zeros(0))])


def test_atomic_json_has_normal_mode_and_strict_nulls(tmp_path):
    p = tmp_path / "m.json"
    atomic_write_json(p, {"a": float("nan"), "b": [1.0, float("inf")]})
    assert p.read_text().count("null") == 2
    mode = stat.S_IMODE(os.stat(p).st_mode)
    assert mode & 0o044  # readable by others (not mkstemp's 0600), subject to umask
    assert not list(tmp_path.glob(".*.tmp"))


def test_truncated_jsonl_line_is_reported_not_accepted(tmp_path):
    p = tmp_path / "h.jsonl"
    _append_jsonl(p, {"epoch": 0})
    _append_jsonl(p, {"epoch": 1})
    with open(p, "a") as f:
        f.write('{"epoch": 2, "val/acc"')
    rows, bad = read_jsonl(p)
    assert [r["epoch"] for r in rows] == [0, 1]
    assert bad == [3]
