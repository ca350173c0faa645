"""Validated configuration (``fathom.config``): a run is one :class:`RunConfig`.

The package's face: every name of :mod:`fathom.config.run` (``RunConfig`` and its sections,
``validate_run_config``, ``load_toml``, ``config_diff``, ...; the section models of
:mod:`fathom.config.models` and ``LiveConfig`` of :mod:`fathom.config.live` it imports)
resolves here on first use (:func:`fathom.base.lazy.forward`), as when ``fathom.config`` was
one module. Nothing is imported with the package, so a light submodule costs no model
building: ``import fathom.config.models`` does not build ``RunConfig``.
"""

from fathom.base.lazy import forward

__getattr__, __dir__ = forward(__name__, "fathom.config.run")
