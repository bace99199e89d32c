"""The files dptrain writes and reads back: models, checkpoints and the user's .npz data.

- ``write_atomically(path, write)``: a file written whole or not at all, durably: into a
  temporary beside it, flushed to disk, renamed over the old one (so a crash, a kill or a
  full disk at any moment leaves the previous file or the new one, never a truncated one).
- ``NpzArchive``: an .npz archive read member by member, every size checked from the
  headers before anything is allocated: the zip's own (a member's declared size, against
  the file's and the caller's bound) and the .npy header's (shape and dtype, against the
  caller's expectation). Only then is a member read, into an array of exactly that size,
  and its CRC checked. Any damage (truncation, a flipped bit, a zip bomb, a header that
  declares 2^40 values) is one ValueError naming the file, never NumPy's or zipfile's own
  exception (BadZipFile, EOFError, zlib.error, a MemoryError).
- ``write_text_atomically(path, text)``: the same, for the JSON and CSV outputs. A failed
  write is an OSError naming the file and the cause ("cannot write w.npz: File too large
  (errno 27); the previous w.npz is kept").
- ``read_json(path, expected)``: a JSON file, or one ValueError naming it, what it is (an
  .npz, binary data, invalid JSON) and what it should be.
- ``memory_bytes()``: this machine's physical memory, the bound on what a file may ask for.

Left out on purpose: pickled members (never loaded) and memory-mapping members (NumPy cannot
map inside a zip; .npy files are mapped by ``dptrain.data.from_npy``).
"""

from __future__ import annotations

import json
import math
import os
import struct
import zipfile
import zlib
from pathlib import Path

import numpy as np

# what reading a damaged zip or .npy can raise, besides ValueError (each seen on real bit
# flips of a model file): the zip's structures, its decompressors, the .npy header's parser
_DAMAGE = (
    OSError,
    EOFError,
    zipfile.BadZipFile,
    zipfile.LargeZipFile,
    zlib.error,
    struct.error,
    NotImplementedError,
    KeyError,
    ValueError,
    TypeError,
    UnicodeDecodeError,
    RuntimeError,
    SyntaxError,
    OverflowError,
    MemoryError,
)
_NPY_HEADER_BYTES = 1 << 16  # an .npy header's bound (NumPy writes ~128 bytes)
_READ_BYTES = 16 << 20  # a member's data is read in chunks of this size
NPZ_SUFFIX = ".npz"


def memory_bytes() -> int | None:
    """This machine's physical memory in bytes (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def size_text(nbytes: float) -> str:
    """1.5e9 -> '1.5 GB'."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{int(nbytes)} B"


def npz_path(path) -> Path:
    """The file np.savez writes for `path`: the path itself when it ends in .npz, else the
    path with .npz appended (``save("m")`` writes m.npz)."""
    p = Path(path).expanduser()
    return p if p.name.endswith(NPZ_SUFFIX) else p.with_name(p.name + NPZ_SUFFIX)


# ---------------------------------------------------------------- writing
def write_atomically(path, write) -> None:
    """Calls write(f) on a binary file object and makes what it wrote the file at `path`,
    atomically and durably: written to a temporary beside it, flushed to disk (the file,
    then the directory after the rename), renamed over the old one. A failure at any point
    (a full disk, a kill) leaves the previous file as it was. Temporaries that a killed
    writer left behind are removed."""
    path = Path(path)
    remove_stale_temporaries(path)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}{path.suffix}")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise _write_error(path, exc) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)


def savez(f, **arrays) -> None:
    """np.savez's format (an uncompressed zip of .npy members, zip64 where needed) written
    to the open binary file f, the zip closed on every path: NumPy 1.x's np.savez left its
    ZipFile open when a write failed (a full disk, a file-size limit), and the ZipFile's
    __del__ later wrote to the closed file and printed "Exception ignored" on stderr."""
    with zipfile.ZipFile(f, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, arr in arrays.items():
            with zf.open(name + ".npy", mode="w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(arr), allow_pickle=False)


def write_text_atomically(path, text: str) -> None:
    """``write_atomically`` of a text file (UTF-8): the JSON and CSV outputs."""
    write_atomically(path, lambda f: f.write(text.encode("utf-8")))


def _write_error(path: Path, exc: OSError) -> OSError:
    """The OSError of a failed write, naming the file and the cause (the OS's own names
    neither the file nor, on a write, anything but the errno), of the same class and errno:
    "cannot write w.npz: File too large (errno 27); the previous w.npz is kept"."""
    cause = exc.strerror or str(exc)
    if exc.errno is not None:
        cause += f" (errno {exc.errno})"
    kept = (
        f"the previous {path.name} is kept"
        if path.exists()
        else f"nothing was written to {path.name}"
    )
    error = type(exc)(f"cannot write {path}: {cause}; {kept}")
    error.errno = exc.errno
    return error


def remove_stale_temporaries(path: Path, *, own: bool = False) -> None:
    """Deletes <path>.tmp-PID<suffix> files (w.npz.tmp-PID.npz) whose writer (PID) no longer
    runs; own: this process's too (its writers, threads, are known to be gone)."""
    for tmp in path.parent.glob(f"{path.name}.tmp-*{path.suffix}"):
        pid = tmp.name[len(path.name) + 5 : len(tmp.name) - len(path.suffix)]
        if not pid.isdigit():
            continue
        if int(pid) == os.getpid():
            if own:
                tmp.unlink(missing_ok=True)
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            tmp.unlink(missing_ok=True)
        except PermissionError:  # alive, someone else's
            pass


def check_out_dir(path, flag: str) -> None:
    """An output directory, made where it is missing; refused naming `flag` where it
    cannot be written (a file in its place, no permission, a read-only file system), before
    any work: the sweep, study and plot commands said a bare "[Errno 30] Read-only file
    system: 'rofs/sw'" after their runs."""
    import tempfile

    try:
        Path(path).mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".dptrain-probe-"):
            pass
    except OSError as exc:
        raise ValueError(f"{flag} {path}: cannot write there ({exc.strerror or exc})") from None


def fsync_directory(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # not supported here (e.g. Windows): best effort
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# ---------------------------------------------------------------- reading
def read_npy_header(f) -> tuple[tuple[int, ...], bool, np.dtype]:
    """(shape, fortran_order, dtype) from an open .npy stream's header, reading nothing
    else; ValueError when it has none (or a damaged one)."""
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        return np.lib.format.read_array_header_1_0(f, max_header_size=_NPY_HEADER_BYTES)
    return np.lib.format.read_array_header_2_0(f, max_header_size=_NPY_HEADER_BYTES)


def sniff(path) -> str:
    """What a file is, from its first bytes: 'npz' (a zip), 'npy', 'json' (UTF-8 text whose
    first non-space character is { or [), 'text' (other UTF-8 text: CSV and the like),
    'not_utf8' (text in another encoding: UTF-16's byte-order mark, or no zero byte but
    bytes that are not UTF-8, such as Latin-1's), 'empty' or 'binary'."""
    with open(path, "rb") as f:
        head = f.read(4096)
    if not head:
        return "empty"
    if head.startswith(b"PK\x03\x04") or head.startswith(b"PK\x05\x06"):
        return "npz"
    if head.startswith(b"\x93NUMPY"):
        return "npy"
    if b"\0" not in head:
        text = "json" if head.lstrip()[:1] in (b"{", b"[") else "text"
        try:
            head.decode("utf-8-sig")
            return text
        except UnicodeDecodeError as exc:
            if exc.start >= len(head) - 3:  # a character cut by the 4096-byte window
                return text
    return "not_utf8" if _text_elsewise(head) else "binary"


def _text_elsewise(head: bytes) -> bool:
    """Whether bytes that are not UTF-8 are text in another encoding: UTF-16 after its
    byte-order mark, or 8-bit text (Latin-1, cp1252) whose bytes are nearly all printable
    ASCII (random bytes: about 4 in 10)."""
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        body = head[2 : len(head) - len(head) % 2]
        try:
            chars = body.decode("utf-16-le" if head[0] == 0xFF else "utf-16-be")
        except UnicodeDecodeError:
            return False
    elif b"\0" in head:
        return False
    else:
        chars = head.decode("latin-1")
    printable = sum(c.isascii() and (c.isprintable() or c in "\t\r\n") for c in chars)
    return bool(chars) and printable >= 0.9 * len(chars)


# what a file is, by ``sniff``'s kind: the words every message about a mistaken file uses
KIND_NAMES = {
    "npy": "a .npy array (np.save's format)",
    "npz": "an .npz archive (np.savez's format)",
    "json": "a JSON file (such as a run's --out result)",
    "text": "a text file (CSV?)",
    "empty": "empty",
    "not_utf8": "text that is not UTF-8 (CSV is read as UTF-8: save the file as UTF-8)",
    "binary": "neither a .npy or .npz file nor CSV text",
    "unreadable": "unreadable",
}


def not_the_kind(path, kind: str, advice: str = "", where=None) -> str | None:
    """What is wrong with `path` when it is not a file of `kind` ('npy', 'npz', 'text'):
    "<where> is a text file (CSV?), not an .npz archive (np.savez's format): <advice>"
    (where: the path, unless given); None when it is one."""
    found = sniff_safe(path)
    if found == kind:
        return None
    where = path if where is None else where
    if found == "not_utf8":  # text all the same: what to do is to re-encode it
        text = f"{where} is {KIND_NAMES[found]}"
    elif found in ("empty", "binary", "unreadable"):
        text = f"{where} is {KIND_NAMES[found]}: expected {KIND_NAMES[kind]}"
    else:
        text = f"{where} is {KIND_NAMES[found]}, not {KIND_NAMES[kind]}"
    return text + (f": {advice}" if advice else "")


def read_json(path, expected: str):
    """The JSON document in the file at `path`; ValueError naming the file, what it is and
    what it should be (`expected`, e.g. "a sweep directory or its sweep.json") when it is
    not JSON text (an .npz, binary data) or not valid JSON. A missing file is open()'s
    FileNotFoundError (it names the file)."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path} is a directory: expected {expected}")
    found = sniff_safe(path) if path.exists() else "json"
    if found not in ("json", "text", "unreadable"):  # unreadable: open() names why
        what = {"binary": "binary data", "empty": "empty"}.get(found, KIND_NAMES[found])
        raise ValueError(f"{path} is {what}, not JSON: expected {expected}")
    try:
        return json.loads(path.read_bytes().decode("utf-8-sig"))
    except UnicodeDecodeError as exc:
        reason = f"byte {exc.start} is not UTF-8 text"
    except json.JSONDecodeError as exc:
        reason = f"{exc.msg} at line {exc.lineno}, column {exc.colno}"
    raise ValueError(f"{path} is not valid JSON ({reason}): expected {expected}")


def sniff_safe(path) -> str:
    """``sniff``, or 'unreadable' when the file cannot be opened at all."""
    try:
        return sniff(path)
    except OSError:
        return "unreadable"


class NpzArchive:
    """An .npz archive opened for checked reads (see the module docstring). where: how
    errors name the file ("checkpoint run.npz", "model file m.npz"). Use as a context
    manager; every failure is a ValueError (or `error`, a subclass such as the data sets'
    DataError) "<where> cannot be read: <what>" (damage) or "<where>: <what>" (a size or
    shape the caller refused). advice: what to do, added when the file is not an .npz."""

    def __init__(self, path, where: str, advice: str = "", error=ValueError):
        self.path, self.where, self.error = Path(path), where, error
        try:
            self._size = os.path.getsize(self.path)
            self._zip = zipfile.ZipFile(self.path)
        except FileNotFoundError:
            raise error(f"{where}: no such file") from None
        except IsADirectoryError:
            raise error(f"{where} is a directory, not an .npz file") from None
        except _DAMAGE as exc:
            wrong = not_the_kind(self.path, "npz", advice, where)
            if wrong is not None:
                raise error(wrong) from None
            raise self.damaged(exc) from None
        self.files = [n[:-4] for n in self._zip.namelist() if n.endswith(".npy")]

    def damaged(self, exc) -> ValueError:
        return self.error(f"{self.where} cannot be read: {type(exc).__name__}: {exc}")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        self._zip.close()

    def header(self, key: str) -> tuple[tuple[int, ...], np.dtype]:
        """(shape, dtype) of a member from its .npy header, reading none of its data."""
        info = self._info(key)
        try:
            with self._zip.open(info) as f:
                shape, _, dtype = read_npy_header(f)
        except _DAMAGE as exc:
            raise self.damaged(exc) from None
        return shape, dtype

    def array(self, key: str, *, max_bytes: int | None, shape=None, dtype=None) -> np.ndarray:
        """A member's array, read only after its headers were checked: its dtype (real,
        or `dtype`), its shape (`shape`, when given), its size (at most max_bytes, and
        exactly what the zip says the member holds). The data is then read into an
        array of that size and the member's CRC checked."""
        info = self._info(key)
        name = f"{self.where}[{key}]"
        try:
            with self._zip.open(info) as f:
                got_shape, fortran, got_dtype = read_npy_header(f)
                if got_dtype.hasobject:  # would need pickle, which is never used
                    raise ValueError(f"{name} holds Python objects ({got_dtype})")
                if (dtype is not None and got_dtype != np.dtype(dtype)) or (
                    shape is not None and tuple(got_shape) != tuple(shape)
                ):
                    raise _Refused(
                        f"{self.where}: {key} has dtype {got_dtype} and shape "
                        f"{tuple(got_shape)}, expected {np.dtype(dtype) if dtype else 'any'} "
                        f"and {tuple(shape) if shape is not None else 'any shape'}"
                    )
                nbytes = math.prod(got_shape) * got_dtype.itemsize
                if max_bytes is not None and nbytes > max_bytes:
                    raise _Refused(
                        f"{name} declares {math.prod(got_shape):,} values "
                        f"({size_text(nbytes)}), more than the {size_text(max_bytes)} "
                        f"it may hold"
                    )
                if f.tell() + nbytes != info.file_size:
                    raise ValueError(
                        f"its .npy header declares {nbytes:,} bytes of data but the "
                        f"member holds {info.file_size - f.tell():,}"
                    )
                out = np.empty(got_shape, dtype=got_dtype, order="F" if fortran else "C")
                view = memoryview(out.reshape(-1, order="A")).cast("B")
                for start in range(0, nbytes, _READ_BYTES):  # in chunks: no second copy
                    if f.readinto(view[start : start + _READ_BYTES]) != len(
                        view[start : start + _READ_BYTES]
                    ):
                        raise EOFError(f"{name} is shorter than its header says")
                if f.read(1):  # at its end, the CRC is checked
                    raise ValueError(f"{name} is longer than its header says")
        except _Refused as exc:
            raise self.error(str(exc)) from None
        except _DAMAGE as exc:
            raise self.damaged(exc) from None
        return out

    def _info(self, key: str) -> zipfile.ZipInfo:
        """The member's zip entry, its sizes checked against the file's: a member that says
        it holds more than the file's bytes allow is damage, or a zip bomb."""
        try:
            info = self._zip.getinfo(key + ".npy")
        except KeyError:
            raise self.error(f"{self.where}: no {key!r} array in the file") from None
        stored = info.compress_type == zipfile.ZIP_STORED
        if info.compress_size > self._size or (stored and info.compress_size != info.file_size):
            raise self.damaged(
                ValueError(
                    f"member {key} declares {info.file_size:,} bytes "
                    f"({info.compress_size:,} stored) in a file of {self._size:,}"
                )
            )
        return info


class _Refused(Exception):
    """A member's header read well but names a shape, dtype or size the caller refused."""
