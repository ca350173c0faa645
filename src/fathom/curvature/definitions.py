"""The definition of every quantity a curvature snapshot records (declared once, written into it)."""

from __future__ import annotations

NORMALIZATION = (
    "mean over the N probe examples: every matrix is (1/N) sum_i of per-example terms "
    "(the curvature of the mean CE over the probe, CE per example unaveraged); KFAC factors "
    "A and G are also (1/N) sums"
)

DEFINITIONS: dict[str, str] = {
    "ggn": "CE generalized Gauss-Newton (1/N) sum_i J_i^T H_i J_i, H_i = diag(p_i) - p_i p_i^T; "
    "estimator exact (full enumeration of the C columns of S_i = diag(sqrt p_i) - p_i sqrt(p_i)^T)",
    "empirical_fisher": "(1/N) sum_i g_i g_i^T with g_i the gradient of CE_i at the observed label; "
    "estimator exact",
    "jacobian_gram": "logit-Jacobian Gram (1/N) sum_i J_i^T J_i (no loss curvature); estimator exact",
    "kfac": "KFAC approximation G (x) A of a Linear / Conv2d layer's CE-GGN weight block (KFC "
    "convention, Grosse & Martens 2016): A = (1/N) sum_i sum_p a_ip a_ip^T (uncentered, summed "
    "over the P positions: sequence entries / output pixels with unfolded patches), "
    "G = (1/N) sum_i sum_k (1/P) sum_p u_ikp u_ikp^T from the exact GGN output directions; "
    "biases excluded; every other layer is listed as not covered",
    "activation_effective_rank": "effective rank of the layer's KFAC A factor (uncentered "
    "second moment of its inputs / patches, not a centered covariance)",
    "effective_rank": "exp of the spectral entropy: exp(-sum q log q), q = lambda / sum lambda",
    "kfac_rayleigh_mean_gradient": "KFAC quantity: vec(gbar)^T (G (x) A) vec(gbar) / ||gbar||^2 "
    "for gbar the layer's probe-mean CE weight gradient",
    "kfac_rayleigh_per_example": "KFAC quantity, one value per probe example (probe order): "
    "vec(g_i)^T (G (x) A) vec(g_i) / ||g_i||^2 for g_i example i's observed-label CE weight "
    "gradient (null where g_i = 0); a description of the KFAC operator, not of the exact GGN",
    "exact_ggn_rayleigh_mean_gradient": "exact CE-GGN layer block along the same gbar, for comparison",
    "kfac_diag_rel_l1_error": "sum |diag(G) (x) diag(A) - diag(GGN)| / sum |diag(GGN)| over the "
    "layer weights",
    "gradient_concentration": "per-example observed-label CE gradients g_i of the layer weights "
    "(biases excluded); covariance is the population one (1/N)",
    "traces": "weight traces sum the exact weight diagonals; bias traces are reported separately",
    "prediction_agreement": "the float64 probe model against the recorded float32 model on the "
    "same probe: fraction of examples with the same argmax, and max |logit64 - logit32|",
    "estimator": "how each family's numbers were made: exact (every output direction of the "
    "loss Hessian's square root pulled back), mc (K sampled output directions per example with "
    "E[v v^T] = H, a standard error from each example's sample variance over its K draws) or "
    "hutchinson (K Rademacher parameter-space probes, diag = mean_k z_k * (M z_k)); samples "
    "and seed are null for exact (fathom.curvature.estimate)",
    "kfac_reduce": "KFAC-reduce (Eschenhagen et al. 2023), for weight sharing reduced before the "
    "loss: A = (1/N) sum_i abar_i abar_i^T with abar_i the position mean of the inputs, "
    "G = (1/N) sum_i sum_k gbar_ik gbar_ik^T with gbar_ik the position sum of the pulled-back "
    "GGN directions (fathom.curvature.kronecker_factors)",
    "source_sha256": "fathom.base.provenance.source_hash() of the code that computed the snapshot",
}
