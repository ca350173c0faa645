"""The foundation layer: files, interrupts, lazy exports, provenance, terminal output, units,
user code.

Nothing here imports another fathom package but :mod:`fathom.errors`; importing the package
imports none of its modules."""
