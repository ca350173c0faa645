"""The typed manifest (``fathom.rundir.record.RunManifest``, format 3) and the writer methods.

* the trainer never indexes or mutates a manifest (an AST check of ``src/fathom/train``,
  itself shown to catch each kind of mutation);
* what the writer writes is the typed manifest, byte for byte canonical, and reads back;
* format 3 is validated as a whole (a closed section refuses an unknown key, a missing
  section is refused), formats 1 and 2 are read by their header;
* unknown top-level sections round-trip, through a resume too;
* the refactor left training numerics alone: final parameter hashes equal to a plain
  PyTorch loop's on the same plans, and a killed-and-resumed run ends with the uninterrupted
  run's hashes.
"""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from conftest import synthetic_splits, tiny_config
from fathom.errors import FathomError
from fathom.rundir import FORMAT, RunDir, RunManifest, seal
from fathom.rundir.header import TYPED_FROM
from fathom.train.loop import resume, train

TRAIN = Path(__file__).resolve().parents[1] / "src" / "fathom" / "train"
MUTATORS = {"update", "setdefault", "pop", "popitem", "clear", "append", "extend", "insert"}


# -- the trainer never touches the manifest's fields ----------------------------------------
def _name(node: ast.AST) -> str | None:
    return node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)


def _names_manifest(node: ast.AST, aliases: set[str]) -> bool:
    """Does the expression ``node`` reach into something named ``*manifest*`` (or an alias)?"""
    for sub in ast.walk(node):
        name = _name(sub)
        if isinstance(name, str) and ("manifest" in name.lower() or name in aliases):
            return True
    return False


def manifest_mutations(source: str) -> list[str]:
    """Every indexing or mutating use of a manifest in ``source``: ``manifest[...]`` (read or
    written), ``del``, assignment to its attributes, ``.update/.setdefault/...`` calls on it,
    through a local alias (``m = s.manifest``) too."""
    tree = ast.parse(source)
    aliases = {
        t.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and "manifest" in str(_name(node.value)).lower()
        for t in node.targets
        if isinstance(t, ast.Name)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and _names_manifest(node.value, aliases):
            found.append(f"line {node.lineno}: indexes {ast.unparse(node)}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in MUTATORS
            and _names_manifest(node.func.value, aliases)
        ):
            found.append(f"line {node.lineno}: mutates {ast.unparse(node.func)}(...)")
        elif isinstance(node, ast.Assign | ast.AugAssign | ast.Delete):
            targets = node.targets if isinstance(node, ast.Assign | ast.Delete) else [node.target]
            for t in targets:
                if isinstance(t, ast.Attribute) and _names_manifest(t.value, aliases):
                    found.append(f"line {node.lineno}: assigns {ast.unparse(t)}")
    return found


@pytest.mark.parametrize(
    "snippet",
    [
        's.manifest["stop"] = {}',
        'writer.manifest["status_reason"] = "x"',
        's.manifest["hashes"]["final_params"] = h',
        "s.manifest.update(epochs_completed=3)",
        'm = s.manifest; m["final"] = 1',
        "s.writer.manifest.status_reason = 'x'",
        'del s.manifest["stop"]',
        'x = s.manifest["epochs_completed"]',
        "s.manifest.recovery.append(e)",
        "m = self.writer.manifest\nm.stop = None",
    ],
)
def test_the_mutation_check_catches_each_kind_of_manifest_change(snippet):
    assert manifest_mutations(snippet), snippet


def test_the_trainer_never_indexes_or_mutates_a_manifest():
    found = {
        p.name: hits
        for p in sorted(TRAIN.glob("*.py"))
        if (hits := manifest_mutations(p.read_text()))
    }
    assert found == {}, f"change the manifest through fathom.rundir.RunWriter's methods: {found}"


# -- the written manifest is the typed one --------------------------------------------------
def test_a_written_manifest_is_the_typed_one_canonical_and_round_trips(trained_tiny_run):
    data = (trained_tiny_run / "manifest.json").read_bytes()
    manifest = json.loads(data)
    assert manifest["format"] == FORMAT >= TYPED_FROM
    assert data == (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()  # canonical
    typed = RunDir(trained_tiny_run).header
    assert isinstance(typed, RunManifest)
    again = typed.to_json()
    assert again == {k: v for k, v in manifest.items() if k != "integrity"}
    assert typed.hashes.final_params == manifest["hashes"]["final_params"] is not None
    assert typed.final.epoch == typed.epochs_completed == 3
    assert "stop" not in manifest and "failure" not in manifest  # written only when set


def _write(tmp_path: Path, manifest: dict) -> Path:
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    (run / "manifest.json").write_text(json.dumps(seal(manifest)))
    return run


#: closed sections (``fathom.rundir.sections``) and a path into each
CLOSED = [
    ("hashes",),
    ("model",),
    ("environment",),
    ("execution",),
    ("final",),
    ("selected",),
    ("data",),
    ("data", "sizes"),
    ("telemetry",),
]


@settings(max_examples=30)
@given(
    where=st.sampled_from(CLOSED),
    key=st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=12),
    old=st.sampled_from([1, 2]),
)
@example(where=("hashes",), key="final_param", old=2)  # a digest key misspelt by one byte
def test_a_closed_section_refuses_an_unknown_key_in_format_3_only(
    shared_tiny_run, tmp_path_factory, where, key, old
):
    manifest = json.loads((shared_tiny_run / "manifest.json").read_text())  # read only
    section = manifest
    for part in where:
        section = section[part]
    if key in section or (where == ("model",) and key == "class_"):
        return  # not unknown
    section[key] = 1
    tmp = tmp_path_factory.mktemp("closed")
    with pytest.raises(FathomError, match=rf"not a valid manifest \({'.'.join(where)}\.{key}:"):
        RunDir(_write(tmp, manifest))
    manifest["format"] = old  # the same content in an older format is read by its header
    assert RunDir(_write(tmp, manifest)).header.run_id == manifest["run_id"]


@pytest.mark.parametrize("section", ["data", "hashes", "environment", "telemetry", "execution"])
def test_a_format_3_run_without_a_section_is_refused_and_format_2_reads(
    trained_tiny_run, tmp_path, section
):
    manifest = json.loads((trained_tiny_run / "manifest.json").read_text())
    del manifest[section]
    with pytest.raises(FathomError, match=rf"{section}: Field required"):
        RunDir(_write(tmp_path, manifest))
    manifest["format"] = 2
    rd = RunDir(_write(tmp_path, manifest))
    assert not isinstance(rd.header, RunManifest) and rd.status == "complete"


def test_unknown_top_level_sections_and_open_sections_round_trip(trained_tiny_run):
    manifest = json.loads((trained_tiny_run / "manifest.json").read_text())
    manifest["depth_scaling"] = {"benchmark": "x", "arms": [1, 2]}
    manifest["clocks"]["training_cpu_s"] = 1.5  # a further clock
    manifest["data"]["info"]["source_note"] = {"any": ["thing"]}
    manifest["live"]["wandb"] = {"project": "p", "future_key": True}
    typed = RunManifest.model_validate(manifest)
    assert typed.to_json() == {k: v for k, v in manifest.items() if k != "integrity"}
    manifest["clocks"]["training_cpu_s"] = "soon"  # open, but each clock is seconds
    with pytest.raises(ValueError, match="training_cpu_s"):
        RunManifest.model_validate(manifest)


# -- numerics and the writer's paths ------------------------------------------------------
#: ``tiny_config(optim.epochs=2, **case)`` on ``synthetic_splits(n_fit=128, n_eval=64)``.
#: The writer's refactor was checked against ``main`` at 39c045e by the final hashes that
#: ``main`` produced (``a91f84d3…``, ``dd956cf9…``, ``5bb7b59d…``, recorded on the Intel host
#: of that session). Those bits belong to one CPU's BLAS code paths (an AMD EPYC host with
#: the same torch gives others), so the durable check is against a plain PyTorch loop run
#: here: :func:`reference_final_params`.
CASES = {
    "sgd": {},
    "adamw": {"optim.name": "adamw", "optim.lr": 0.003},
    "sd": {"model.recipe": "sd_constant"},
}
SPLITS = {"n_fit": 128, "n_eval": 64}


def reference_final_params(cfg) -> str:
    """The final ``state_dict_digest`` of ``cfg`` trained by a plain PyTorch loop.

    The trainer's *what* (initial weights, the epoch plans: permutation, gates, rates, each
    drawn from its seeded stream) with torch's own *how*: ``model(x)``, cross-entropy,
    ``loss.backward()``, ``optimizer.step()``, ``zero_grad()`` -- no Fathom stepper, step body,
    writer or evaluation.
    """
    import torch
    import torch.nn.functional as F

    from fathom.base.io import state_dict_digest
    from fathom.rundir.weights import cpu_state
    from fathom.train.build import build_controller, build_optimizer, init_model, stream_seed
    from fathom.train.plan import plan_epoch
    from fathom.train.session import split_classes

    splits = synthetic_splits(**SPLITS)
    classes = split_classes(splits, cfg.data.dataset)
    shape = tuple(int(d) for d in splits.fit_x.shape[1:])
    model = init_model(cfg, classes, int(splits.fit_x[0].numel()), shape, splits.fit_x[:2])
    controller = build_controller(model, cfg)
    optimizer = build_optimizer(model, cfg.optim)
    shuffle = torch.Generator().manual_seed(stream_seed(cfg.seed, "shuffle"))
    model.train()
    n_fit = int(splits.fit_y.shape[0])
    for epoch in range(1, cfg.optim.epochs + 1):
        plan = plan_epoch(epoch, n_fit, cfg.optim.batch_size, shuffle, controller, cfg.optim)
        for i in range(plan.steps):
            idx = plan.perm[plan.batch(i)]
            if controller is not None:
                controller.set_gains(plan.gain_values[i])
            loss = F.cross_entropy(model(splits.fit_x[idx]).float(), splits.fit_y[idx])
            loss.backward()
            for group in optimizer.param_groups:
                group["lr"] = float(plan.lrs[i])
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return state_dict_digest(cpu_state(model))  # the weights (no generator extra state)


def _cfg(case: dict):
    return tiny_config(**{"optim.epochs": 2, **case})


def _tiny(run: Path, case: dict, **kw):
    return train(_cfg(case), run, splits=synthetic_splits(**SPLITS), **kw)


@pytest.mark.parametrize("name", sorted(CASES))
def test_final_parameters_are_a_plain_torch_loops_and_a_resume_reproduces_them(tmp_path, name):
    case = CASES[name]
    expected = reference_final_params(_cfg(case))
    fresh = _tiny(tmp_path / "fresh", case)
    assert fresh.final_params == expected
    if name != "sd":
        return

    def stop_after_epoch_1(event, info):
        if event == "epoch_end" and info["epoch"] == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _tiny(tmp_path / "killed", case, progress=stop_after_epoch_1)
    killed = RunDir(tmp_path / "killed")
    assert killed.status == "interrupted"
    assert f"fathom train --resume {tmp_path / 'killed'}" in killed.manifest["status_reason"]
    resumed = resume(tmp_path / "killed", splits=synthetic_splits(**SPLITS))
    assert resumed.final_params == expected
    assert (
        RunDir(tmp_path / "killed").manifest["hashes"]
        == RunDir(tmp_path / "fresh").manifest["hashes"]
    )


def test_a_format_2_run_resumes_to_format_3_keeping_unknown_sections_and_a_refused_start_writes_nothing(
    tmp_path,
):
    case = CASES["sgd"]

    def stop(event, info):
        if event == "epoch_end" and info["epoch"] == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _tiny(tmp_path / "r", case, progress=stop)
    path = tmp_path / "r" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["tool_x"] = {"note": "written by another tool"}
    manifest["format"] = 2  # as main wrote it before format 3 (the same layout)
    path.write_text(json.dumps(seal(manifest)))
    assert not isinstance(RunDir(tmp_path / "r").header, RunManifest)  # read by its header
    before = path.read_bytes()
    with pytest.raises(FathomError, match="already holds a run"):
        _tiny(tmp_path / "r", case)  # refused before anything is written
    assert path.read_bytes() == before
    resume(tmp_path / "r", splits=synthetic_splits(**SPLITS))
    done = RunDir(tmp_path / "r")
    assert done.status == "complete" and done.manifest["tool_x"] == manifest["tool_x"]
    assert done.manifest["format"] == FORMAT and isinstance(done.header, RunManifest)
    assert done.manifest["hashes"]["final_params"] == reference_final_params(_cfg(case))


# -- what a resume compares, read the same way from every format ----------------------------
def _compared() -> list[tuple[str, str]]:
    from fathom.rundir.resume import _PROGRESS_AT_DONE, BOUND_FIELDS, UNCHANGED_ON_RESUME

    at_done = [(section, key) for _, key, section in _PROGRESS_AT_DONE if section]
    return sorted({*BOUND_FIELDS, *UNCHANGED_ON_RESUME, *at_done})


def test_every_compared_field_is_a_field_of_both_typed_records():
    """The tables of what a resume compares name fields of :class:`RecordedRun` and of the
    typed :class:`RunManifest`: a renamed field fails here, never switches a check off."""
    from fathom.rundir import RecordedRun

    for section, key in _compared():
        for record in (RecordedRun, RunManifest):
            assert key in record.model_fields[section].annotation.model_fields, (record, section)


def test_an_older_manifest_records_exactly_the_fields_it_holds(trained_tiny_run):
    """Property: a format-2 manifest lacking any subset of the compared fields reads with
    exactly the others ``given`` (values unchanged), and the resume state's record of it
    names exactly those of :data:`BOUND_FIELDS` it holds; read as format 3, every field."""
    from fathom.rundir.manifest import read_recorded
    from fathom.rundir.resume import BOUND_FIELDS, manifest_record

    written = json.loads((trained_tiny_run / "manifest.json").read_text())
    whole = read_recorded(written, "m")
    for section, key in _compared():
        assert getattr(getattr(whole, section), key) == written[section][key]

    @given(drop=st.sets(st.sampled_from(_compared())))
    def check(drop):
        m = json.loads(json.dumps(written))
        m["format"] = 2
        for section, key in drop:
            del m[section][key]
        r = read_recorded(m, "m")
        for section, key in _compared():
            held = getattr(r, section).given()
            assert (key in held) == ((section, key) not in drop)
            if key in held:
                assert held[key] == written[section][key]
        kept = {f"{s}.{k}" for s, k in BOUND_FIELDS if (s, k) not in drop}
        assert set(manifest_record(r)) == kept

    check()


def _format_2_interrupted(run: Path, change) -> bytes:
    """An interrupted run (stopped after epoch 1) whose manifest is rewritten as format 2,
    changed by ``change(manifest)`` and sealed again, as an older fathom (or a damage that
    kept the digest consistent) left it; returns the manifest's bytes."""

    def stop(event, info):
        if event == "epoch_end" and info["epoch"] == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _tiny(run, CASES["sgd"], progress=stop)
    path = run / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["format"] = 2
    change(manifest)
    path.write_text(json.dumps(seal(manifest)))
    assert not isinstance(RunDir(run).header, RunManifest)  # read by its header
    return path.read_bytes()


def _without_later_fields(m: dict) -> None:
    """What a format-2 manifest may lack: fields recorded only by later versions."""
    del m["data"]["tensors_sha256"], m["environment"]["matmul_precision"]
    del m["hashes"]["training_order"], m["steps_completed"]
    m["telemetry"] = None  # a section this version does not compare, in any shape


def test_an_older_manifest_lacking_later_fields_resumes_exactly_through_the_typed_record(
    tmp_path,
):
    """A format-2 manifest is read through :class:`RecordedRun` (``RunDir.recorded``): a field
    it lacks is absent (never a default that would compare), and the run resumes to the
    uninterrupted run's final parameters."""
    run = tmp_path / "r"
    _format_2_interrupted(run, _without_later_fields)
    recorded = RunDir(run).recorded
    assert "tensors_sha256" not in recorded.data.given() and recorded.data.tensors_sha256 is None
    assert "matmul_precision" not in recorded.environment.given()
    assert recorded.hashes.training_order is None and recorded.steps_completed is None
    assert recorded.environment.threads == RunDir(run).manifest["environment"]["threads"]
    written = RunDir(run).manifest
    assert recorded.done == written["epochs_completed"]
    assert set(recorded.checkpoints) == set(written["checkpoints"])
    resumed = resume(run, splits=synthetic_splits(**SPLITS))
    assert resumed.final_params == reference_final_params(_cfg(CASES["sgd"]))
    assert RunDir(run).manifest["format"] == FORMAT


def _records(m: dict, section: str, key: str, value) -> None:
    m[section][key] = value


#: A damaged format-2 manifest (its digest sealed again): the FathomError a resume gave
#: before it was read through the typed record, unchanged.
DAMAGED_FORMAT_2 = {
    "more epochs than the state's": (
        lambda m: m.update(epochs_completed=5),
        r"is at epoch \d+ but the manifest records 5 completed epochs",
    ),
    "another thread count": (
        lambda m: _records(m, "environment", "threads", 97),
        r"computed with environment.threads = \d+, the manifest records 97",
    ),
    "another run id": (
        lambda m: m.update(run_id="other"),
        r"belongs to another run: its run_id is 'r', the manifest's 'other'",
    ),
    "other data files": (
        lambda m: _records(m, "data", "files", {"x.npz": "0" * 64}),
        r"data.files recorded \{'x.npz'",
    ),
}


@pytest.mark.parametrize("damage", sorted(DAMAGED_FORMAT_2))
def test_a_damaged_older_manifest_is_refused_as_before_and_nothing_is_written(tmp_path, damage):
    change, match = DAMAGED_FORMAT_2[damage]
    run = tmp_path / "r"
    before = _format_2_interrupted(run, change)
    with pytest.raises(FathomError, match=match):
        resume(run, splits=synthetic_splits(**SPLITS))
    assert (run / "manifest.json").read_bytes() == before


@pytest.mark.parametrize(("section", "value"), [("data", "x"), ("environment", [1]), ("hashes", 3)])
def test_an_older_manifest_with_a_section_of_the_wrong_shape_is_refused_naming_it(
    tmp_path, section, value
):
    """Before the typed record, such a section surfaced as an ``AttributeError`` deep in a
    resume (or was read around); now the one read path refuses it, naming the section."""
    run = tmp_path / "r"
    before = _format_2_interrupted(run, lambda m: m.update({section: value}))
    with pytest.raises(FathomError, match=rf"not a valid manifest \({section}"):
        resume(run, splits=synthetic_splits(**SPLITS))
    assert (run / "manifest.json").read_bytes() == before


def test_a_target_stop_and_a_divergence_are_recorded_by_the_writer(tmp_path):
    stopped = _tiny(tmp_path / "stop", {"stop.target_test_acc": 0.01})
    m = RunDir(stopped.run_dir).header
    assert stopped.status == "complete" and m.stop is not None and m.stop.epoch == 1
    assert m.final.epoch == m.epochs_completed == 1 and m.hashes.final_params is not None
    diverged = _tiny(tmp_path / "div", {"optim.lr": 1e9})
    m = RunDir(diverged.run_dir).header
    assert diverged.status == "diverged" and m.diverged_epoch == diverged.diverged_epoch == 1
    assert m.final.epoch is None and m.hashes.final_params is None and m.stop is None
    assert m.epochs_completed == 1 and m.steps_completed == 4  # 128 examples, batches of 32


# -- the bytes the writer commits -----------------------------------------------------------
FIXTURES = Path(__file__).parent / "fixtures"
WRITTEN = (FIXTURES / "written_after_epoch_1.json", FIXTURES / "written_failed.json")
"""The ``manifest.json`` files :func:`_write_fixed_run` commits (after its first epoch, then
failed), byte for byte: how the writer turns its inputs into sections is pinned. A change of
the manifest's format changes them on purpose: regenerate them with
``PYTHONPATH=src:tests python tests/test_rundir_record.py`` and review the diff."""


def _fixed_manifest() -> RunManifest:
    config = {"name": "fixed", "seed": 7, "model": {"kind": "ciresan", "recipe": "residual"},
              "optim": {"lr": 0.03, "epochs": 3}}  # fmt: skip
    return RunManifest.model_validate(
        {
            "format": FORMAT,
            "run_id": "fixed",
            "status": "running",
            "config": config,
            "config_hash": "c" * 64,
            "source_hash": "s" * 64,
            "data": {
                "dataset": "tensors",
                "files": {"x.pt": "f" * 64},
                "split_mode": "random",
                "split_seed": 0,
                "split_hash": "h",
                "tensors_sha256": "t",
                "sizes": {"fit": 8, "val": 4, "test": 4},
                "info": {"classes": 3, "in_features": 5, "input_shape": [5], "own": [1]},
            },
            "model": {"kind": "ciresan", "class": "CiresanMLP", "parameters": 21},
            "hashes": {"initial_params": "i", "training_order": "o", "masks": "m"},
            "environment": {
                "python": "3",
                "torch": "2",
                "numpy": "2",
                "platform": "p",
                "machine": "m",
                "cpu_count": 2,
                "threads": 1,
                "device": "cpu",
                "device_name": "cpu",
                "dtype": "float32",
                "matmul_precision": "highest",
                "cuda": None,
                "cpu_allocator_tuned": False,
            },
            "telemetry": {"enabled": False},
            "execution": {"path": "eager", "precision": "fp32"},
        }
    )


def _write_fixed_run(path: Path) -> list[str]:
    """A run written through every section-setting method of :class:`RunWriter` with fixed
    inputs (fixed clocks, one further clock of a stepper's own, weights entries, a stop, a
    failure); the ``manifest.json`` text after the first commit of progress and at the end
    (read as bytes: ``read_text`` keeps them, the files are ASCII)."""
    from fathom.rundir import RunWriter
    from fathom.rundir.sections import Telemetry

    w = RunWriter(path).acquire()
    texts = []
    try:
        w.start(_fixed_manifest())
        w.row({"epoch": 1, "val/ce": 0.5, "test/acc": 0.75})
        entry = {
            "file": "checkpoints/epoch-0001.safetensors",
            "params_sha256": "p1",
            "sha256": "w1",
        }
        w.progress(
            epochs_completed=1,
            steps_completed=4,
            clocks={
                "training_s": 1.5,
                "training_cpu_s": 1.25,
                "evaluation_s": 0.5,
                "telemetry_s": None,
                "telemetry_cold_s": None,
                "checkpoint_s": 0.125,
                "elapsed_s": 3.0,
                "graph_capture_s": 0.25,
            },
            telemetry=Telemetry(enabled=False),
            training_order="o1",
            masks="m1",
            selected={"epoch": 1, "val_ce": 0.5},
            checkpoints={"1": entry},
            selected_checkpoint={**entry, "file": "checkpoints/selected.safetensors", "epoch": 1},
            graphs_captured=None,
        )
        w.commit()
        texts.append((path / "manifest.json").read_text())
        w.set_stop(target_test_acc=0.7, epoch=1, training_s=1.5, elapsed_s=3.0)
        w.set_final(final_params="p1", epoch=1, diverged_epoch=None)
        failure = {"type": "OSError", "errno": "ENOSPC", "environment": True}
        w.finish("failed", "OSError: disk full", failure=failure)
        texts.append((path / "manifest.json").read_text())
    finally:
        w.close()
    return texts


def test_the_writer_commits_the_pinned_bytes_for_fixed_inputs(tmp_path):
    """Each method that sets a section builds that section's type from its inputs; what is
    committed is the same bytes as pinned in :data:`WRITTEN` (every section, the open ones'
    own keys and the digests included), and reads back as the typed sections it was built
    from."""
    texts = _write_fixed_run(tmp_path / "fixed")
    assert texts == [p.read_text() for p in WRITTEN]
    m = RunDir(tmp_path / "fixed").record
    assert m.clocks.model_extra == {"graph_capture_s": 0.25} and m.clocks.training_s == 1.5
    assert m.final.epoch == 1 and m.selected.val_ce == 0.5 and m.status == "failed"
    assert m.failure is not None and m.failure.environment and m.checkpoints["1"].sha256 == "w1"
    assert m.selected_checkpoint is not None and m.selected_checkpoint.epoch == 1


# -- what readers take from the typed record, in every format -------------------------------
def _as_format_2(run: Path) -> Path:
    path = run / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["format"] = 2
    path.write_text(json.dumps(seal(manifest)))
    return run


def test_the_record_reads_what_the_manifest_holds_in_every_format(tiny_run_copy, tmp_path):
    """The fields readers take from ``RunDir.recorded`` (the selected epoch, the failure, the
    config's seed, rate and model, ``data.info``) are the manifest's as written: in format 3,
    and from the same manifest read as format 2 (its sections free-form)."""
    raw = RunDir(tiny_run_copy).manifest
    twin = _as_format_2(Path(shutil.copytree(tiny_run_copy, tmp_path / "old")))
    assert not isinstance(RunDir(twin).header, RunManifest)
    for run in (tiny_run_copy, twin):
        rd = RunDir(run)
        rec = rd.recorded
        assert (rec.selected.epoch, rec.selected.val_ce) == tuple(raw["selected"].values())
        assert "failure" not in raw and not rec.failure.environment and rec.failure.type is None
        assert rec.config.seed == raw["config"]["seed"]
        assert rec.config.optim.lr == raw["config"]["optim"]["lr"]
        model = raw["config"]["model"]
        assert (rec.config.model.kind, rec.config.model.recipe) == (model["kind"], model["recipe"])
        assert rec.data.info.as_json() == raw["data"]["info"] == rd.data_info
        assert rec.data.info.classes == raw["data"]["info"]["classes"] == rd.classes
        assert rec.data.info.input_shape == raw["data"]["info"]["input_shape"]
        assert rec.data.info.unigram_val_ce is None  # recorded by a language model's text only


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=4),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)
typed_info = st.fixed_dictionaries(
    {},
    optional={
        "classes": st.integers(1, 1000),
        "in_features": st.integers(1, 10**6),
        "input_shape": st.lists(st.integers(1, 64), max_size=3),
        "paths_base": st.text(max_size=8),
        "unigram_val_ce": st.floats(0, 20),
    },
)


@settings(max_examples=60)
@given(typed=typed_info, own=st.dictionaries(st.text(max_size=6), json_values, max_size=4))
@example(typed={"classes": 10, "unigram_val_ce": 5.5}, own={"mode": "random", "files": {}})
def test_data_info_reads_its_typed_keys_and_keeps_a_sources_own_as_written(typed, own):
    """``data.info`` is open: a source's own keys come back as written, beside the typed ones
    (absent: ``None``, never a default)."""
    from fathom.rundir.record import RecordedInfo

    info = {**{k: v for k, v in own.items() if k not in RecordedInfo.model_fields}, **typed}
    read = RecordedInfo.model_validate(info)
    assert read.as_json() == info
    for key in RecordedInfo.model_fields:
        assert getattr(read, key) == info.get(key)


def _unsealed(tmp_path: Path, manifest: dict) -> Path:
    """A manifest without a digest (read as unverified), for the fields it holds."""
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    return tmp_path


def _failed(tmp_path: Path, failure: dict | None) -> RunDir:
    manifest = {"format": 2, "kind": "run", "run_id": "f", "status": "failed",
                "status_reason": "OSError: disk full", "config": {}, "failure": failure}  # fmt: skip
    return RunDir(_unsealed(tmp_path, manifest))


def test_a_study_retries_a_run_whose_environment_failed_as_its_record_says(tmp_path):
    """``failure.environment`` (read through the record) decides a study's retry; a failure
    recorded as ``null`` or absent is the run's own (kept unless --retry-failed)."""
    from fathom.study.execute import _plan

    env = _failed(tmp_path, {"type": "OSError", "errno": "ENOSPC", "environment": True})
    assert env.recorded.failure.type == "OSError"
    assert _plan("failed", env, False) == (
        "retry",
        "retried (its environment failed); earlier failure: OSError: disk full",
    )
    own = _failed(tmp_path, {"type": "ValueError", "errno": None, "environment": False})
    assert _plan("failed", own, False) == ("keep", None)
    assert _plan("failed", _failed(tmp_path, None), False) == ("keep", None)
    assert _plan("failed", own, True)[0] == "retry"


@pytest.mark.parametrize(
    ("section", "value", "where"),
    [
        ("data", {"info": {"classes": "ten"}}, "data.info.classes"),
        ("selected", {"epoch": "last"}, "selected.epoch"),
        ("failure", {"environment": "maybe"}, "failure.environment"),
    ],
)
def test_a_typed_record_field_of_the_wrong_type_is_refused_naming_it(
    tmp_path, section, value, where
):
    manifest = {"format": 2, "kind": "run", "run_id": "w", "status": "complete", "config": {},
                section: value}  # fmt: skip
    with pytest.raises(FathomError, match=rf"not a valid manifest \({where}: "):
        _ = RunDir(_unsealed(tmp_path, manifest)).recorded


# -- the class count comes from the record, never a default ---------------------------------
def test_classes_come_from_the_record_or_a_registered_dataset_never_a_default(
    trained_tiny_run, tmp_path: Path
):
    """``RunDir.classes``: ``data.info.classes`` as recorded; an older (header-only) manifest
    without it takes its registered dataset's count, and a user's data is refused naming
    the field: no reader assumes MNIST's 10."""
    rd = RunDir(trained_tiny_run)
    assert rd.classes == rd.record.data.info["classes"]

    def old(data: dict, info: dict) -> RunDir:
        config = {"model": {"kind": "ciresan"}, "data": data}
        manifest = {"format": 2, "kind": "run", "run_id": "old", "status": "complete",
                    "config": config, "data": {"info": info}}  # fmt: skip
        (tmp_path / "manifest.json").write_text(json.dumps(manifest))
        return RunDir(tmp_path)

    assert old({"dataset": "cifar100"}, {}).classes == 100  # the registered dataset's
    assert old({"dataset": "tensors", "path": "x.pt"}, {"classes": 7}).classes == 7
    with pytest.raises(FathomError, match=r"run 'old': data.info.classes not given.*'tensors'"):
        _ = old({"dataset": "tensors", "path": "x.pt"}, {}).classes


def test_curvature_and_audit_records_hold_the_files_objects_unchanged(tmp_path):
    """The typed records keep every key and value of the JSON they read; absent gives None."""
    from fathom.rundir import read_audit, read_curvature

    assert read_curvature(tmp_path) is None and read_audit(tmp_path) is None
    summary = {
        "format": 1,
        "kind": "fathom.curvature.summary",
        "run_id": "r",
        "scope": {"split": "fit", "N": 4},
        "normalization": "mean over N",
        "rows": [{"epoch": 3, "ggn_weight_trace": 1.5}, {"epoch": 0, "ggn_weight_trace": 2.0}],
        "extra": [1, 2],
    }
    snap = {"epoch": 3, "families": {"ggn": {"trace": 1.5}}}
    (tmp_path / "curvature").mkdir()
    (tmp_path / "curvature" / "summary.json").write_text(json.dumps(summary))
    (tmp_path / "curvature" / "epoch-0003.json").write_text(json.dumps(snap))
    rec = read_curvature(tmp_path)
    assert rec.to_json() == {"summary": summary, "epochs": {3: snap}}
    assert rec.summary.run_id == "r" and rec.summary.scope == {"split": "fit", "N": 4}
    assert rec.summary.by_epoch() == {3: summary["rows"][0], 0: summary["rows"][1]}

    audit = {
        "kind": "study",
        "target": "S",
        "settings": {"checkpoints": ["final"]},
        "runs": [],
        "skipped": [{"run_id": "t"}],
        "aggregate": {"final": {}},
        "wall_s": 2.5,
        "x": 1,
    }
    (tmp_path / "audit").mkdir()
    (tmp_path / "audit" / "audit.json").write_text(json.dumps(audit))
    got = read_audit(tmp_path)
    assert got.raw == audit and got.kind == "study" and got.skipped == [{"run_id": "t"}]
    assert got.wall_s == 2.5 and got.settings == {"checkpoints": ["final"]}


def test_what_reports_read_of_a_manifest_is_typed_and_the_config_kept_as_written():
    """Status, phase, study, layers, clocks, the selected loss and the config object as
    recorded (ints stay ints, unknown keys kept); a ``null`` section reads as absent."""
    from fathom.rundir.manifest import read_recorded

    config = {
        "optim": {"lr": 1, "epochs": 3, "batch_size": 32},
        "seed": 7,
        "tags": {"arm": "x"},
        "data": {"dataset": "mnist", "split": "fit-val", "fit_subset": 600, "mine": [1]},
    }
    rec = read_recorded(
        {
            "run_id": "r",
            "study": "s",
            "phase": "tuning",
            "status": "complete",
            "config": config,
            "telemetry": {"layers": [{"name": "stem", "type": "Conv2d"}, {"type": "x"}]},
            "clocks": {"training_s": 0, "elapsed_s": 1.5, "other_s": None},
            "selected": {"epoch": 2, "val_loss": 0.25},
            "model": {"kind": "ciresan", "class": "C", "parameters": 12},
            "execution": {"path": "eager"},
        },
        "test",
    )
    assert (rec.study, rec.phase, rec.status) == ("s", "tuning", "complete")
    assert rec.config.as_json() == config and rec.config.optim.lr == 1.0
    assert type(rec.config.as_json()["optim"]["lr"]) is int  # as written, not coerced
    data = rec.config.data
    assert (data.dataset, data.split, data.fit_subset, data.context) == (
        "mnist",
        "fit-val",
        600,
        None,
    )
    assert data.as_json() == config["data"] and "context" not in data.given()
    assert (rec.config.optim.batch_size, rec.config.tags) == (32, {"arm": "x"})
    assert rec.telemetry.layer_names == ["stem"]
    assert list(rec.clocks.items()) == [("training_s", 0), ("elapsed_s", 1.5), ("other_s", None)]
    assert rec.selected.as_json() == {"epoch": 2, "val_loss": 0.25}
    assert type(rec.clocks["training_s"]) is int
    assert (rec.selected.epoch, rec.selected.val_loss, rec.final.epoch) == (2, 0.25, None)
    assert (rec.model.parameters, rec.execution.path) == (12, "eager")
    bare = read_recorded({"run_id": "r", "config": None, "telemetry": None}, "test")
    assert bare.config.as_json() == {} and bare.telemetry.layer_names is None
    assert "epoch" not in bare.selected.given() and bare.clocks is None
    assert "selected" not in bare.given() and bare.selected.as_json() == {}


def test_audit_rows_are_typed_and_a_malformed_row_is_refused_naming_it(tmp_path):
    """``runs`` rows read as :class:`AuditedRun` (unknown keys kept, a ``missing`` checkpoint
    not audited); a row without its seed is refused naming the row, or noted with notes."""
    from fathom.rundir import read_audit

    row = {
        "run_id": "main-plain-s1",
        "path": "main-plain-s1",
        "arm": "plain",
        "recipe": "plain",
        "seed": 1,
        "status": "complete",
        "config_hash": "c",
        "split_hash": "s",
        "checkpoints": {"final": {"epoch": 4, "k": 3}, "selected": {"missing": "no weights"}},
        "flags": {"final": []},
        "later": [1],
    }
    (tmp_path / "audit").mkdir()
    path = tmp_path / "audit" / "audit.json"
    path.write_text(json.dumps({"kind": "study", "runs": [row]}))
    (got,) = read_audit(tmp_path).runs
    assert (got.run_id, got.arm, got.recipe, got.seed, got.config_hash) == (
        "main-plain-s1",
        "plain",
        "plain",
        1,
        "c",
    )
    assert got.audited("final") == {"epoch": 4, "k": 3}
    assert got.audited("selected") is None and got.audited("other") is None
    assert got.model_dump() == row  # every key kept as written
    bad = {k: v for k, v in row.items() if k != "seed"}
    path.write_text(json.dumps({"kind": "study", "runs": [row, bad]}))
    with pytest.raises(
        FathomError, match=r"runs\[1\] is not an audited run \(seed: Field required"
    ):
        read_audit(tmp_path)
    notes: list[str] = []
    assert read_audit(tmp_path, notes) is None and "runs[1]" in notes[0]


def test_an_unreadable_curvature_file_is_noted_with_notes_and_refused_without(tmp_path):
    from fathom.rundir import read_audit, read_curvature

    (tmp_path / "curvature").mkdir()
    (tmp_path / "curvature" / "summary.json").write_text("{not json")
    (tmp_path / "curvature" / "epoch-0001.json").write_text("[1, 2]")
    notes: list[str] = []
    assert read_curvature(tmp_path, notes) is None
    assert len(notes) == 2 and "does not parse" in notes[0] and "not an object" in notes[1]
    with pytest.raises(FathomError, match="does not parse.*rerun the step"):
        read_curvature(tmp_path)
    (tmp_path / "audit").mkdir()
    (tmp_path / "audit" / "audit.json").write_text("3")
    with pytest.raises(FathomError, match="holds a JSON number, not an object"):
        read_audit(tmp_path)


if __name__ == "__main__":  # regenerate the pinned manifests (see WRITTEN)
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        for path, text in zip(WRITTEN, _write_fixed_run(Path(d) / "fixed"), strict=True):
            path.write_text(text)
