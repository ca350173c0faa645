"""Callbacks for the training loops people use: PyTorch Lightning
(:mod:`fathom.integrations.lightning`) and the Hugging Face ``Trainer``
(:mod:`fathom.integrations.huggingface`), both over one
:class:`~fathom.integrations.observer.EpochObserver`: Fathom's instruments at epoch ends,
each row logged through Fathom's export targets and read back when training ends.

Each callback module imports its framework (an optional extra), so import it by name:
``from fathom.integrations.lightning import FathomCallback``.
"""
