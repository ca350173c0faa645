"""Read a ``.wandb`` file: wandb's record log, decoded with the protobufs wandb ships.

The file format (wandb's LevelDB-style log, the one ``wandb sync`` reads): a 7-byte
header ``":W&B"``, magic ``0xBEE1`` (uint16 LE), version ``0``; then 32 KiB blocks of
chunks, each ``crc32 (uint32 LE) | length (uint16 LE) | type (uint8) | payload``, where
``crc32 = zlib.crc32(payload, zlib.crc32(bytes([type])))`` and type is FULL (1) or a
FIRST (2), MIDDLE (3)..., LAST (4) sequence that concatenates into one record. A block
tail shorter than a chunk header is zero padding. Each record's payload is a
``wandb.proto.wandb_internal_pb2.Record``. Recent wandb releases no longer ship a
Python reader for this log, so this module is one; it checks every CRC.
"""

from __future__ import annotations

import contextlib
import struct
import time
import zlib
from pathlib import Path
from typing import Any

from fathom.errors import FathomError

_HEADER = struct.Struct("<4sHB")
_CHUNK = struct.Struct("<IHB")
_BLOCK = 32 * 1024
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def read_payloads(path: str | Path) -> list[bytes]:
    """Every record payload of a ``.wandb`` file, CRC-checked, in file order."""
    data = Path(path).read_bytes()
    if len(data) < _HEADER.size:
        raise FathomError(f"{path}: too short to be a .wandb file; export again")
    ident, magic, version = _HEADER.unpack_from(data)
    if ident != b":W&B" or magic != 0xBEE1 or version != 0:
        raise FathomError(
            f"{path}: not a .wandb record log (header {ident!r} {magic:#x} v{version})"
        )
    out: list[bytes] = []
    pending: bytes | None = None
    pos = _HEADER.size
    while pos < len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _CHUNK.size:
            pos += left
            continue
        if pos + _CHUNK.size > len(data):
            raise FathomError(f"{path}: truncated chunk header at byte {pos}")
        crc, length, kind = _CHUNK.unpack_from(data, pos)
        if kind == 0 and length == 0:
            pos += left
            continue
        payload = data[pos + _CHUNK.size : pos + _CHUNK.size + length]
        if (
            len(payload) != length
            or zlib.crc32(payload, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF != crc
        ):
            raise FathomError(f"{path}: corrupt record at byte {pos} (CRC or length); export again")
        pos += _CHUNK.size + length
        if kind == FULL:
            out.append(payload)
        elif kind == FIRST:
            pending = payload
        elif kind in (MIDDLE, LAST) and pending is not None:
            pending += payload
            if kind == LAST:
                out.append(pending)
                pending = None
        else:
            raise FathomError(f"{path}: unexpected chunk type {kind} at byte {pos}")
    return out


def read_records(path: str | Path) -> list[Any]:
    """The decoded ``Record`` protobufs of a ``.wandb`` file."""
    from wandb.proto import wandb_internal_pb2 as pb

    records = []
    for payload in read_payloads(path):
        rec = pb.Record()
        rec.ParseFromString(payload)
        records.append(rec)
    return records


def is_complete(records: list[Any]) -> bool:
    """Whether a record log holds its run's ``exit`` record (W&B writes it last)."""
    return any(rec.WhichOneof("record_type") == "exit" for rec in records)


def wait_complete(path: str | Path, timeout_s: float = 60.0, poll_s: float = 0.02) -> bool:
    """Wait until the ``.wandb`` file at ``path`` holds its ``exit`` record; False on timeout.

    ``wandb.Run.finish()`` can return before W&B's service has written the file's last
    records (seen with two exporting processes on two busy cores: the run and config
    records there, history and summary not yet), so a read right after it may see a run
    cut short. A file still being written may also end inside a chunk; both are waited
    out, not reported.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(FathomError, OSError):  # not there yet, or ends mid-chunk
            if is_complete(read_records(path)):
                return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)
