"""Whether a local folder can take an output now, asked before a run reads its data.

A run that cannot store its output must fail while it is still refunded (before
``data_read``), not after the read, when the failure rule charges it (issue #29 item 6).
``check`` is one ``statvfs`` (cheap enough for every POST); ``probe`` takes the bytes for
real and gives them back.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import cast

#: the room a run makes sure of before it reads its data (its result document and the
#: first blocks of a table), and the least free space a POST accepts a release with
PREFLIGHT_BYTES = 1 << 20


def check(folder: Path, need: int) -> None:
    """Raise the OSError a write under ``folder`` would meet now (ENOSPC: less than
    ``need`` bytes free; EROFS: mounted read-only; EACCES: not writable; ENOENT: not
    there)."""
    st = os.statvfs(folder)
    if st.f_flag & os.ST_RDONLY:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))
    if not os.access(folder, os.W_OK):
        raise OSError(errno.EACCES, os.strerror(errno.EACCES))
    if st.f_bavail * st.f_frsize < need:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def probe(path: Path, need: int) -> None:
    """Take ``need`` bytes in a file at ``path`` and remove it.

    The file system allocates the bytes in the call (``fallocate(2)``): a full store
    answers ENOSPC there and then, so no fsync is needed (the probe is removed: there is
    nothing to make durable). Where it cannot (``allocate`` False), the bytes are written,
    and only an fsync makes a file system that reports a full disk at write-back (NFS,
    some FUSE mounts) say so before the read."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        if not allocate(fd, need):
            block = bytes(1 << 16)
            for _ in range(need // len(block)):
                write_all(fd, block)
            os.fsync(fd)
    finally:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _fallocate() -> Callable[[int, int, int, int], int] | None:
    """The C library's ``fallocate(2)`` (Linux), or None where there is none."""
    try:
        call = ctypes.CDLL(None, use_errno=True).fallocate
    except (AttributeError, OSError):
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    call.restype = ctypes.c_int
    return cast(Callable[[int, int, int, int], int], call)


_FALLOCATE = _fallocate()


def allocate(fd: int, size: int) -> bool:
    """Have the file system allocate ``size`` bytes of ``fd`` now (``fallocate(2)``, mode
    0): True once it did (an error such as ENOSPC or EROFS raised as OSError), False if it
    cannot (no such call, or a file system without it). Not ``os.posix_fallocate``: the C
    library may emulate that by writing, whose errors a file system may report only at
    write-back."""
    if _FALLOCATE is None:
        return False
    if _FALLOCATE(fd, 0, 0, size) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS):
        return False
    raise OSError(err, os.strerror(err))


def write_all(fd: int, data: bytes) -> None:
    """``os.write`` until every byte is written (a write may take fewer)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


