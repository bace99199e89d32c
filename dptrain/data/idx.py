"""A strict reader for IDX files, the format MNIST is published in (gzip or raw).

IDX header: two zero bytes, an element-type byte, the number of dimensions, then one
big-endian uint32 per dimension, then the data. Only the unsigned-byte type (MNIST's) is
read; every other deviation is a DataError naming the file.
"""

from __future__ import annotations

import gzip
import math
import zlib
from pathlib import Path

import numpy as np

from .dataset import DataError

# IDX header: two zero bytes, an element-type byte, the number of dimensions, then one
# big-endian uint32 per dimension. MNIST uses only type 0x08 (unsigned byte).
_IDX_UBYTE = 0x08
_IDX_TYPE_NAMES = {
    0x08: "uint8",
    0x09: "int8",
    0x0B: "int16",
    0x0C: "int32",
    0x0D: "float32",
    0x0E: "float64",
}
_GZIP_MAGIC = b"\x1f\x8b"


def _read_bytes(path: Path) -> bytes:
    """The file's content, decompressed when it starts with the gzip magic (not by name)."""
    raw = path.read_bytes()
    if raw[:2] != _GZIP_MAGIC:
        return raw
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as exc:  # BadGzipFile is an OSError
        raise DataError(f"{path}: corrupt gzip data ({type(exc).__name__}: {exc})") from exc


def read_idx(path) -> np.ndarray:
    """Read an IDX file (gzip or raw) into a read-only uint8 array shaped by its header.

    Raises DataError naming the file for a wrong magic number, an unsupported element type,
    a truncated file, trailing bytes after the data, or corrupt gzip data.
    """
    path = Path(path)
    return _parse_idx(_read_bytes(path), path)


def _parse_idx(data: bytes, path: Path) -> np.ndarray:
    """The array of an IDX file's (decompressed) bytes; `path` names it in errors."""
    if len(data) < 4:
        raise DataError(
            f"{path}: truncated IDX header: expected at least 4 bytes, found {len(data)}"
        )
    zero0, zero1, elem_type, ndim = data[0], data[1], data[2], data[3]
    if zero0 != 0 or zero1 != 0 or ndim == 0:
        found = int.from_bytes(data[:4], "big")
        raise DataError(
            f"{path}: not an IDX file: wrong magic number 0x{found:08x}, expected "
            f"0x0000TTNN (two zero bytes, element type TT = 0x08, "
            f"number of dimensions NN >= 1)"
        )
    if elem_type != _IDX_UBYTE:
        kind = _IDX_TYPE_NAMES.get(elem_type, "unknown")
        raise DataError(
            f"{path}: unsupported IDX element type 0x{elem_type:02x} ({kind}); "
            f"only 0x08 (uint8) is supported"
        )
    header_len = 4 + 4 * ndim
    if len(data) < header_len:
        raise DataError(
            f"{path}: truncated IDX header: {ndim} dimensions need {header_len} "
            f"bytes, found {len(data)}"
        )
    dims = tuple(int(d) for d in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    expected = math.prod(dims)
    found = len(data) - header_len
    if found < expected:
        raise DataError(
            f"{path}: truncated file: dims {dims} need {expected} bytes of data, found {found}"
        )
    if found > expected:
        raise DataError(
            f"{path}: trailing garbage: dims {dims} need {expected} bytes of data, "
            f"found {found} ({found - expected} extra)"
        )
    return np.frombuffer(data, dtype=np.uint8, count=expected, offset=header_len).reshape(dims)
