"""``mask_costs`` counts the FLOPs of what the trainer runs, against hand counts.

The defect: a no-grad evaluation forward of ``nn.MultiheadAttention`` / ``nn.TransformerEncoderLayer``
took torch's fused inference kernels, which the FLOP counter does not see, so such a branch cost
0 FLOPs and the audit printed "branch MACs 0"; a CPU ``nn.LSTM`` (oneDNN kernel) did the same.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import example, given, settings
from hypothesis import strategies as st
from torch import nn

from fathom.audit.costs import mask_costs, mask_macs
from fathom.audit.masks import enumerate_masks
from fathom.depth import SkippableResidual
from fathom.errors import FathomError


def mm(m: int, k: int, n: int) -> int:
    """FLOPs of an ``[m, k] @ [k, n]`` product: ``2 m k n``."""
    return 2 * m * k * n


def attention_flops(b: int, s: int, d: int, h: int) -> int:
    """Self-attention over ``b`` sequences of ``s`` tokens of width ``d`` with ``h`` heads.

    in-projection ``x W_qkv^T`` (``d -> 3d``), per head ``Q K^T`` (``s x d/h x s``) and
    ``softmax(.) V`` (``s x s x d/h``), out-projection (``d -> d``); softmax and bias not counted.
    """
    e = d // h
    return mm(b * s, d, 3 * d) + b * h * (mm(s, e, s) + mm(s, s, e)) + mm(b * s, d, d)


def ffn_flops(b: int, s: int, d: int, ff: int) -> int:
    """The encoder layer's feed-forward ``linear2(act(linear1(x)))``: ``d -> ff -> d``."""
    return mm(b * s, d, ff) + mm(b * s, ff, d)


class SelfAttention(nn.Module):
    """``attn(x, x, x)`` as a residual branch (batch-first or sequence-first)."""

    def __init__(self, d: int, h: int, batch_first: bool, need_weights: bool) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(d, h, batch_first=batch_first)
        self.need_weights = need_weights

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attn(x, x, x, need_weights=self.need_weights)[0]


def _encoder_model(d, h, ff, batch_first, norm_first, need_weights):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(
        d, h, ff, dropout=0.1, batch_first=batch_first, norm_first=norm_first
    )
    return nn.Sequential(
        nn.Linear(d, d),
        SkippableResidual(SelfAttention(d, h, batch_first, need_weights), p=0.2, seed=0),
        SkippableResidual(layer, p=0.2, seed=1),
    )


@settings(max_examples=25)
@given(
    b=st.integers(1, 3),
    s=st.integers(1, 6),
    heads=st.sampled_from([1, 2, 4]),
    e=st.integers(1, 3),
    ff=st.integers(1, 12),
    batch_first=st.booleans(),
    norm_first=st.booleans(),
    need_weights=st.booleans(),
)
@example(b=3, s=5, heads=2, e=4, ff=16, batch_first=True, norm_first=False, need_weights=False)
def test_attention_and_encoder_branches_cost_the_hand_count(
    b, s, heads, e, ff, batch_first, norm_first, need_weights
):
    d = heads * e
    model = _encoder_model(d, heads, ff, batch_first, norm_first, need_weights)
    x = torch.randn((b, s, d) if batch_first else (s, b, d))
    stem = mm(b * s, d, d)
    branch = [
        attention_flops(b, s, d, heads),
        attention_flops(b, s, d, heads) + ffn_flops(b, s, d, ff),
    ]
    costs = mask_costs(model, x)
    for m, row in enumerate(enumerate_masks(2)):
        assert costs[m] == stem + sum(c for c, keep in zip(branch, row, strict=True) if keep)
    assert model.training  # the mode is restored


def test_attention_branch_is_not_counted_as_zero_macs():
    """The audit's branch MACs (checkpoint.py: full minus the one-branch-removed net) > 0."""
    d, h, ff, s = 8, 2, 16, 5
    model = _encoder_model(d, h, ff, True, False, False)
    x = torch.randn(4, s, d)
    full = mask_macs(model, np.ones((1, 2), dtype=np.uint8), x)[0]
    singles = np.array([[0, 1], [1, 0]], dtype=np.uint8)
    branch_macs = [full - m for m in mask_macs(model, singles, x)]
    assert branch_macs == [
        attention_flops(1, s, d, h) // 2,
        (attention_flops(1, s, d, h) + ffn_flops(1, s, d, ff)) // 2,
    ]


RNNS = {"rnn": (nn.RNN, 1), "gru": (nn.GRU, 3), "lstm": (nn.LSTM, 4)}


@pytest.mark.parametrize("kind", sorted(RNNS))
@pytest.mark.parametrize("layers", [1, 2])
def test_recurrent_branches_cost_their_gate_products(kind, layers):
    """Per step and layer ``l``: gates ``G h x (in_l + h)`` products, ``G`` = 1 / 3 / 4."""
    cls, gates = RNNS[kind]

    class Last(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = cls(4, 6, num_layers=layers, batch_first=True)
            self.out = nn.Linear(6, 4)

        def forward(self, x):
            return self.out(self.rnn(x)[0])

    torch.manual_seed(0)
    model = nn.Sequential(SkippableResidual(Last()))
    b, t, i, hid = 2, 3, 4, 6
    costs = mask_costs(model, torch.randn(b, t, i))
    rnn = sum(
        t * (mm(b, i if layer == 0 else hid, gates * hid) + mm(b, hid, gates * hid))
        for layer in range(layers)
    )
    assert costs.tolist() == [0, rnn + mm(b * t, hid, i)]


def test_a_fused_kernel_without_a_formula_is_refused_naming_the_module():
    """``nn.Bilinear`` runs ``aten._trilinear``, which torch's counter does not count."""
    torch.manual_seed(0)

    class Bi(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bi = nn.Bilinear(3, 3, 3)

        def forward(self, x):
            return self.bi(x, x)

    model = nn.Sequential(SkippableResidual(Bi()))
    before = {k: v.clone() for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}
    flags = (
        torch.backends.mha.get_fastpath_enabled(),
        torch.backends.mkldnn.enabled,
        torch.backends.cudnn.enabled,
    )
    with pytest.raises(FathomError, match=r"Sequential\.0\.branch\.bi.*aten\._trilinear"):
        mask_costs(model, torch.randn(2, 3))
    after = (
        torch.backends.mha.get_fastpath_enabled(),
        torch.backends.mkldnn.enabled,
        torch.backends.cudnn.enabled,
    )
    assert after == flags and model.training and model[0].mask is None
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


# -- matrix kernels torch's counter has no formula for: counted by hand, or refused -----------
class Kernel(nn.Module):
    """``x + sum(fn(x, self.w, self.b))`` on a ``[1, 5]`` input: one matrix kernel, and
    elementwise work (not counted) to keep the width."""

    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn
        self.w = nn.Parameter(torch.randn(6, 5))
        self.b = nn.Parameter(torch.randn(3, 5, 4))

    def forward(self, x):
        return x + self.fn(x, self.w, self.b).sum()


KERNELS = {  # name: (forward of x [1, 5], hand count: one multiply-accumulate = 2 FLOPs)
    "mv": (lambda x, w, b: torch.mv(w, x[0])[None], 2 * 6 * 5),
    "matmul_matrix_vector": (lambda x, w, b: (w @ x[0])[None], 2 * 6 * 5),
    "addmv": (lambda x, w, b: torch.addmv(w[:, 0], w, x[0])[None], 2 * 6 * 5),
    "dot": (lambda x, w, b: torch.dot(w[0], x[0]).reshape(1, 1), 2 * 5),
    "vdot": (lambda x, w, b: torch.vdot(w[0], x[0]).reshape(1, 1), 2 * 5),
    "addbmm": (
        lambda x, w, b: torch.addbmm(torch.zeros(5, 4), x[0].expand(3, 5, 5), b)[:1],
        2 * 3 * 5 * 5 * 4,
    ),
    "addr": (lambda x, w, b: torch.addr(w, w[:, 0], x[0]).sum(0, keepdim=True), 2 * 6 * 5),
    "cdist_pairwise": (lambda x, w, b: torch.cdist(x, w, p=1.0), 2 * 1 * 6 * 5),
    "cdist_euclidean_by_matmul": (
        lambda x, w, b: torch.cdist(x.expand(30, 5), w.repeat(5, 1)).sum(0, keepdim=True),
        2 * 30 * 30 * 5,
    ),
    "pdist": (lambda x, w, b: F.pdist(w).sum().reshape(1, 1), 2 * (6 * 5 // 2) * 5),
    # counted by torch's own formulas, through whatever a composite op decomposes into
    "baddbmm": (lambda x, w, b: torch.baddbmm(b[:, :, :1], b, b[:, :4, :1]), 2 * 3 * 5 * 4),
    "einsum_chain": (  # contracted as two matrix-vector products: (w x) then w^T (w x)
        lambda x, w, b: torch.einsum("i,ji,jk->k", x[0], w, w),
        2 * 6 * 5 * 2,
    ),
    "tensordot": (lambda x, w, b: torch.tensordot(b, x[0], dims=([1], [0])), 2 * 3 * 4 * 5),
    "multi_dot": (lambda x, w, b: torch.linalg.multi_dot([x, w.T, w]), 2 * 6 * 5 * 2),
    "sdpa_flash_cpu": (
        lambda x, w, b: F.scaled_dot_product_attention(b[None], b[None], b[None]),
        2 * 2 * 3 * 5 * 5 * 4,  # QK^T and softmax . V: b 1, h 3, s_q = s_k = 5, d 4
    ),
    "sdpa_masked_math": (
        lambda x, w, b: F.scaled_dot_product_attention(
            b[None], b[None], b[None], attn_mask=torch.ones(5, 5, dtype=torch.bool).tril()
        ),
        2 * 2 * 3 * 5 * 5 * 4,
    ),
    "conv1d": (lambda x, w, b: F.conv1d(x[None], b[:, None, :3, 0]), 2 * 3 * 3 * 3),
    "conv3d": (
        lambda x, w, b: F.conv3d(b[None, None], b[:2, None, None, :2, :2]),
        2 * 2 * (3 * 4 * 3) * 4,  # C_out 2, output 3 x 4 x 3, a 1 x 1 x 2 x 2 kernel each
    ),
    "conv_transpose2d": (
        lambda x, w, b: F.conv_transpose2d(x.view(1, 1, 1, 5), b[None, :2, :2, :2]),
        2 * 5 * 2 * 2 * 2,  # each of the 5 inputs meets the 2 x 2 x 2 kernel
    ),
    "conv_tbc": (
        lambda x, w, b: torch.conv_tbc(x.view(5, 1, 1), b[:, :1, :], torch.zeros(4)).flatten(1),
        2 * 3 * 1 * 4 * 1 * 3,  # T_out = 5 - 3 + 1 = 3, B = 1, C_out = 4, C_in = 1, K = 3
    ),
}


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_matrix_kernels_without_a_torch_formula_are_counted(name):
    """Once 0 FLOPs each (``aten.mv`` / ``addmv`` / ``addbmm`` / ``dot`` / ``cdist`` ...):
    the branch's cost is now its hand count, the model without it costs nothing."""
    torch.manual_seed(0)
    fn, want = KERNELS[name]
    model = nn.Sequential(SkippableResidual(Kernel(fn)))
    assert mask_costs(model, torch.randn(1, 5)).tolist() == [0, want]


REFUSED = {  # name: (forward of x [1, 5], the kernel named in the refusal)
    "solve": (lambda x, w, b: torch.linalg.solve(w[:5], x[0])[None], "_linalg_solve_ex"),
    "pinv": (lambda x, w, b: torch.linalg.pinv(w), "linalg_pinv"),
    "ldl": (lambda x, w, b: torch.linalg.ldl_factor(w[:5] @ w[:5].T).LD, "linalg_ldl_factor_ex"),
    "inv": (lambda x, w, b: torch.linalg.inv(w[:5]), "linalg_inv_ex"),
    "svdvals": (lambda x, w, b: torch.linalg.svdvals(w), "_linalg_svd"),
    "spectral_norm": (lambda x, w, b: torch.linalg.matrix_norm(w, ord=2), "_linalg_svd"),
    "eigvalsh": (lambda x, w, b: torch.linalg.eigvalsh(w.T @ w), "_linalg_eigh"),
    "qr": (lambda x, w, b: torch.linalg.qr(w).R, "linalg_qr"),
    "det": (lambda x, w, b: torch.linalg.det(w[:5]), "_linalg_det"),
    "matrix_exp": (lambda x, w, b: torch.linalg.matrix_exp(w[:5]), "linalg_matrix_exp"),
    "rfft": (lambda x, w, b: torch.fft.rfft(x).abs(), "_fft_r2c"),
    "bilinear": (lambda x, w, b: F.bilinear(x, x, w[:5].expand(2, 5, 5)), "_trilinear"),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_linear_algebra_without_a_formula_is_refused_naming_the_module(name):
    """Matrix work with no formula (factorizations, inverses, transforms, and one kernel
    around an SVD such as ``pinv``, which the counter once saw as 0 FLOPs) is refused,
    naming the kernel and the module that ran it."""
    fn, kernel = REFUSED[name]
    model = nn.Sequential(SkippableResidual(Kernel(fn)))
    with pytest.raises(FathomError, match=rf"Sequential\.0\.branch.*aten\.{kernel}\b"):
        mask_costs(model, torch.randn(1, 5))


# -- the model as found: every module's flag, every buffer -----------------------------------
class Counter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        self.calls += 1
        return x


def frozen_bn_model() -> nn.Module:
    """A model in ``train()`` whose BatchNorm is frozen in ``eval()``, and a call counter."""
    torch.manual_seed(0)
    bn = nn.BatchNorm1d(4)
    model = nn.Sequential(
        nn.Linear(3, 4), SkippableResidual(nn.Sequential(bn, Counter(), nn.Linear(4, 4)))
    )
    model.train()
    bn.eval()
    return model


def test_mask_costs_leaves_every_flag_and_buffer_as_found():
    """Once only the root's flag came back: the frozen BatchNorm returned in ``train()``."""
    model = frozen_bn_model()
    flags = [(n, m.training) for n, m in model.named_modules()]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    mask_costs(model, torch.randn(2, 3))
    assert [(n, m.training) for n, m in model.named_modules()] == flags
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
    assert int(model[1].branch[1].calls) == 0


def test_a_compiled_model_is_refused_with_the_true_reason():
    """Once "modified in place"; now: compiled, pass ``model._orig_mod``."""
    model = frozen_bn_model()
    compiled = torch.compile(model, backend="eager")
    with pytest.raises(FathomError, match=r"torch\.compile.*model\._orig_mod"):
        mask_costs(compiled, torch.randn(2, 3))
    mask_costs(compiled._orig_mod, torch.randn(2, 3))
