"""Offline curvature in float64: exact diagonals, KFAC factors and spectra, output mismatch.

Functional core: :mod:`softmax` (cancellation-resistant CE pieces), :mod:`chain` (a model as
a chain of affine taps), :mod:`exact` (diagonals, gradient concentration), :mod:`kfac`,
:mod:`mismatch`; :mod:`snapshot` assembles one record; :mod:`rundir` and :mod:`cli` run it
over a run directory's checkpoints.
"""

from fathom.curvature.chain import AffineChain, affine_chain, pullback
from fathom.curvature.exact import exact_ggn_diagonal, gradient_concentration
from fathom.curvature.kfac import effective_rank, gram_spectrum
from fathom.curvature.mismatch import output_mismatch, solve_lyapunov_on_support
from fathom.curvature.snapshot import curvature_snapshot

__all__ = [
    "AffineChain",
    "affine_chain",
    "curvature_snapshot",
    "effective_rank",
    "exact_ggn_diagonal",
    "gradient_concentration",
    "gram_spectrum",
    "output_mismatch",
    "pullback",
    "solve_lyapunov_on_support",
]
