"""Stochastic depth whose dropped branches are really not computed.

The function (per call, one Bernoulli decision per branch, shared by the batch)::

    training:    y = bypass(x) + kept * branch(x) / (1 - p)      kept ~ Bernoulli(1 - p)
    evaluation:  y = bypass(x) + branch(x)                        (gain one, always)
    explicit:    y = bypass(x) + mask * branch(x)                 (mask in {0, 1}, gain one, any mode)

:class:`SkippableResidual` behaves like a PyTorch module: in ``train()`` a module with
``p > 0`` draws its own decision on every forward from its own generator (``p`` is any real
scalar in ``[0, 1)``: a Python, numpy or 0-d torch number, stored as a Python float; NaN,
booleans and arrays are refused, :func:`check_drop_prob`); in ``eval()``
every branch has gain one whatever was drawn before; the generator state lives in
``state_dict()`` (``<name>._extra_state``, a ``uint8`` tensor), so a saved and loaded model
resumes the same decision sequence. Precedence of what decides a forward's gain:

1. an explicit mask (:func:`branch_mask`), in either mode;
2. in ``eval()``: gain one;
3. a gain set from outside (``module.gain``, by a :class:`GateController` or the trainer's
   plans drawn ahead, :mod:`fathom.train.fast`; a device tensor on the CUDA-graph path);
4. the module's own draw (``p > 0``), or gain one (``p == 0``).

The control flow: when ``kept == 0`` the branch is *not called*: no matmul forward,
nothing recorded for backward, so its parameters receive ``grad is None`` and every
``torch.optim`` implementation (for-loop, foreach, fused; SGD, Adam, AdamW) leaves them,
their momentum, their weight decay, their Adam moments and step counts untouched on that
step (``zero_grad(set_to_none=True)`` is required; it is torch's default and what
:mod:`fathom.train` does).

A kept branch's gain is ``bypass(x) + out * g`` with ``g`` a cached 0-d tensor of the
output's dtype (the value the kernel reads from the float, without converting a wrapped
float64 scalar forward and backward: :func:`~fathom.depth.residual.gain_tensor`), the same
bits as the Python float; every branch, hooked or not, takes this one form.

A plain loop with a schedule (the drop probabilities may change every epoch)::

    model = nn.Sequential(nn.Linear(8, 16), SkippableResidual(nn.Linear(16, 16), p=0.2, seed=0),
                          nn.Linear(16, 3))
    for epoch in range(epochs):
        set_drop_probs(model, [0.2 * (1 - epoch / epochs)])
        model.train()          # each forward drops the branch with probability p
        ...
        model.eval()           # dense: gain one

``torch.compile``: the decision is a host-side draw in a function excluded from tracing
(:func:`torch.compiler.disable`), so a compiled model graph-breaks around it and keeps the
eager semantics (the same decisions from the same generator, a dropped branch not run); a
module built with ``seed=None`` seeds its generator at its first draw in another excluded
function, so a compiled model consumes torch's global generator as the eager one does and
draws the same decisions (inductor would otherwise lower the seed's ``randint`` to its own RNG);
``fullgraph=True`` refuses the graph break with torch's ``Unsupported`` error quoting
:data:`COMPILE_BREAK_REASON`. A module whose gain is set from outside, or with ``p = 0``, or
in ``eval()``, draws nothing and compiles whole. A self-sampling module cannot be captured in a
CUDA graph (the draw would be frozen at capture): set its gains from outside, as the
trainer's graph path does.

Conventions differ elsewhere; say which one a recipe used when transferring it:

* Huang et al. (2016), *Deep Networks with Stochastic Depth*: survivors are unscaled in
  training and the test-time branch is weighted by its survival probability. Fathom's
  default (``convention = "inverse"``, the seed's) uses inverse-survival gains in training
  and gain one at test time (same expectation of the pre-activation, different
  parameterisation). ``convention = "huang"`` (a module's argument; a run's
  ``depth.convention``) is Huang's::

      training:    y = bypass(x) + kept * branch(x)                  (no multiply at all)
      evaluation:  y = bypass(x) + (1 - p) * branch(x)
      explicit:    y = bypass(x) + mask * (1 - p) * branch(x)

  (:func:`~fathom.depth.residual.survival_gain`, :func:`~fathom.depth.residual.evaluation_gain`);
  a :class:`GateController` of that convention sets each branch's ``p`` to the schedule's
  of the epoch it draws, so evaluation, masks (the audit) and the curvature twin weight a
  branch by the survival it trains with.
* timm / torchvision ``DropPath`` / ``StochasticDepth``: the branch is computed and then
  multiplied by zero (per sample or per batch). That regularises but saves no work.
"""

from fathom.depth.control import (
    GateController,
    branch_mask,
    dense_eval,
    enter_dense,
    set_drop_probs,
    set_masks,
    state_kept,
)
from fathom.depth.residual import (
    COMPILE_BREAK_REASON,
    CONVENTIONS,
    Crop,
    SkippableResidual,
    check_drop_prob,
    draw_kept,
    evaluation_gain,
    find_branches,
    skippable_residual,
    survival_gain,
)
from fathom.depth.schedule import DropSchedule, huang_linear_in_depth

__all__ = [
    "COMPILE_BREAK_REASON",
    "CONVENTIONS",
    "Crop",
    "DropSchedule",
    "GateController",
    "SkippableResidual",
    "branch_mask",
    "check_drop_prob",
    "dense_eval",
    "draw_kept",
    "enter_dense",
    "evaluation_gain",
    "find_branches",
    "huang_linear_in_depth",
    "set_drop_probs",
    "set_masks",
    "skippable_residual",
    "state_kept",
    "survival_gain",
]
