"""A model's class count and input size come from the data (or a registered dataset's
metadata), never from MNIST's numbers: a two-class or non-784 dataset is built to its own
shape, or refused where its shape is unknown (:func:`fathom.data.registry.registered_shape`,
:func:`fathom.models.build_model`, :func:`fathom.train.build.init_model`,
:func:`fathom.train.session.split_classes`, :meth:`fathom.rundir.RunDir.build_model`)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from torch import nn

from fathom.config import RunConfig, validate_run_config
from fathom.config.models import ModelConfig, StagedConvConfig
from fathom.data import DataSplits
from fathom.data.registry import DATASETS, TextDataset, registered_shape
from fathom.errors import FathomError
from fathom.models import build_model
from fathom.rundir import RunDir
from fathom.train.build import init_model
from fathom.train.loop import train
from fathom.train.session import split_classes

WIDTHS = (12, 10, 8)
SHAPES = st.one_of(
    st.tuples(st.integers(1, 9), st.integers(1, 9)),
    st.tuples(st.integers(1, 3), st.integers(1, 6), st.integers(1, 6)),
)


def _mlp_dims(model: nn.Module) -> tuple[int, int]:
    """(input features of the stem, logits of the head) of a Ciresan MLP."""
    return model.stem.in_features, model.head.out_features


def _splits(classes: int | None, shape: tuple[int, ...], n: int = 8) -> DataSplits:
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (n, *shape), dtype=torch.uint8, generator=g)
    y = torch.arange(n) % (classes or 2)
    info = {} if classes is None else {"classes": classes}
    return DataSplits(x, y, x[:2], y[:2], x[:2], y[:2], split_hash="generated", info=info)


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_registered_shape_is_the_registry_entry(name):
    spec = DATASETS[name]
    if isinstance(spec, TextDataset):  # token windows: no image shape to stand in for the data's
        with pytest.raises(FathomError, match="not a registered dataset whose shape is known") as e:
            registered_shape(name, "classes")
        assert name not in str(e.value).split("known (")[1].split(")")[0]
        return
    assert registered_shape(name, "classes") == (spec.classes, tuple(spec.image_shape))


@pytest.mark.parametrize("dataset", ["tensors", "python", None, "synthetic"])
def test_unregistered_data_has_no_shape_to_borrow(dataset):
    with pytest.raises(FathomError, match="in_features not given.*pass in_features"):
        registered_shape(dataset, "in_features")


@settings(max_examples=25)
@given(classes=st.integers(2, 12), shape=SHAPES)
@example(classes=2, shape=(5, 6))  # two classes, 30 features: MNIST's 10 / 784 would be wrong
def test_mlp_is_built_to_the_datas_shape(classes, shape):
    cfg = ModelConfig(widths=WIDTHS)
    given_all = build_model(cfg, classes, math.prod(shape), dataset="tensors")
    from_shape = build_model(cfg, classes, input_shape=shape, dataset="tensors")
    assert _mlp_dims(given_all) == _mlp_dims(from_shape) == (math.prod(shape), classes)


def test_user_data_without_a_shape_is_refused_not_given_mnists():
    cfg = ModelConfig(widths=WIDTHS)
    with pytest.raises(FathomError, match="classes not given"):
        build_model(cfg, in_features=30, dataset="tensors")
    with pytest.raises(FathomError, match="in_features not given"):
        build_model(cfg, 2, dataset="tensors")
    user = validate_run_config({"data": {"dataset": "tensors", "path": "x.npz"}})
    with pytest.raises(FathomError, match="classes not given"):
        init_model(user)


def test_registered_dataset_supplies_what_is_not_given():
    assert _mlp_dims(build_model(ModelConfig(widths=WIDTHS), dataset="mnist")) == (784, 10)
    cifar = RunConfig(data={"dataset": "cifar100"}, model={"widths": list(WIDTHS)})
    assert _mlp_dims(init_model(cifar)) == (3 * 32 * 32, 100)
    # the conv net takes its channels from the dataset: CIFAR's 3, where (28, 28) gave 1
    net = build_model(StagedConvConfig(width_mult=0.0625), dataset="cifar10")
    first = next(m for m in net.modules() if isinstance(m, nn.Conv2d))
    assert first.in_channels == 3
    assert next(m for m in net.modules() if isinstance(m, nn.Linear)).out_features == 10


@settings(max_examples=25)
@given(classes=st.integers(2, 12), shape=SHAPES)
@example(classes=2, shape=(5, 6))
def test_split_classes_takes_the_datas_count_or_refuses(classes, shape):
    assert split_classes(_splits(classes, shape), "tensors") == classes
    assert split_classes(_splits(classes, shape), "mnist") == classes  # the data's own count
    with pytest.raises(FathomError, match="class count"):
        split_classes(_splits(None, shape), "tensors")
    if math.prod(shape) != 784:  # not MNIST-sized: MNIST's 10 would be a guess
        with pytest.raises(FathomError, match="not dataset 'mnist'"):
            split_classes(_splits(None, shape), "mnist")


def test_split_classes_of_mnist_sized_splits_without_a_count():
    assert split_classes(_splits(None, (28, 28)), "mnist") == 10
    assert split_classes(_splits(None, (784,)), "fashion-mnist") == 10


def test_two_class_non_mnist_run_is_trained_and_rebuilt_to_its_shape(tmp_path):
    """End to end: a user's 2-class 5x6 ``.npz`` trains a Ciresan MLP 30 -> ... -> 2, and the
    run directory rebuilds exactly that model from its manifest's data.info."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 120)
    x = (rng.integers(0, 120, (120, 5, 6)) + 100 * y[:, None, None]).astype(np.uint8)
    np.savez(tmp_path / "two.npz", x=x, y=y)
    cfg = validate_run_config(
        {
            "name": "two",
            "study": "shape",
            "device": "cpu",
            "data": {"dataset": "tensors", "path": str(tmp_path / "two.npz")},
            "model": {"widths": list(WIDTHS)},
            "optim": {"epochs": 1, "batch_size": 16},
            "checkpoints": {"save_epochs": [0, 1]},
        }
    )
    assert train(cfg, tmp_path / "run").status == "complete"
    rd = RunDir(tmp_path / "run")
    info = rd.manifest["data"]["info"]
    assert (info["classes"], info["in_features"], info["input_shape"]) == (2, 30, [5, 6])
    model = rd.load_model("final")
    assert _mlp_dims(model) == (30, 2)
    assert model(torch.as_tensor(x[:3])).shape == (3, 2)
