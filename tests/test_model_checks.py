"""The models' checks are written once (:mod:`fathom.config.models`, torch-free) and shared by
config validation and the constructors: a model config validates exactly when its module
builds, and both refusals carry the same message (the config's names the field too)."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from fathom.config.models import NEURONS, ModelConfig, StagedConvConfig
from fathom.config.recipes import RECIPES
from fathom.errors import FathomError, InvalidValue
from fathom.models.ciresan import CiresanMLP
from fathom.models.convnet import StagedConvNet
from fathom.models.specs import blocks_per_stage_for_depth


def _outcome(make) -> str | None:
    """``None`` when ``make()`` succeeds, else the message of its refusal."""
    try:
        make()
    except ValidationError as e:  # the first field refused (the constructor stops there)
        return e.errors()[0]["msg"].removeprefix("Value error, ")
    except FathomError as e:
        return str(e)
    return None


@settings(max_examples=60)
@given(
    widths=st.lists(st.integers(-1, 6), min_size=0, max_size=4).map(tuple),
    recipe=st.sampled_from(sorted(RECIPES)),
    unit_dropout=st.one_of(st.none(), st.sampled_from([-0.1, 0.0, 0.3, 1.0])),
)
@example(widths=(4, 6), recipe="residual", unit_dropout=None)  # widths increase: crop refused
@example(widths=(5, 4, 6), recipe="sd_constant", unit_dropout=None)  # the message names all
@example(widths=(4, 6), recipe="plain", unit_dropout=None)  # plain has no crop: built
@example(widths=(4,), recipe="plain", unit_dropout=None)  # one hidden width: no body block
@example(widths=(4, 0), recipe="plain", unit_dropout=None)  # a zero width (once scaled to 1)
@example(widths=(4, 3), recipe="plain", unit_dropout=1.0)
def test_ciresan_config_validates_exactly_when_the_mlp_builds(widths, recipe, unit_dropout):
    kw = {"widths": widths, "recipe": recipe, "unit_dropout": unit_dropout}
    in_config = _outcome(lambda: ModelConfig(**kw))
    in_model = _outcome(lambda: CiresanMLP(**kw, in_features=5, classes=2))
    assert in_config == in_model


@settings(max_examples=40)
@given(
    depth=st.integers(1, 13),
    image_size=st.integers(1, 40),
    timesteps=st.integers(-1, 2),
    neuron=st.sampled_from(NEURONS),
)
@example(depth=6, image_size=32, timesteps=1, neuron="lif")  # not a multiple of the 4 stages
@example(depth=4, image_size=28, timesteps=1, neuron="lif")  # 28 cannot pass 4 poolings
@example(depth=4, image_size=32, timesteps=-1, neuron="relu")
def test_staged_conv_config_validates_exactly_when_the_net_builds(
    depth, image_size, timesteps, neuron
):
    kw = {"image_size": image_size, "timesteps": timesteps, "neuron": neuron}
    in_config = _outcome(lambda: StagedConvConfig(depth=depth, **kw))

    def build() -> None:
        blocks = blocks_per_stage_for_depth(depth)
        StagedConvNet(blocks_per_stage=blocks, width_mult=1 / 64, **kw)

    assert in_config == _outcome(build)


def test_a_shared_check_is_both_a_config_error_and_a_fathom_error():
    with pytest.raises(ValidationError, match="non-increasing") as err:
        ModelConfig(widths=(4, 6))
    assert err.value.errors()[0]["loc"] == ()  # the whole model section (widths with recipe)
    with pytest.raises(InvalidValue, match="non-increasing"):
        CiresanMLP(widths=(4, 6), in_features=5, classes=2)
    assert issubclass(InvalidValue, FathomError) and issubclass(InvalidValue, ValueError)
