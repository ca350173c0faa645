"""Offline curvature in float64: exact diagonals, KFAC factors and spectra, output mismatch.

Functional core: :mod:`softmax` (cancellation-resistant CE pieces), :mod:`probe` (the
float64 dense-evaluation copy and the pullback of the ``C`` logit directions through
:mod:`fathom.seam`), :mod:`twin` (that copy and its seam, cached per model structure),
:mod:`exact` (diagonals of any model, any subset of the families), :mod:`estimate` (Monte-Carlo
and Hutchinson diagonals with standard errors, and the ``"auto"`` choice by a budget),
:mod:`kfac` (Linear / Conv2d), :mod:`mismatch`; :mod:`snapshot` assembles one record (with the
per-example gradients' concentration from their Gram);
:mod:`rundir` and :mod:`cli` run it over a run directory's checkpoints.
"""

from fathom.base.lazy import exports

__getattr__, __dir__, __all__ = exports(
    __name__,
    {
        "fathom.curvature.estimate": ["Budget", "Estimate", "diagonals"],
        "fathom.curvature.exact": ["exact_diagonals"],
        "fathom.curvature.kfac": ["effective_rank", "gram_spectrum", "kronecker_factors"],
        "fathom.curvature.mismatch": ["output_mismatch", "solve_lyapunov_on_support"],
        "fathom.curvature.snapshot": ["curvature_snapshot", "gradient_concentration"],
    },
)
