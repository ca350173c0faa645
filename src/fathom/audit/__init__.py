"""Layer-removal audit: every branch mask, deletion damage, interactions, per-class
resilience, reduced-network speed and a router that must beat its shuffled control.

The functional core works on arrays (:mod:`masks`, :mod:`evaluate`, :mod:`interactions`,
:mod:`resilience`, :mod:`router`, :mod:`speed`); :mod:`fathom.audit.run` applies it to run
directories and :mod:`fathom.audit.cli` is ``fathom audit``.
"""
