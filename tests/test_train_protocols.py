"""The loop's two interfaces (:mod:`fathom.train.protocols`) against the concrete classes.

``isinstance`` on a ``runtime_checkable`` protocol checks only that the members exist, so the
class-level check here also compares each method's parameter names with the protocol's: a
renamed parameter or a dropped method fails it, whatever execution path ran last.
"""

from __future__ import annotations

import inspect

import pytest
import torch

from conftest import synthetic_splits, tiny_config
from fathom.telemetry.recorder import Recorder as TelemetryRecorder
from fathom.train.build import build_controller, build_optimizer, init_model
from fathom.train.fast import GraphStepper
from fathom.train.protocols import Recorder, Stepper
from fathom.train.regularized import RegularizedStepper
from fathom.train.steppers import EagerStepper


def _methods(proto: type) -> dict[str, list[str]]:
    """``{method: parameter names}`` the protocol declares (its own, not ``Protocol``'s)."""
    return {
        name: list(inspect.signature(fn).parameters)
        for name, fn in vars(proto).items()
        if inspect.isfunction(fn) and not name.startswith("_")
    }


def _mismatches(proto: type, cls: type) -> list[str]:
    out = []
    for name, params in _methods(proto).items():
        fn = getattr(cls, name, None)
        if fn is None:
            out.append(f"{cls.__name__} lacks {name}")
        elif list(inspect.signature(fn).parameters) != params:
            out.append(f"{cls.__name__}.{name}{inspect.signature(fn)} is not {params}")
    return out


@pytest.mark.parametrize(
    ("proto", "cls"),
    [
        (Stepper, EagerStepper),
        (Stepper, GraphStepper),
        (Stepper, RegularizedStepper),
        (Recorder, TelemetryRecorder),
    ],
)
def test_each_concrete_class_has_the_protocols_methods_with_its_parameters(proto, cls):
    assert _methods(proto)  # the protocol declares something to compare
    assert _mismatches(proto, cls) == []


def test_the_check_catches_a_missing_method_and_a_renamed_parameter():
    class Renamed(EagerStepper):
        def run_epoch(self, epoch_plan):  # type: ignore[override]
            return torch.zeros(())

    class Missing:
        pass

    assert _mismatches(Stepper, Renamed) == [
        f"Renamed.run_epoch{inspect.signature(Renamed.run_epoch)} is not ['self', 'plan']"
    ]
    assert len(_mismatches(Stepper, Missing)) == len(_methods(Stepper))


def test_a_built_eager_stepper_is_a_stepper_with_its_data_members():
    cfg = tiny_config()
    model = init_model(cfg)
    stepper = EagerStepper(
        model,
        build_optimizer(model, cfg.optim),
        build_controller(model, cfg),
        synthetic_splits(n_fit=32, n_eval=8),
        torch.device("cpu"),
        "fp32",
    )
    assert isinstance(stepper, Stepper)
    assert isinstance(stepper.name, str) and isinstance(stepper.captured, int)
    assert not isinstance(object(), Stepper)
