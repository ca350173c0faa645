"""The head diagnostic (seed 003): a matched pair that differs only in the output ReLU.

Two runs of one config -- the ReLU head (``model.output_relu = true``) and the same config
with only the output ReLU removed (a linear head) -- trained from the same seed, then
evaluated at their final checkpoints on the full test split:

    correct_c = #{i : y_i = c and argmax_k z_ik = c},   total_c = #{i : y_i = c},
    accuracy  = sum_c correct_c / sum_c total_c

and printed per class as ``"6: 0/958 -> 945/958"`` (ReLU head -> linear head). Seed 003: at
seed 104 after five epochs the ReLU head classified 0/958 test sixes, the linear head 945/958.
The runs are ordinary run directories (resumable, hash-verified); ``head.json`` records both
final-checkpoint hashes the table was computed from.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fathom.base.io import atomic_write_json, atomic_write_text
from fathom.base.terminal import fmt_duration, fmt_eta
from fathom.base.units import fmt_percent
from fathom.config import RunConfig, config_diff
from fathom.errors import FathomError
from fathom.rundir import RunDir
from fathom.study.execute import execute_run
from fathom.study.plan import RunSpec
from fathom.telemetry.scores import class_scores, confusion_matrix
from fathom.train.evaluate import split_scores

_HEADS: tuple[str, ...] = ("relu", "linear")
_FORMAT = 1


@dataclass(frozen=True)
class HeadSettings:
    """What the pair changes in the base run config (``None`` keeps the base value)."""

    seed: int = 104
    epochs: int = 5
    width_mult: float | None = None
    fit_subset: int | None = None
    eval_subset: int | None = None
    lr: float | None = None
    device: str | None = None


def pair_configs(base: RunConfig, settings: HeadSettings, study: str) -> dict[str, RunConfig]:
    """``{"relu": cfg, "linear": cfg}``: equal in every field but ``model.output_relu`` and ``name``."""
    updates: dict[str, Any] = {
        "study": study,
        "seed": settings.seed,
        "optim.epochs": settings.epochs,
        "checkpoints.save_epochs": [0, settings.epochs],
        "telemetry.enabled": False,
        "stop.target_test_acc": None,
    }
    for key, value in (
        ("model.width_mult", settings.width_mult),
        ("data.fit_subset", settings.fit_subset),
        ("data.eval_subset", settings.eval_subset),
        ("optim.lr", settings.lr),
        ("device", settings.device),
    ):
        if value is not None:
            updates[key] = value
    if "test" not in base.eval.splits:
        updates["eval.splits"] = [*base.eval.splits, "test"]
    cfgs = {
        head: base.with_updates(
            {**updates, "name": f"head-{head}", "model.output_relu": head == "relu"}
        )
        for head in _HEADS
    }
    a, b = cfgs["relu"].model_dump(mode="json"), cfgs["linear"].model_dump(mode="json")
    differ = {line.split(":")[0] for line in config_diff(a, b)}
    if differ != {"name", "model.output_relu"}:
        raise FathomError(f"the head pair differs in {sorted(differ)}, not only model.output_relu")
    return cfgs


def per_class(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, classes: int) -> dict:
    """Per-class ``correct``/``total`` and overall accuracy of ``model`` on ``(x, y)`` (dense)."""
    preds: list[torch.Tensor] = []
    acc, ce = split_scores(model, x, y, predictions=preds)
    conf = confusion_matrix(torch.cat(preds), y, classes)
    totals, _ = class_scores(conf)
    correct = torch.diagonal(conf).tolist()
    return {
        "accuracy": acc,
        "ce": ce,
        "per_class": [
            {"digit": c, "correct": int(correct[c]), "total": int(totals[c])}
            for c in range(classes)
        ],
    }


def run_head_diagnostic(
    base: RunConfig,
    settings: HeadSettings,
    out_dir: str | Path,
    *,
    splits_for: Any = None,
    threads: int | None = None,
    progress: Any = None,
) -> dict[str, Any]:
    """Train (or resume, or verify) the pair under ``out_dir``; write ``head.json`` and ``head.md``.

    ``progress(line)`` gets a line per trained epoch and per run (:class:`HeadProgress`:
    ``k/2 runs`` with the run's and the pair's ETA)."""
    from fathom.base.provenance import resolve_device
    from fathom.study.execute import cached_splits

    out = Path(out_dir)
    cfgs = pair_configs(base, settings, study=out.name)
    heads: dict[str, Any] = {}
    watch = HeadProgress(progress, len(cfgs)) if progress is not None else None
    for head, cfg in cfgs.items():
        spec = RunSpec(
            run_id=cfg.name,
            study=out.name,
            phase=None,  # a lone run: not an arm of any study
            recipe=cfg.model.recipe,
            seed=cfg.seed,
            lr=cfg.optim.lr,
            run_dir=str(out / cfg.name),
            config=cfg.model_dump(mode="json"),
        )
        if watch is not None:
            watch.start(cfg.name)
        outcome = execute_run(spec, threads=threads, splits_for=splits_for, progress=watch)
        if watch is not None:
            watch.end(outcome.action, outcome.status)
        if outcome.status != "complete":
            raise FathomError(
                f"head diagnostic run {cfg.name} ended {outcome.status} ({outcome.error}); a "
                "diverged head has no final checkpoint to count: reduce --lr"
            )
        rd = RunDir(out / cfg.name)
        device = resolve_device(cfg.device)
        splits = (splits_for or cached_splits)(cfg, device)
        model = rd.load_model("final", device=device)
        heads[head] = {
            "run_id": rd.run_id,
            "action": outcome.action,
            "epoch": rd.checkpoint_epoch("final"),
            "params_sha256": rd.checkpoint_hash("final"),
            **per_class(model, splits.test_x, splits.test_y, rd.classes),
        }
    result = {
        "format": _FORMAT,
        "kind": "fathom.reproduce.head",
        "seed": settings.seed,
        "epochs": settings.epochs,
        "split": "test",
        "config": {"relu": cfgs["relu"].model_dump(mode="json")},
        "differs_only_in": "model.output_relu",
        "heads": heads,
    }
    atomic_write_json(out / "head.json", result)
    atomic_write_text(out / "head.md", _head_markdown(result))
    return result


class HeadProgress:
    """The head pair's progress: ``head-relu-s104 (1/2 runs) epoch 1/2  elapsed 0:04  run
    ETA 0:04  pair ETA 0:12``, one line per trained epoch, and one per run when it ends.

    The run's time left is :class:`fathom.base.eta.RunEta`'s (the trainer's measured steps,
    evaluations and the rest of each epoch). The runs still to start are predicted at the
    mean wall time of the runs trained whole so far; before one finished, at the run under way's
    predicted total (elapsed + left): the two runs differ only in the output ReLU, so they
    cost the same. A run found complete (verified, not trained) costs no time and is not
    measured. Nothing reads a clock but ``clock`` (tests pass a fake one).
    """

    def __init__(self, say: Any, runs: int, clock: Any = None) -> None:
        import time

        self.say, self.runs = say, runs
        self.clock = clock or time.monotonic
        self.k = 0
        self.trained: list[float] = []
        self.name, self.t0, self.steps, self.epoch = "", 0.0, 0, 0
        self.eta: Any = None

    def start(self, name: str) -> None:
        """Run ``name`` (the next of the pair) starts."""
        from fathom.base.eta import RunEta

        self.k += 1
        self.name, self.t0, self.steps, self.epoch = name, self.clock(), 0, 0
        self.eta = RunEta()

    def __call__(self, event: str, info: dict[str, Any]) -> None:
        """A trainer event of the run under way."""
        now = self.clock()
        if event == "step":
            self.epoch, self.steps = info["epoch"], info["steps"]
            return
        if event == "epoch_end":
            info = {**info, "steps_in_epoch": self.steps if self.epoch == info["epoch"] else 0}
        self.eta.event(event, info, now)
        if event == "epoch_end" and self.steps:
            epochs = self.eta.epochs or info.get("epochs") or 0
            _, run = self.eta.left(info["epoch"] + 1, epochs, 0, self.steps)
            self.say(
                f"{self._who()} epoch {info['epoch']}/{epochs}  elapsed "
                f"{fmt_duration(now - self.t0)}  run ETA {fmt_eta(run)}  "
                f"pair ETA {fmt_eta(self._pair(now, run))}"
            )

    def _who(self) -> str:
        return f"{self.name} ({self.k}/{self.runs} runs)"

    def _pair(self, now: float, run: Any) -> Any:
        """The pair's time left: this run's, and each run to come at the per-run estimate."""
        from fathom.base.eta import Estimate

        later = self.runs - self.k
        if self.trained:
            each: float | None = sum(self.trained) / len(self.trained)
        elif run.seconds is not None:
            each = now - self.t0 + run.seconds
        else:
            each = None
        if run.seconds is None or (later and each is None):
            return Estimate(None)
        return Estimate(run.seconds + later * (each or 0.0), run.lower_bound)

    def end(self, action: str, status: str) -> None:
        """The run under way ended (``action``: trained, resumed, skipped ...)."""
        from fathom.base.eta import Estimate

        now = self.clock()
        wall = now - self.t0
        if action == "trained":  # from its first epoch here (a resumed one did part)
            self.trained.append(wall)
        left = self._pair(now, Estimate(0.0))
        self.say(
            f"{self._who()} {action} {status} in {wall:.1f} s  pair ETA "
            f"{fmt_eta(left) if self.k < self.runs else fmt_duration(0.0)}"
        )


def _head_markdown(result: dict[str, Any]) -> str:
    """The before/after table: ``digit: correct/total -> correct/total`` (ReLU -> linear head)."""
    relu, lin = result["heads"]["relu"], result["heads"]["linear"]
    model = result["config"]["relu"]["model"]
    lines = [
        f"# Head diagnostic: seed {result['seed']}, {result['epochs']} epochs, test split",
        "",
        f"ReLU head ({relu['run_id']}, params {relu['params_sha256'][:12]}) -> linear head "
        f"({lin['run_id']}, params {lin['params_sha256'][:12]}); the two runs differ only in "
        f"model.output_relu. Input scale {model['input_scale']:g}, width x{model['width_mult']:g}.",
        "",
        "| digit | ReLU head | linear head |",
        "|---|---|---|",
    ]
    for a, b in zip(relu["per_class"], lin["per_class"], strict=True):
        lines.append(
            f"| {a['digit']} | {a['correct']}/{a['total']} | {b['correct']}/{b['total']} |"
        )
    lines += [
        f"| all | {fmt_percent(relu['accuracy'])} | {fmt_percent(lin['accuracy'])} |",
        "",
        *head_lines(result),
        "",
    ]
    return "\n".join(lines)


def head_lines(result: dict[str, Any]) -> list[str]:
    """``"6: 0/958 -> 945/958"`` per class, then the overall accuracy."""
    relu, lin = result["heads"]["relu"], result["heads"]["linear"]
    out = [
        f"{a['digit']}: {a['correct']}/{a['total']} -> {b['correct']}/{b['total']}"
        for a, b in zip(relu["per_class"], lin["per_class"], strict=True)
    ]
    out.append(f"accuracy: {fmt_percent(relu['accuracy'])} -> {fmt_percent(lin['accuracy'])}")
    return out


_COLLAPSE = (
    "a head collapses on a digit when it classifies none of that digit's test examples "
    "correctly (correct_c = 0 of total_c > 0)"
)


def _collapsed(cell: dict[str, Any]) -> bool:
    return int(cell["total"]) > 0 and int(cell["correct"]) == 0


def head_collapse(result: dict[str, Any] | None, seed_counts: list[Any]) -> dict[str, Any] | None:
    """Per digit, whether each head of Fathom's pair collapsed (:data:`_COLLAPSE`), beside the
    digits the seed reports a count for (``seed_counts``: :class:`~fathom.reproduce.seeds.
    SeedValue` rows ``head``/``correct`` with their ``denominator``); ``None`` without a pair."""
    if result is None:
        return None
    seed: dict[int, dict[str, list[int]]] = {}
    for v in seed_counts:
        total = v.denominator
        seed.setdefault(int(v.extract["digit"]), {})[v.extract["head"]] = [int(v.value), total]
    relu, lin = result["heads"]["relu"], result["heads"]["linear"]
    digits = [
        {
            "digit": int(a["digit"]),
            "relu": [int(a["correct"]), int(a["total"])],
            "linear": [int(b["correct"]), int(b["total"])],
            "relu_collapsed": _collapsed(a),
            "linear_collapsed": _collapsed(b),
        }
        for a, b in zip(relu["per_class"], lin["per_class"], strict=True)
    ]
    return {
        "definition": _COLLAPSE,
        "seed": {str(d): h for d, h in sorted(seed.items())},
        "seed_collapsed": sorted(d for d, h in seed.items() if h.get("relu", [1])[0] == 0),
        "fathom_seed": int(result["seed"]),
        "fathom_epochs": int(relu.get("epoch", result["epochs"])),
        "fathom_collapsed": [d["digit"] for d in digits if d["relu_collapsed"]],
        "digits": digits,
    }


def _count(pair: list[int]) -> str:
    return f"{pair[0]}/{pair[1]}"


def collapse_lines(c: dict[str, Any]) -> list[str]:
    """Per digit, whether the ReLU-head collapse the seed saw reproduced in Fathom's pair."""
    by_digit = {d["digit"]: d for d in c["digits"]}
    out = [f"Collapse: {c['definition']}."]
    for digit in c["seed_collapsed"]:
        s, d = c["seed"][str(digit)], by_digit.get(digit)
        seen = f"the seed's ReLU head collapsed (0/{s['relu'][1]}"
        seen += f"; linear head {_count(s['linear'])})" if "linear" in s else ")"
        if d is None:
            out.append(f"Digit {digit}: {seen}; Fathom's pair has no digit {digit}.")
            continue
        did = "did" if d["relu_collapsed"] else "did not"
        out.append(
            f"Digit {digit}: {seen}; in Fathom's pair the collapse {did} reproduce (ReLU head "
            f"{_count(d['relu'])}; linear head {_count(d['linear'])})."
        )
    others = [
        d for d in c["digits"] if d["relu_collapsed"] and d["digit"] not in c["seed_collapsed"]
    ]
    for d in others:
        out.append(
            f"Digit {d['digit']}: the collapse did reproduce in Fathom's pair, on a digit the "
            f"seed gives no count for (ReLU head {_count(d['relu'])}; linear head "
            f"{_count(d['linear'])})."
        )
    if not c["fathom_collapsed"]:
        out.append("Fathom's ReLU head collapsed on no digit.")
    for d in c["digits"]:
        if d["linear_collapsed"]:
            out.append(
                f"Digit {d['digit']}: Fathom's linear head collapsed too ({_count(d['linear'])})."
            )
    return out
