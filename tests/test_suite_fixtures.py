"""The suite's shared fixtures keep their promises: the session's tiny run is the run
``tiny_config()`` trains, a copy is private, and a change to the shared run is noticed."""

from __future__ import annotations

from conftest import tiny_config, tree_digest
from fathom.rundir import RunDir
from fathom.train.loop import train


def without_clocks(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith("clock/")} for r in rows]


def test_shared_tiny_run_is_what_tiny_config_trains(trained_tiny_run, splits, tmp_path):
    fresh = train(tiny_config(), tmp_path / "fresh", splits=splits)
    shared = RunDir(trained_tiny_run)
    assert shared.status == "complete" and not shared.problems(deep=True)
    assert shared.manifest["hashes"] == RunDir(fresh.run_dir).manifest["hashes"]
    assert without_clocks(shared.history()) == without_clocks(RunDir(fresh.run_dir).history())


def test_a_copy_is_private(trained_tiny_run, tiny_run_copy):
    before = tree_digest(trained_tiny_run)
    assert tree_digest(tiny_run_copy) == before
    (tiny_run_copy / "history.jsonl").write_text("")
    (tiny_run_copy / "stray").write_bytes(b"x")
    assert tree_digest(trained_tiny_run) == before


def test_tree_digest_sees_a_flipped_byte_an_added_and_a_removed_file(tiny_run_copy):
    before = tree_digest(tiny_run_copy)
    path = tiny_run_copy / "checkpoints" / "epoch-0001.safetensors"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    flipped = tree_digest(tiny_run_copy)
    assert flipped != before and set(flipped) == set(before)
    (tiny_run_copy / "checkpoints" / "new").write_bytes(b"")
    assert set(tree_digest(tiny_run_copy)) == set(before) | {"checkpoints/new"}
    path.unlink()
    assert "checkpoints/epoch-0001.safetensors" not in tree_digest(tiny_run_copy)
