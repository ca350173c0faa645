"""Per-block telemetry: each residual block's relative update ``||g f(X)||_F / ||s(X)||_F``
and its probe mean gradient norm over all its parameters, against float64 brute force on a
tiny GPT and on a hand-made net with a cropping bypass and the ``huang`` evaluation gain;
read-only; named per block in the explorer."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from fathom.depth import Crop, SkippableResidual
from fathom.models.gpt import GPT, token_cross_entropy, token_loss
from fathom.telemetry import Instruments
from fathom.telemetry.blocks import residual_blocks
from fathom.telemetry.registry import GRAD, UPDATE, field_for


def _gpt_probe(seed: int = 0):
    torch.manual_seed(seed)
    model = GPT(vocab=11, context=6, layers=3, width=8, heads=2)
    x = torch.randint(0, 11, (4, 6))
    y = torch.randint(0, 11, (4, 6))
    return model, x, y


def _gpt_reference(model: GPT, x: torch.Tensor, y: torch.Tensor):
    """Float64: the residual stream block by block, written out (no hooks), and the gradient
    of the mean over windows of each window's mean token cross-entropy."""
    ref = copy.deepcopy(model).double().eval()
    t = x.shape[1]
    h = ref.wte(x.long()) + ref.wpe(torch.arange(t))
    update = {}
    for i, block in enumerate(ref.blocks):
        f = block.branch(h)
        update[f"blocks.{i}"] = float(f.detach().norm() / h.detach().norm())
        h = h + f
    logits = ref.lm_head(ref.ln_f(h))
    n = x.shape[0]
    loss = sum(token_cross_entropy(logits[i : i + 1], y[i : i + 1]) for i in range(n)) / n
    grad = {}
    for i, block in enumerate(ref.blocks):
        gs = torch.autograd.grad(loss, list(block.parameters()), retain_graph=True)
        grad[f"blocks.{i}"] = float(sum(g.square().sum() for g in gs).sqrt())
    return update, grad


def test_gpt_block_fields_match_a_float64_brute_force():
    model, x, y = _gpt_probe()
    ins = Instruments(model, x, y, families=("activations", "gradients"), loss=token_loss())
    row = ins.observe()
    assert ins.blocks == ("blocks.0", "blocks.1", "blocks.2")
    # every block parameter comes from a whole seam layer: no gradient taken directly
    assert ins._plan is not None and not any(ins._plan.direct.values())
    update, grad = _gpt_reference(model, x, y)
    for name in ins.blocks:
        assert row[f"{UPDATE}/{name}"] == pytest.approx(update[name], rel=1e-5)
        assert row[f"{GRAD}/{name}"] == pytest.approx(grad[name], rel=1e-4)
        assert row[f"{GRAD}/{name}"] > 0 and row[f"{UPDATE}/{name}"] > 0
    names = ins.field_names()
    assert [n for n in names if n.startswith(UPDATE)] == [f"{UPDATE}/{b}" for b in ins.blocks]
    assert field_for(f"{GRAD}/blocks.0").family == "gradients"
    assert field_for(f"{UPDATE}/blocks.0").family == "activations"


def test_only_the_chosen_family_gives_its_block_field():
    model, x, y = _gpt_probe(1)
    row = Instruments(model, x, y, families=("activations",), loss=token_loss()).observe()
    assert any(k.startswith(UPDATE) for k in row) and not any(k.startswith(GRAD) for k in row)
    row = Instruments(model, x, y, families=("params",), loss=token_loss()).observe()
    assert not any(k.startswith((UPDATE, GRAD)) for k in row)


class _Net(nn.Module):
    """stem -> block a (huang, p = 0.3: evaluation gain 0.7) -> block b (crop 6 -> 4) -> head;
    block b's branch shares nothing with a."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(5, 6)
        self.a = SkippableResidual(
            nn.Sequential(nn.Linear(6, 6), nn.Tanh()), p=0.3, convention="huang"
        )
        self.b = SkippableResidual(nn.Linear(6, 4), bypass=Crop(4))
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        return self.head(torch.relu(self.b(self.a(torch.relu(self.stem(x))))))


def test_a_cropping_bypass_and_an_evaluation_gain_match_a_float64_brute_force():
    torch.manual_seed(3)
    net = _Net()
    x, y = torch.randn(7, 5), torch.randint(0, 3, (7,))
    row = Instruments(net, x, y, families=("activations", "gradients")).observe()
    ref = copy.deepcopy(net).double().eval()
    h0 = torch.relu(ref.stem(x.double()))
    fa = 0.7 * ref.a.branch(h0)
    h1 = h0 + fa
    fb, sb = ref.b.branch(h1), h1[:, :4]
    out = ref.head(torch.relu(sb + fb))
    with torch.no_grad():
        ua, ub = float(fa.norm() / h0.norm()), float(fb.norm() / sb.norm())
    assert row[f"{UPDATE}/a"] == pytest.approx(ua, rel=1e-5)
    assert row[f"{UPDATE}/b"] == pytest.approx(ub, rel=1e-5)
    loss = nn.functional.cross_entropy(out, y)  # mean over examples of L_i
    for name in ("a", "b"):
        block = getattr(ref, name)
        gs = torch.autograd.grad(loss, list(block.parameters()), retain_graph=True)
        want = float(sum(g.square().sum() for g in gs).sqrt())
        assert row[f"{GRAD}/{name}"] == pytest.approx(want, rel=1e-5)


def test_the_block_pass_leaves_the_model_as_found():
    model, x, y = _gpt_probe(2)
    model.train()
    model.blocks[1].p = 0.4
    before = {k: v.clone() for k, v in model.state_dict().items()}
    hooks = [len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules()]
    rng = torch.get_rng_state()
    Instruments(model, x, y, families=("activations", "gradients"), loss=token_loss()).observe()
    assert all(p.grad is None for p in model.parameters())
    assert model.training and all(m.training for m in model.modules())
    assert [len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules()] == hooks
    assert torch.equal(torch.get_rng_state(), rng)
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


def test_a_model_without_residual_blocks_has_no_block_field():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 3))
    ins = Instruments(net, torch.randn(6, 4), torch.randint(0, 3, (6,)))
    row = ins.observe()
    assert ins.blocks == () and not any(k.startswith((UPDATE, GRAD)) for k in row)
    assert residual_blocks(net) == []


def test_the_explorer_facets_block_fields_by_block_in_model_order():
    from fathom.report.fields import facet_key

    key, kind, facet = facet_key(f"{GRAD}/blocks.10", f"{GRAD}/blocks.10")
    assert (key, kind, facet) == (f"{GRAD}/{{block}}", "block", "blocks.10")
    from pathlib import Path

    from fathom.report.html import explorer_payload
    from fathom.report.runs import RunData

    row = {"epoch": 0, **{f"{GRAD}/blocks.{i}": 1.0 for i in (10, 2, 1)}}
    run = RunData(Path("r"), "r", {"config": {"model": {"recipe": "x"}}}, [row])
    facets = explorer_payload([run])["meta"][f"{GRAD}/{{block}}"]["facets"]
    assert facets == ["blocks.1", "blocks.2", "blocks.10"]  # numbers read as numbers


def _brute_block_grads(net: nn.Module, x, y, blocks: tuple[str, ...]) -> dict[str, float]:
    """Float64: ``||d(mean_i L_i)/dθ||`` over each named block's parameters."""
    ref = copy.deepcopy(net).double().eval()
    loss = nn.functional.cross_entropy(ref(x.double()), y)
    out = {}
    for name in blocks:
        ps = list(ref.get_submodule(name).parameters())
        gs = torch.autograd.grad(loss, ps, retain_graph=True, allow_unused=True)
        out[name] = float(sum(g.square().sum() for g in gs if g is not None) ** 0.5)
    return out


class _Reads(nn.Module):
    """A branch reading its own weight and a weight owned outside its block (``other``, held
    unregistered): the seam's layer for it covers both, so its block takes its own weight
    directly; ``spare`` is never used (zero gradient)."""

    def __init__(self, other: nn.Linear) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 4) / 2)
        self.spare = nn.Parameter(torch.randn(3))
        self.other = [other]

    def forward(self, x):
        return torch.tanh(x @ self.w + nn.functional.linear(x, self.other[0].weight))


class _Straddle(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(3, 4)
        self.outside = nn.Linear(4, 4, bias=False)  # owned here, read inside block a only
        self.a = SkippableResidual(_Reads(self.outside))
        self.b = SkippableResidual(nn.Sequential(nn.Linear(4, 4), nn.Tanh()))
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        return self.head(self.b(self.a(torch.tanh(self.stem(x)))))


def test_parameters_outside_whole_layers_are_taken_directly_and_match_brute_force():
    torch.manual_seed(5)
    net = _Straddle()
    x, y = torch.randn(9, 3), torch.randint(0, 3, (9,))
    ins = Instruments(net, x, y, families=("gradients",))
    row = ins.observe()
    layer = next(la for la in ins.layers if la.name == "a.branch")
    assert set(layer.qualified) == {"a.branch.w", "outside.weight"}  # straddles block a
    assert "unused" in ins.seam.coverage["a.branch.spare"]
    plan = ins._plan
    assert plan is not None and plan.layers["a"] == () and len(plan.direct["a"]) == 2
    assert plan.direct["b"] == () and plan.layers["b"] == ("b.branch.0",)
    want = _brute_block_grads(net, x, y, ("a", "b"))
    for name in ("a", "b"):
        assert row[f"{GRAD}/{name}"] == pytest.approx(want[name], rel=1e-5)


def test_the_block_fields_cost_no_forward_of_their_own():
    """One probe forward per observation, block fields included: a counter on a bypass (no
    layer of the seam) sees exactly one call per ``observe`` once the layers are found."""
    torch.manual_seed(3)
    net = _Net()
    seen = []
    net.b.bypass.register_forward_hook(lambda *_: seen.append(1))
    x, y = torch.randn(7, 5), torch.randint(0, 3, (7,))
    ins = Instruments(net, x, y)
    ins.observe()
    before = len(seen)
    row = ins.observe()
    assert len(seen) - before == 1
    assert ins._plan is not None and not any(ins._plan.direct.values())  # nor a backward
    assert row[f"{UPDATE}/b"] is not None and row[f"{GRAD}/b"] is not None


class _Scaled(SkippableResidual):
    """A subclass with its own ``forward`` (the stock one, then a factor): watched by hooks."""

    def forward(self, x):
        return super().forward(x) * 0.5


def test_a_block_with_its_own_forward_is_watched_by_hooks_and_matches_brute_force():
    torch.manual_seed(4)
    net = _Net()
    net.b = _Scaled(nn.Linear(6, 4), bypass=Crop(4))
    x, y = torch.randn(7, 5), torch.randint(0, 3, (7,))
    row = Instruments(net, x, y, families=("activations", "gradients")).observe()
    ref = copy.deepcopy(net).double().eval()
    h1 = ref.a(torch.relu(ref.stem(x.double())))
    fb, sb = ref.b.branch(h1), h1[:, :4]
    with torch.no_grad():
        assert row[f"{UPDATE}/b"] == pytest.approx(float(fb.norm() / sb.norm()), rel=1e-5)
    want = _brute_block_grads(net, x, y, ("a", "b"))
    assert row[f"{GRAD}/b"] == pytest.approx(want["b"], rel=1e-5)


def test_watching_changes_no_output_bit_and_leaves_no_trace():
    """Both ways of watching (a stock block's wrapped ``forward``, hooks on a subclass) give
    the model's output bit for bit, with gradients, and leave the modules as found."""
    from fathom.telemetry.blocks import watched

    torch.manual_seed(6)
    net = _Net()
    net.b = _Scaled(nn.Linear(6, 4), bypass=Crop(4))
    net.eval()
    x = torch.randn(7, 5)
    before = [
        (dict(vars(m)), len(m._forward_hooks), len(m._forward_pre_hooks)) for m in net.modules()
    ]
    want = net(x)
    (gw,) = torch.autograd.grad(want.square().sum(), net.a.branch[0].weight)
    blocks = residual_blocks(net)
    with watched(blocks) as sums:
        got = net(x)
    (gg,) = torch.autograd.grad(got.square().sum(), net.a.branch[0].weight)
    assert torch.equal(got, want) and torch.equal(gg, gw)
    assert sums["a"].calls == sums["b"].calls == 1 and len(sums["a"].update) == 1
    after = [
        (dict(vars(m)), len(m._forward_hooks), len(m._forward_pre_hooks)) for m in net.modules()
    ]
    assert [(set(v), h, p) for v, h, p in after] == [(set(v), h, p) for v, h, p in before]
    assert "forward" not in vars(net.a)


class _Stack(nn.Module):
    """stem -> blocks (each: a Linear or Linear + Tanh branch to ``out`` features, a crop or
    the identity as bypass, its own drop probability and convention) -> head."""

    def __init__(self, d_in: int, spec: list[tuple[int, bool, float, str]], classes: int) -> None:
        super().__init__()
        width = spec[0][0] if spec else d_in
        self.stem = nn.Linear(d_in, width)
        blocks = []
        for out, tanh, p, convention in spec:
            out = min(out, width)
            branch = (
                nn.Sequential(nn.Linear(width, out), nn.Tanh()) if tanh else nn.Linear(width, out)
            )
            bypass = Crop(out) if out < width else None
            blocks.append(SkippableResidual(branch, bypass, p=p, convention=convention))
            width = out
        self.blocks = nn.ModuleList(blocks)
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        h = torch.tanh(self.stem(x))
        for block in self.blocks:
            h = block(h)
        return self.head(h)


_SPEC = st.lists(
    st.tuples(
        st.integers(2, 6),
        st.booleans(),
        st.sampled_from([0.0, 0.25]),
        st.sampled_from(["inverse", "huang"]),
    ),
    min_size=1,
    max_size=3,
)


@settings(max_examples=25, deadline=None)
@given(spec=_SPEC, n=st.integers(2, 9), seed=st.integers(0, 2**16))
def test_block_fields_of_random_residual_stacks_match_a_float64_composition(spec, n, seed):
    """Property: on any stack of blocks (widths, crops, gains, branch depth drawn), both
    fields equal a float64 forward written out block by block, ``h = s(h) + g f(h)``, and
    the gradient of the mean cross entropy over each block's parameters."""
    torch.manual_seed(seed)
    net = _Stack(4, spec, 3)
    x, y = torch.randn(n, 4), torch.randint(0, 3, (n,))
    row = Instruments(net, x, y, families=("activations", "gradients")).observe()
    ref = copy.deepcopy(net).double().eval()
    h = torch.tanh(ref.stem(x.double()))
    want = {}
    for i, block in enumerate(ref.blocks):
        gain = 1.0 - block.p if block.convention == "huang" else 1.0
        f = gain * block.branch(h)
        s = h[:, : f.shape[1]]
        want[f"blocks.{i}"] = float(f.detach().norm() / s.detach().norm())
        h = s + f
    loss = nn.functional.cross_entropy(ref.head(h), y)
    for i, block in enumerate(ref.blocks):
        name = f"blocks.{i}"
        gs = torch.autograd.grad(loss, list(block.parameters()), retain_graph=True)
        grad = float(sum(g.square().sum() for g in gs).sqrt())
        assert row[f"{UPDATE}/{name}"] == pytest.approx(want[name], rel=1e-5), name
        assert row[f"{GRAD}/{name}"] == pytest.approx(grad, rel=1e-4, abs=1e-9), name
