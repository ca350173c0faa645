"""Verified datasets as device-resident uint8 tensors with recorded, seeded splits.

``load_raw(name, data_dir)`` finds, verifies (SHA-256 / MD5) and parses a dataset's
official files; ``make_splits(raw, mode, seed, ...)`` builds the fitting / validation /
test tensors and their split hash. See :mod:`fathom.data.sources` for the source order.
"""

from fathom.data.augment import pad_to, random_crop_flip
from fathom.data.load import RawDataset, load_raw
from fathom.data.registry import DATASETS, CifarDataset, IdxDataset, IdxFile, dataset_spec
from fathom.data.splits import SPLIT_MODES, DataSplits, make_splits

__all__ = [
    "DATASETS",
    "SPLIT_MODES",
    "CifarDataset",
    "DataSplits",
    "IdxDataset",
    "IdxFile",
    "RawDataset",
    "dataset_spec",
    "load_raw",
    "make_splits",
    "pad_to",
    "random_crop_flip",
]
