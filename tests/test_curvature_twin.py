"""The cached float64 twin (fathom.curvature.twin): reused while the structure holds,
rebuilt whenever anything its seam depends on changes, and always holding current values.

Every check compares against a fresh computation (cache cleared), so a stale twin or seam
shows up as a wrong diagonal, not only as a cache statistic."""

from __future__ import annotations

import gc

import pytest
import torch
from torch import nn

from fathom.curvature import exact_diagonals
from fathom.curvature import twin as twin_mod
from fathom.curvature.twin import clear_twins, prepared
from model_zoo import CASES, make

torch.set_num_threads(1)


def fresh(model, x, y, **kw):
    clear_twins()
    return exact_diagonals(model, x, y, **kw)


def assert_same(got: dict, want: dict) -> None:
    assert list(got) == list(want)
    for kind in want:
        assert list(got[kind]) == list(want[kind])
        for name, t in want[kind].items():
            torch.testing.assert_close(got[kind][name], t, rtol=0, atol=0, msg=f"{kind}/{name}")


@pytest.fixture
def cnn():
    clear_twins()
    model, x, y = make(next(c for c in CASES if c["id"] == "bn_cnn"), n=4)
    yield model, x, y
    clear_twins()


def test_the_twin_is_reused_and_takes_new_values(cnn) -> None:
    model, x, y = cnn
    first = prepared(model, x)
    assert prepared(model, x)[0] is first[0] and prepared(model, x)[2] is first[2]
    with torch.no_grad():  # an optimizer step and new running statistics, in place
        for p in model.parameters():
            p.mul_(1.1).add_(0.01)
        model[1].running_mean.add_(0.3)
    cached = exact_diagonals(model, x, y)
    assert prepared(model, x)[0] is first[0]
    assert_same(cached, fresh(model, x, y))


def _swap_head(model):
    model[7] = nn.Linear(4, 3).double()


def _toggle_train(model):
    model.train()


def _float32(model):
    model.float()


def _stride(model):
    model[4].stride = (1, 1)


def _eps(model):
    model[1].eps = 0.5


def _hook(model):
    model[2].register_forward_hook(lambda m, i, o: o * 2)


def _replace_buffer(model):
    model[1].running_var = torch.rand(3, dtype=torch.float64) + 2.0


@pytest.mark.parametrize(
    "change",
    [_swap_head, _toggle_train, _float32, _stride, _eps, _hook, _replace_buffer],
    ids=["module_swapped", "train_toggled", "dtype_changed", "stride", "eps", "hook", "buffer"],
)
def test_any_structural_change_rebuilds_the_twin(cnn, change) -> None:
    model, x, y = cnn
    before = prepared(model, x)
    exact_diagonals(model, x, y)
    change(model)
    xin = x.float() if next(model.parameters()).dtype == torch.float32 else x
    after = prepared(model, xin)
    assert after[0] is not before[0] and after[2] is not before[2]
    assert_same(exact_diagonals(model, xin, y), fresh(model, xin, y))


def test_a_new_input_shape_rediscovers_the_seam() -> None:
    clear_twins()
    model, x, y = make(next(c for c in CASES if c["id"] == "transformer"), n=4)
    first = prepared(model, x)
    shorter = x[:, :-1]
    assert prepared(model, shorter)[2] is not first[2]
    assert_same(exact_diagonals(model, shorter, y), fresh(model, shorter, y))
    clear_twins()


def test_a_custom_attribute_change_rebuilds_the_twin() -> None:
    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin, self.factor = nn.Linear(3, 2), 1.0

        def forward(self, x):
            return self.lin(x) * self.factor

    clear_twins()
    model = Scaled().double()
    x, y = torch.randn(4, 3, dtype=torch.float64), torch.tensor([0, 1, 1, 0])
    exact_diagonals(model, x, y)
    model.factor = 3.0
    assert_same(exact_diagonals(model, x, y), fresh(model, x, y))
    clear_twins()


def test_twins_go_with_their_models() -> None:
    clear_twins()
    model, x, y = make(CASES[0], n=4)
    exact_diagonals(model, x, y)
    assert len(twin_mod._TWINS) == 1
    del model
    gc.collect()
    assert len(twin_mod._TWINS) == 0


def test_a_module_deleted_then_replaced_is_never_mistaken_for_the_old_one() -> None:
    """The cached entry keeps the old module alive, so its identity cannot be reused."""

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body, self.head = nn.Linear(3, 4), nn.Linear(4, 2)

        def forward(self, x):
            return self.head(torch.tanh(self.body(x)))

    clear_twins()
    model = Net().double()
    x, y = torch.randn(4, 3, dtype=torch.float64), torch.tensor([0, 1, 1, 0])
    first = prepared(model, x)[0]
    old = id(model.head)
    del model.head
    gc.collect()
    model.head = nn.Linear(4, 2).double()
    assert id(model.head) != old
    assert prepared(model, x)[0] is not first
    assert_same(exact_diagonals(model, x, y), fresh(model, x, y))
    clear_twins()
