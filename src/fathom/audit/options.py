"""Names the audit's command line and its pipeline step share, kept light (no numpy, no torch)."""

from __future__ import annotations

CHECKPOINT_CHOICES: dict[str, tuple[str, ...]] = {
    "selected": ("selected",),
    "final": ("final",),
    "both": ("selected", "final"),
}
"""``--checkpoint`` value -> the checkpoints audited (the minimum-validation-CE one, the last, or both)."""
