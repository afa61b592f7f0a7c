"""Every file autopar writes goes through here: readers see the old file or the whole new one, never a part.

`write_text_atomically(path, text)`: the text goes to a temporary file in the target's own directory (same file
system, so the rename is atomic), is flushed and fsync'ed, gets the permissions a plain `open(path, "w")` would give
(0666 minus the umask), and is renamed over the target with `os.replace` (POSIX rename(2): atomic). Then the
directory is fsync'ed so the rename itself survives a crash. Killed at any point (Ctrl-C, SIGKILL, power loss), the
target is absent, the old content, or the complete new content; at worst a `.NAME.*.tmp` file is left beside it.

`check_writable(path)` is the same path's checks, done before any work: the directory exists and a file can be
created in it (a real probe: os.access says yes to root on read-only or special file systems), the target is not a
directory or a special file.

Used by: reports (`--out`, autopar.report), hardware profiles (`autopar calibrate`, `autopar profile fit`,
autopar.calibrate.profile_file), benchmarks that write profiles.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

from costmodels.errors import InputError


def write_text_atomically(path: "str | os.PathLike[str]", text: str, *, field: str = "out") -> Path:
    """Write `text` (UTF-8, no newline translation) to `path` atomically; an OS error is an `InputError` naming
    `field` and the path. Returns the path written."""
    target = Path(path)
    directory = _directory_of(target)
    try:
        _write_and_rename(target, directory, text.encode("utf-8"))
    except OSError as exc:
        raise InputError(field, f"cannot write {_short(target)} ({_reason(exc)}); choose another path") from None
    with contextlib.suppress(OSError):  # make the rename durable (not every file system can fsync a directory)
        descriptor = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
    return target


def check_writable(path: "str | os.PathLike[str]", *, field: str = "out") -> Path:
    """Raise `InputError` now if `write_text_atomically(path, ...)` could not work: missing directory, a directory
    or special file at the target, a directory where no file can be created, a name too long."""
    target = Path(path)
    directory = _directory_of(target)
    try:
        if target.is_dir():
            raise InputError(field, f"{_short(target)} is a directory; give a file name with an extension")
        if target.exists() and not stat.S_ISREG(target.stat().st_mode):
            raise InputError(field, f"{_short(target)} is not a regular file (a device, FIFO or socket); give a "
                                    "file path")
        if not directory.is_dir():
            raise InputError(field, f"directory {str(directory)!r} of {_short(target)} does not exist; create it "
                                    "first")
        if len(target.name.encode("utf-8", "surrogateescape")) > _name_max(directory):
            raise InputError(field, f"file name of {_short(target)} is too long for its file system; choose a "
                                    "shorter name")
        descriptor, probe = tempfile.mkstemp(dir=directory, prefix=".autopar-probe.", suffix=".tmp")
        os.close(descriptor)
        os.unlink(probe)
    except OSError as exc:
        raise InputError(field, f"cannot write {_short(target)} ({_reason(exc)}); choose another path") from None
    return target


def _write_and_rename(target: Path, directory: Path, data: bytes) -> None:
    descriptor, temporary = tempfile.mkstemp(dir=directory, prefix=f".{target.name[:100]}.", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)
        os.replace(temporary, target)
    except BaseException:  # KeyboardInterrupt included: never leave the temporary behind when we can help it
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def _directory_of(target: Path) -> Path:
    return target.parent if str(target.parent) else Path(".")


def _name_max(directory: Path) -> int:
    try:
        return os.pathconf(directory, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def _reason(exc: OSError) -> str:
    return exc.strerror or exc.__class__.__name__


def _short(target: Path) -> str:
    text = str(target)
    return repr(text if len(text) <= 80 else text[:60] + "…" + text[-15:])
