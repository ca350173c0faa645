"""Layer-removal audit: every branch mask, deletion damage, interactions, per-class
resilience, reduced-network speed and a router that must beat its shuffled control.

The functional core works on arrays (:mod:`masks`, :mod:`evaluate`, :mod:`costs`,
:mod:`interactions`, :mod:`resilience`, :mod:`router`, :mod:`speed`); :mod:`fathom.audit.run`
applies it to run directories and :mod:`fathom.audit.cli` is ``fathom audit``. On any model
whose removable branches are :class:`fathom.depth.SkippableResidual` modules::

    scores = fathom.audit.evaluate_masks(model, x, y)   # every mask: CE, accuracy, logits
    costs = fathom.audit.mask_costs(model, x[:1])       # FLOPs per mask (torch's counter)
"""

from fathom.base.lazy import exports

__getattr__, __dir__, __all__ = exports(
    __name__,
    {
        "fathom.audit.costs": ["mask_costs"],
        "fathom.audit.evaluate": ["MaskScores", "evaluate_masks"],
    },
)
