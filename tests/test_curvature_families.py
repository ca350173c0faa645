"""exact_diagonals(families=...): only the requested families, each exact.

Without the Jacobian Gram the families' own output directions are pulled back (the GGN's
``C`` softmax-Hessian square-root columns, the Fisher's residual) instead of the ``C`` unit
directions; these tests hold every subset to the float64 ``vmap(jacrev)`` brute force of
``test_curvature_zoo`` and to the all-families result.
"""

from __future__ import annotations

import pytest
import torch

import fathom.pex_conv
from fathom.curvature import exact_diagonals
from fathom.curvature.exact import OLD_NAMES
from fathom.errors import FathomError
from model_zoo import CASES, make
from test_curvature_zoo import RTOL, ZOO, brute_force, relative_error

torch.set_num_threads(1)
SUBSETS = [
    ("ggn",),
    ("empirical_fisher",),
    ("jacobian_gram",),
    ("ggn", "empirical_fisher"),
    ("empirical_fisher", "jacobian_gram"),
]


@pytest.mark.parametrize("case", ZOO, ids=[c["id"] for c in ZOO])
def test_every_family_subset_matches_brute_force(case) -> None:
    model, x, y = make(case, n=5)
    want = brute_force(model, x, y)
    every = exact_diagonals(model, x, y, families="all")
    names = [n for n, _ in model.named_parameters()]
    bad = []
    for subset in SUBSETS:
        got = exact_diagonals(model, x, y, families=subset)
        assert list(got) == list(subset), f"{subset}: returned {list(got)}"
        for kind in subset:
            assert list(got[kind]) == names
            for name in names:
                g = got[kind][name]
                assert g.dtype == torch.float64 and g.shape == want[kind][name].shape
                err = relative_error(g, want[kind][name])
                same = relative_error(g, every[kind][name])
                if not (err <= RTOL and same <= 1e-12):
                    bad.append(f"{subset} {kind}/{name}: {err:.3g} vs brute force, {same:.3g}")
    assert not bad, "\n".join(bad)


def test_one_family_name_is_accepted_as_a_string() -> None:
    model, x, y = make(CASES[0], n=4)
    got = exact_diagonals(model, x, y, families="empirical_fisher")
    assert list(got) == ["empirical_fisher"]
    want = exact_diagonals(model, x, y)["empirical_fisher"]
    for name, t in got["empirical_fisher"].items():
        torch.testing.assert_close(t, want[name], rtol=1e-13, atol=0)


@pytest.mark.parametrize("families", [("ggn", "hessian"), (), "GGN", ["kfac"], 3, [["ggn"]]])
def test_unknown_families_are_refused_naming_the_choices(families) -> None:
    model, x, y = make(CASES[0], n=4)
    with pytest.raises(
        FathomError, match="choose from ggn, empirical_fisher, jacobian_gram or 'all'"
    ):
        exact_diagonals(model, x, y, families=families)


@pytest.mark.parametrize("old", [("fisher",), ("jacobian",), ("ggn", "fisher", "jacobian")])
def test_old_family_names_still_select_their_family(old) -> None:
    """Calls written with the short names (before one name per family) keep working and
    return the families under their one name."""
    model, x, y = make(CASES[0], n=4)
    got = exact_diagonals(model, x, y, families=old if len(old) > 1 else old[0])
    assert tuple(got) == tuple(OLD_NAMES.get(f, f) for f in old)
    want = exact_diagonals(model, x, y)
    for kind, per in got.items():
        for name, t in per.items():
            torch.testing.assert_close(t, want[kind][name], rtol=1e-13, atol=0)


@pytest.mark.parametrize("case_id", ["residual_cnn", "staged_lif"])
def test_unfolded_convolution_chunks_change_nothing(case_id, monkeypatch) -> None:
    """The per-direction convolution gradients unfold patches in chunks of examples that
    bound memory; a budget of one example per chunk gives the same diagonals."""
    case = next(c for c in CASES if c["id"] == case_id)
    model, x, y = make(case, n=5)
    want = exact_diagonals(model, x, y)
    monkeypatch.setattr(fathom.pex_conv, "UNFOLD_ELEMENTS", 1)
    got = exact_diagonals(model, x, y)
    for kind in want:
        for name, t in want[kind].items():
            torch.testing.assert_close(got[kind][name], t, rtol=1e-13, atol=0)


class _Bag(torch.nn.Module):
    """An embedding with ``padding_idx`` whose tokens repeat within an example."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(6, 3, padding_idx=2)
        self.head = torch.nn.Linear(3, 4)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.embed(tokens)).mean(1))


def test_embedding_pair_sums_match_brute_force_with_repeats_and_padding() -> None:
    """Without unit directions an embedding's sums run over (example, token) pairs
    (``fathom.pex_embedding.embedding_pairs``): repeated tokens add before squaring, the
    padding row gets zero, rows never looked up too."""
    torch.manual_seed(3)
    model = _Bag().double().eval()
    x = torch.tensor([[0, 0, 2, 1, 0], [2, 2, 3, 3, 1], [1, 0, 1, 0, 1]])
    y = torch.tensor([0, 3, 1])
    want = brute_force(model, x, y)
    for subset in (("ggn",), ("empirical_fisher",), ("ggn", "empirical_fisher")):
        got = exact_diagonals(model, x, y, families=subset)
        for kind in subset:
            w = want[kind]["embed.weight"]
            assert relative_error(got[kind]["embed.weight"], w) <= RTOL, (subset, kind)
            assert float(got[kind]["embed.weight"][2].abs().max()) == 0.0
            assert float(got[kind]["embed.weight"][4:].abs().max()) == 0.0
            assert float(w[3].abs().max()) > 0


def test_a_result_read_by_an_old_family_name_warns_and_is_the_new_family() -> None:
    """Code written before the rename (``d["fisher"]``) keeps working, told the new key;
    a family not computed, or a name that was never one, is still a ``KeyError``."""
    model, x, y = make(ZOO[0], n=4)
    got = exact_diagonals(model, x, y, families=("empirical_fisher", "jacobian_gram"))
    for old, new in OLD_NAMES.items():
        with pytest.warns(FutureWarning, match=new):
            assert got[old] is got[new]
    only_ggn = exact_diagonals(model, x, y, families="ggn")
    for key in ("fisher", "jacobian", "hessian"):
        with pytest.raises(KeyError):
            only_ggn[key]
    assert "fisher" not in got and list(got) == ["empirical_fisher", "jacobian_gram"]
