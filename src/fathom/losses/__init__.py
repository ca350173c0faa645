"""Losses as arguments: where an output meets a target, read in one layout, in closed form.

:mod:`layout` (which output of a model, where its classes are, the canonical ``[N, P, C]``
view; :func:`read_output`, the one layout checker), :mod:`kinds` (the losses, their values,
residuals and Hessian square-root factors, the one normalization ``w_ip``; :func:`make_loss`),
:mod:`softmax` (the cancellation-resistant softmax pieces cross-entropy is built from).
"""

from fathom.base.lazy import exports

__getattr__, __dir__, __all__ = exports(
    __name__,
    {
        "fathom.losses.kinds": [
            "LOSSES",
            "LOSS_DEFINITIONS",
            "BCEWithLogits",
            "CrossEntropy",
            "Loss",
            "MSE",
            "Terms",
            "make_loss",
        ],
        "fathom.losses.layout": ["Layout", "read_output", "select_output"],
    },
)
