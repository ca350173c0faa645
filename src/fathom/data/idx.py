"""The IDX format (LeCun's MNIST container), raw or gzip-compressed.

Layout: two zero bytes, a dtype code, the number of dimensions ``d``; then ``d``
big-endian uint32 sizes; then ``prod(sizes) * itemsize`` big-endian values. Anything
else (bad magic, unknown dtype, trailing or missing bytes) is rejected with the file named.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from fathom.data.gzipped import decompress_if_gzip
from fathom.errors import FathomError

# IDX dtype code -> numpy dtype (big-endian).
IDX_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype("u1"),
    0x09: np.dtype("i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def parse_idx(data: bytes, name: str = "<bytes>") -> torch.Tensor:
    """Parse uncompressed IDX bytes into a tensor of the stored dtype and shape."""
    fix = "Delete the file and fetch it again (`fathom data fetch DATASET`)."
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise FathomError(
            f"{name}: not an IDX file (magic number {data[:4].hex() or 'missing'}; "
            f"expected 0000<dtype><ndim>). {fix}"
        )
    code, ndim = data[2], data[3]
    if code not in IDX_DTYPES:
        raise FathomError(
            f"{name}: unknown IDX dtype code 0x{code:02x} (valid: "
            f"{', '.join(f'0x{c:02x}' for c in IDX_DTYPES)}). {fix}"
        )
    if ndim == 0:
        raise FathomError(f"{name}: IDX header declares 0 dimensions. {fix}")
    header = 4 + 4 * ndim
    if len(data) < header:
        raise FathomError(f"{name}: truncated IDX header ({len(data)} bytes, need {header}). {fix}")
    shape = tuple(int(s) for s in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    dtype = IDX_DTYPES[code]
    expected = header + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(data) != expected:
        what = "truncated" if len(data) < expected else "has trailing bytes"
        raise FathomError(
            f"{name}: IDX file {what}: {len(data)} bytes, but the header "
            f"(shape {shape}, dtype {dtype.name}) needs {expected}. {fix}"
        )
    values = np.frombuffer(data, dtype=dtype, offset=header).reshape(shape)
    return torch.from_numpy(values.astype(dtype.newbyteorder("="), copy=True))


def read_idx(path: str | os.PathLike) -> torch.Tensor:
    """Read an IDX file, raw or gzip-compressed (detected by content, not by name)."""
    path = Path(path)
    data = decompress_if_gzip(path.read_bytes(), str(path))
    return parse_idx(data, str(path))
