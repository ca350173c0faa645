"""The one step body, the learning rate on one channel, and the loop's two Protocols.

The steppers (:class:`fathom.train.step.StepBody` under the eager and graph paths, the
regularized step) are checked against the step as plain torch writes it, kept here: gather by
indexing, forward, mean CE, ``group["lr"] = lr_i``, ``loss.backward()``, ``optimizer.step()``,
``zero_grad(set_to_none=True)`` (and the regularized step as it was written before the step
body existed). Whole runs through ``fathom.train.train`` must end on the same final
``state_dict_digest`` and the same history, bit for bit.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import fathom.train.session as session_module
from conftest import synthetic_splits, tiny_config
from fathom.base.io import state_dict_digest
from fathom.config import RegularizerConfig, validate_run_config
from fathom.dynamics.regularizer import regularized_gradients
from fathom.models.prep import network_and_input
from fathom.rundir.files import load_resume
from fathom.telemetry.recorder import Recorder as TelemetryRecorder
from fathom.train.build import build_controller, build_optimizer, init_model
from fathom.train.fast import GraphStepper
from fathom.train.loop import train
from fathom.train.plan import plan_epoch
from fathom.train.protocols import Recorder, Stepper
from fathom.train.regularized import RegularizedStepper
from fathom.train.steppers import EagerStepper, make_stepper

SCHEDULE = {"kind": "warmup_cosine", "warmup_epochs": 1}  # a rate that changes every step
TEL = {"telemetry.probe_size": 32}


class TorchStep:
    """The reference cross-entropy step: plain torch, one batch at a time."""

    def __init__(self, model, optimizer, controller, splits, augmenter=None, name="eager"):
        self.model, self.optimizer, self.controller = model, optimizer, controller
        self.splits, self.augmenter, self.name = splits, augmenter, name
        self.captured, self.tick = 0, None

    def run_epoch(self, plan):
        loss_sum = torch.zeros((), dtype=torch.float64)
        for i in range(plan.steps):
            idx = plan.perm[plan.batch(i)]
            if self.controller is not None:
                self.controller.set_gains(plan.gain_values[i])
            x = self.splits.fit_x[idx]
            x = x if self.augmenter is None else self.augmenter(x)
            loss = F.cross_entropy(self.model(x).float(), self.splits.fit_y[idx])
            for group in self.optimizer.param_groups:
                group["lr"] = plan.lrs[i]
            loss.backward()
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            loss_sum += loss.detach()
        if self.controller is not None:
            self.controller.release()
        return loss_sum

    def epoch_fields(self):
        return {}

    def state_dict(self):
        return {"augmenter": None if self.augmenter is None else self.augmenter.state_dict()}

    def load_state_dict(self, state):
        return None


class RegularizedReference(TorchStep):
    """The regularized step as written before the shared step body (zero_grad first)."""

    def __init__(self, real: RegularizedStepper):
        super().__init__(real.model, real.optimizer, None, real.splits, real.augmenter)
        self.real, self.name = real, real.name

    def run_epoch(self, plan):
        r = self.real
        r.sums = type(r.sums)(r.device)
        loss_sum = torch.zeros((), dtype=torch.float64)
        for i in range(plan.steps):
            idx = plan.perm[plan.batch(i)]
            x = self.splits.fit_x[idx]
            x = x if self.augmenter is None else self.augmenter(x)
            net, inputs = network_and_input(self.model, x)
            for group in self.optimizer.param_groups:
                group["lr"] = plan.lrs[i]
            self.optimizer.zero_grad(set_to_none=True)
            rec = regularized_gradients(
                net,
                inputs,
                self.splits.fit_y[idx],
                weight=r.reg.weight,
                target=r.reg.target,
                sub_batch=r.reg.sub_batch,
                measure=False,
                generator=r.tangents,
            )
            self.optimizer.step()
            r.sums.add(rec, int(idx.shape[0]))
            loss_sum += rec.ce.double()
        self.optimizer.zero_grad(set_to_none=True)
        return loss_sum

    def epoch_fields(self):
        return self.real.epoch_fields()

    def state_dict(self):
        return self.real.state_dict()


def reference_stepper(*args, **kw):
    """``make_stepper``'s choice, its steps replaced by the reference's."""
    real, note = make_stepper(*args, **kw)
    if isinstance(real, RegularizedStepper):
        return RegularizedReference(real), note
    aug = getattr(real, "augmenter", None)
    return TorchStep(real.model, real.optimizer, real.controller, real.splits, aug), note


def comparable(rows):
    return [{k: v for k, v in r.items() if not k.startswith("clock/")} for r in rows]


def train_both(cfg, tmp_path, monkeypatch, splits):
    """``(fathom's run, the reference's run)`` of ``cfg``."""
    mine = train(cfg, tmp_path / "mine", splits=splits)
    with monkeypatch.context() as m:
        m.setattr(session_module, "make_stepper", reference_stepper)
        ref = train(cfg, tmp_path / "ref", splits=splits)
    return mine, ref


CASES = {
    "sgd-plain": {"model.recipe": "plain", "telemetry.enabled": True, **TEL},
    "sgd-sd_constant": {"model.recipe": "sd_constant", "telemetry.enabled": True, **TEL},
    "sgd-sd_decreasing": {"model.recipe": "sd_decreasing"},
    "sgd-residual": {"model.recipe": "residual"},
    "sgd-nesterov-augmented": {
        "model.recipe": "sd_decreasing",
        "optim.nesterov": True,
        "data.augment": "crop_flip",
    },
    "adamw-plain": {"model.recipe": "plain", "optim.name": "adamw", "optim.lr": 0.003},
    "adamw-sd_constant": {
        "model.recipe": "sd_constant",
        "optim.name": "adamw",
        "optim.lr": 0.003,
        "telemetry.enabled": True,
        **TEL,
    },
    "adamw-sd_decreasing": {"model.recipe": "sd_decreasing", "optim.name": "adamw"},
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_eager_runs_equal_the_torch_step_bit_for_bit(case, tmp_path, monkeypatch):
    cfg = tiny_config(
        **{"optim.epochs": 2, "optim.weight_decay": 1e-4, "optim.schedule": SCHEDULE} | CASES[case]
    )
    mine, ref = train_both(cfg, tmp_path, monkeypatch, synthetic_splits(n_fit=96, n_eval=16))
    assert mine.status == ref.status == "complete"
    assert mine.final_params == ref.final_params
    assert comparable(mine.history) == comparable(ref.history)  # telemetry's update ratios too


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_regularized_runs_equal_the_step_before_the_shared_body(optimizer, tmp_path, monkeypatch):
    optim = {"lr": 0.05, "nesterov": True, "batch_size": 32, "epochs": 2}
    if optimizer == "adamw":
        optim = {"name": "adamw", "lr": 0.003, "batch_size": 32, "epochs": 2}
    cfg = validate_run_config(
        {
            "name": "reg",
            "study": "test",
            "seed": 7,
            "device": "cpu",
            "data": {"augment": "crop_flip"},
            "model": {"kind": "staged_conv", "depth": 4, "timesteps": 2, "width_mult": 0.0625},
            "optim": {**optim, "schedule": SCHEDULE},
            "regularizer": {"weight": 0.3, "sub_batch": 4},
            "eval": {"every": 1},
            "checkpoints": {"save_epochs": [0, 2]},
        }
    )
    splits = synthetic_splits(n_fit=64, n_eval=8)
    splits.info["dataset"] = "mnist"
    mine, ref = train_both(cfg, tmp_path, monkeypatch, splits)
    assert mine.status == ref.status == "complete"
    assert mine.final_params == ref.final_params
    assert comparable(mine.history) == comparable(ref.history)


@pytest.mark.parametrize("recipe", ["sd_constant", "sd_decreasing", "residual", "plain"])
def test_graph_step_body_equals_the_torch_step(recipe):
    """The graph path's body, run eagerly (``emulate``), against the torch reference."""
    cfg = tiny_config(
        **{
            "model.recipe": recipe,
            "optim.epochs": 2,
            "optim.weight_decay": 1e-4,
            "optim.schedule": SCHEDULE,
        }
    )
    splits = synthetic_splits(n_fit=112, n_eval=8)
    digests, losses = [], []
    for kind in ("graph", "torch"):
        model = init_model(cfg)
        controller = build_controller(model, cfg)
        opt = build_optimizer(model, cfg.optim)
        cpu = torch.device("cpu")
        stepper = (
            GraphStepper(model, opt, controller, splits, cpu, "fp32", emulate=True)
            if kind == "graph"
            else TorchStep(model, opt, controller, splits)
        )
        gen = torch.Generator().manual_seed(5)
        plans = [plan_epoch(e, 112, 32, gen, controller, cfg.optim) for e in (1, 2)]
        losses.append([stepper.run_epoch(p).item() for p in plans])
        digests.append(state_dict_digest({k: v.clone() for k, v in model.state_dict().items()}))
    assert digests[0] == digests[1]
    assert losses[0] == losses[1]


def test_divergence_names_the_applied_rate_not_the_base_rate(tmp_path):
    """``piecewise`` 1 -> 0.5 over epoch 1: the last of its ``s`` steps applies
    ``lr * (1 - 0.5 (s - 1) / s)``, which the reason and ``optim/lr`` must name."""
    base, steps = 1e6, 3
    sched = {"kind": "piecewise", "points": [[0, 1.0], [1, 0.5]]}
    cfg = tiny_config(**{"optim.epochs": 2, "optim.lr": base, "optim.schedule": sched})
    res = train(cfg, tmp_path / "div", splits=synthetic_splits(n_fit=32 * steps, n_eval=8))
    applied = base * (1 - 0.5 * (steps - 1) / steps)
    assert res.status == "diverged" and res.diverged_epoch == 1
    assert res.history[-1]["optim/lr"] == pytest.approx(applied, rel=1e-12)
    from fathom.rundir import RunDir

    reason = RunDir(tmp_path / "div").manifest["status_reason"]
    assert f"lr={applied:g} applied, base optim.lr={base:g}" in reason, reason


def test_divergence_at_a_constant_rate_names_it_once(tmp_path):
    cfg = tiny_config(**{"optim.epochs": 1, "optim.lr": 1e6})
    res = train(cfg, tmp_path / "div", splits=synthetic_splits(n_fit=160, n_eval=8))
    from fathom.rundir import RunDir

    reason = RunDir(tmp_path / "div").manifest["status_reason"]
    assert res.status == "diverged" and reason.endswith("(lr=1e+06)"), reason


def test_update_ratio_uses_the_plans_last_rate(tmp_path):
    """``param/update_ratio/<layer>`` at the last boundary equals ``lr_last * ||buf|| / ||W||``
    from the saved weights and momentum buffers, with ``lr_last`` from the schedule's formula
    (the base rate, which ``group["lr"]`` holds on the SGD paths, differs from it)."""
    base, steps = 0.05, 3
    sched = {"kind": "piecewise", "points": [[0, 1.0], [2, 0.2]]}
    cfg = tiny_config(
        **{
            "optim.epochs": 2,
            "optim.lr": base,
            "optim.schedule": sched,
            "telemetry.enabled": True,
            "telemetry.families": ["params"],
            **TEL,
        }
    )
    res = train(cfg, tmp_path / "run", splits=synthetic_splits(n_fit=32 * steps, n_eval=8))
    lr_last = base * (1 - 0.8 * (1 + (steps - 1) / steps) / 2)
    assert not math.isclose(lr_last, base)
    row = res.history[-1]
    state = load_resume(tmp_path / "run" / "checkpoints" / "resume.safetensors")
    names = list(state["model"])
    params = [n for n in names if n in dict(init_model(cfg).named_parameters())]
    bufs = {params[i]: s["momentum_buffer"] for i, s in state["optimizer"]["state"].items()}
    ratios = {k.rsplit("/", 1)[1]: v for k, v in row.items() if k.startswith("param/update_ratio/")}
    assert ratios
    for layer, got in ratios.items():
        w, buf = state["model"][f"{layer}.weight"].double(), bufs[f"{layer}.weight"].double()
        assert got == pytest.approx(lr_last * buf.norm().item() / w.norm().item(), rel=1e-9)


def test_the_concrete_steppers_and_recorder_satisfy_the_protocols():
    cfg = tiny_config(**{"model.recipe": "sd_constant", "telemetry.enabled": True, **TEL})
    splits = synthetic_splits(n_fit=64, n_eval=8)
    model = init_model(cfg)
    controller = build_controller(model, cfg)
    opt = build_optimizer(model, cfg.optim)
    cpu = torch.device("cpu")
    stepper, _ = make_stepper(cfg, model, opt, controller, splits, cpu)
    assert isinstance(stepper, EagerStepper) and isinstance(stepper, Stepper)
    assert isinstance(GraphStepper(model, opt, controller, splits, cpu, emulate=True), Stepper)
    reg = RegularizerConfig(weight=0.1)
    assert isinstance(RegularizedStepper(model, opt, splits, cpu, reg, 0), Stepper)
    tel = cfg.telemetry.model_copy(update={"probe_size": 32})
    rec = TelemetryRecorder(tel, epochs=3, splits=splits, model=model, seed=0)
    assert isinstance(rec, Recorder)
    assert not isinstance(rec, Stepper) and not isinstance(stepper, Recorder)


@pytest.mark.parametrize("active", [True, False])
def test_the_rate_reaches_the_update_on_one_channel(active):
    """ActiveSGD takes the plan's rate as its argument and leaves ``group["lr"]`` at the base
    rate; torch's optimizer (``stepper.sgd = None`` switches the body to it) reads only
    ``group["lr"]``, which then holds the plan's last rate."""
    sched = {"kind": "piecewise", "points": [[0, 1.0], [1, 0.5]]}
    cfg = tiny_config(**{"model.recipe": "sd_constant", "optim.schedule": sched})
    splits = synthetic_splits(n_fit=64, n_eval=8)
    model = init_model(cfg)
    controller = build_controller(model, cfg)
    opt = build_optimizer(model, cfg.optim)
    stepper = EagerStepper(model, opt, controller, splits, torch.device("cpu"))
    assert stepper.sgd is not None
    if not active:
        stepper.sgd = None
        assert stepper.body.sgd is None
    plan = plan_epoch(1, 64, 32, torch.Generator().manual_seed(0), controller, cfg.optim)
    stepper.run_epoch(plan)
    assert plan.lrs[-1] != cfg.optim.lr
    assert opt.param_groups[0]["lr"] == (cfg.optim.lr if active else plan.lrs[-1])


@pytest.mark.parametrize(
    ("protocol", "classes"),
    [
        (Stepper, (EagerStepper, GraphStepper, RegularizedStepper)),
        (Recorder, (TelemetryRecorder,)),
    ],
    ids=["stepper", "recorder"],
)
def test_the_concrete_methods_take_the_protocols_parameters(protocol, classes):
    """``isinstance`` on a runtime Protocol sees names only: the parameters are checked here
    (names in order; the concrete class may add only parameters with defaults)."""
    import inspect

    methods = [n for n, v in vars(protocol).items() if inspect.isfunction(v) and n[0] != "_"]
    assert methods
    for cls in classes:
        for name in methods:
            want = list(inspect.signature(getattr(protocol, name)).parameters)
            have = inspect.signature(getattr(cls, name)).parameters
            assert list(have)[: len(want)] == want, (cls.__name__, name)
            extra = list(have.values())[len(want) :]
            assert all(p.default is not inspect.Parameter.empty for p in extra), (cls, name)
