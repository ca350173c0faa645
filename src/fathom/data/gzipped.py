"""Gzip-wrapped data files: recognised by their magic bytes, unwrapped with the file named.

Standard library only, so verifying a dataset's files (``fathom data verify``) imports no
numpy or torch.
"""

from __future__ import annotations

import gzip
import zlib

from fathom.errors import FathomError

_GZIP_MAGIC = b"\x1f\x8b"


def decompress_if_gzip(data: bytes, name: str) -> bytes:
    """Return ``data`` gunzipped when it starts with the gzip magic, else unchanged."""
    if not data.startswith(_GZIP_MAGIC):
        return data
    try:
        return gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as e:
        raise FathomError(
            f"{name}: corrupt gzip data ({e}). Delete the file and fetch it again "
            "(`fathom data fetch DATASET`)."
        ) from None
