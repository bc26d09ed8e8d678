"""Write the grader's outputs and list submissions without following links or opening FIFOs, sockets or devices.

Every output file is written to a fresh temporary file in its own folder (O_EXCL | O_NOFOLLOW) and renamed over the
target, so a reader sees the old file or the new one, never half of one. A target that exists and is not a regular
file (a FIFO, socket, device, symlink or folder planted where an output goes) is refused, and so is any folder on the
way that is a symlink. Listing uses lstat only, so nothing is opened and nothing blocks.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path


class UnsafeOutput(RuntimeError):
    """An output path is occupied by something that is not a regular file, or passes through a symlink."""


def kind(mode: int) -> str:
    """A word for a file type (from st_mode)."""
    for test, word in ((stat.S_ISREG, "regular file"), (stat.S_ISDIR, "folder"), (stat.S_ISLNK, "symlink"),
                       (stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device")):
        if test(mode):
            return word
    return "special file"


def open_dir(root: Path, parts: tuple[str, ...] = (), create: bool = True) -> int:
    """An O_DIRECTORY fd for root/parts..., each part opened with O_NOFOLLOW (and made when missing)."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
    fd = os.open(root, flags)
    try:
        for part in parts:
            if part in ("", ".", "..") or "/" in part:
                raise UnsafeOutput(f"refusing the path component {part!r} under {root}")
            if create:
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
            try:
                nxt = os.open(part, flags | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                st = os.stat(part, dir_fd=fd, follow_symlinks=False)
                raise UnsafeOutput(f"refusing to write under {root.joinpath(*parts)}: {part} is a "
                                   f"{kind(st.st_mode)}, not a folder") from exc
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_target(dir_fd: int, name: str, shown: Path) -> None:
    """Raise UnsafeOutput if name exists in dir_fd and is not a regular file (lstat: links are not followed)."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeOutput(f"refusing to write {shown}: it is a {kind(st.st_mode)}, not a regular file; remove it")


def write_atomic(root: Path, relative: str, data: bytes) -> None:
    """Write root/relative atomically: temp file (O_EXCL|O_NOFOLLOW) in the same folder, fsync, rename over it."""
    *parts, name = Path(relative).parts
    dir_fd = open_dir(root, tuple(parts))
    try:
        shown = root.joinpath(relative)
        check_target(dir_fd, name, shown)
        tmp = f".{name}.{secrets.token_hex(6)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dir_fd)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            check_target(dir_fd, name, shown)
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=dir_fd)
            except FileNotFoundError:
                pass
            raise
    finally:
        os.close(dir_fd)


def preflight(root: Path, relatives: list[str]) -> None:
    """Refuse, before any grading starts, output paths already occupied by non-regular files or symlinked folders."""
    for relative in relatives:
        *parts, name = Path(relative).parts
        try:
            dir_fd = open_dir(root, tuple(parts), create=False)
        except FileNotFoundError:
            continue
        try:
            check_target(dir_fd, name, root.joinpath(relative))
        finally:
            os.close(dir_fd)


def lstat_kind(path: Path) -> str:
    """'regular file', 'folder', or what else path is, without following a symlink or opening it."""
    return kind(os.lstat(path).st_mode)


def read_regular(path: Path, limit: int = 64 * 1024 * 1024) -> bytes:
    """Read a regular file without following a final symlink and without blocking on a FIFO swapped in late."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeOutput(f"{path} is a {kind(st.st_mode)}, not a regular file")
        if st.st_size > limit:
            raise ValueError(f"{path} is larger than {limit // 2**20} MB")
        return fh.read(limit + 1)
