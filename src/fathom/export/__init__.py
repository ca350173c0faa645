"""Exports of run directories: JSONL, W&B (offline) and TensorBoard, each verified by reading back."""

from fathom.export.common import VerifyReport
from fathom.export.run import TARGETS, export, verify

__all__ = ["TARGETS", "VerifyReport", "export", "verify"]
