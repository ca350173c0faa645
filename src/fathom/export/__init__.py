"""Exports of run directories: JSONL, W&B (offline) and TensorBoard, each verified by reading back."""

from fathom.base.lazy import exports

__getattr__, __dir__, __all__ = exports(
    __name__,
    {
        "fathom.export.common": ["VerifyReport"],
        "fathom.export.run": ["TARGETS", "export", "verify"],
    },
)
