"""Verified datasets as device-resident uint8 tensors with recorded, seeded splits.

``load_raw(name, data_dir)`` finds, verifies (SHA-256 / MD5) and parses a dataset's
official files; ``make_splits(raw, mode, seed, ...)`` builds the fitting / validation /
test tensors and their split hash. See :mod:`fathom.data.sources` for the source order.
"""

from fathom.base.lazy import exports

__getattr__, __dir__, __all__ = exports(
    __name__,
    {
        "fathom.data.augment": ["pad_to", "random_crop_flip"],
        "fathom.data.load": ["RawDataset", "load_raw"],
        "fathom.data.registry": [
            "DATASETS",
            "CifarDataset",
            "IdxDataset",
            "IdxFile",
            "dataset_spec",
        ],
        "fathom.data.splits": ["SPLIT_MODES", "DataSplits", "make_splits"],
    },
)
