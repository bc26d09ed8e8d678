"""The audit hook's denial channel as the grading worker reads it: whole, from the end of the kernel's start-up on."""

from __future__ import annotations

import fcntl
import os
import select
import struct
import termios
import threading

from .sandbox import FLAG

MAX_DENIALS = 50


class Denials:
    """The kernel's denial channel (a pipe only the audit hook writes to), read whole in a thread of this process.

    A flood on the kernel's stdout or stderr cannot push a denial out of it; the student's code can only add to it.
    Only what arrives after `mark` (the kernel's own start-up is done) counts. The channel reaching end-of-file
    while the kernel still answers means the kernel closed it: that is a flag too.
    """

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        self.lines: list[tuple[int, str]] = []  # (offset of the line's end, text)
        self.consumed, self.start = 0, -1
        self.lock = threading.Lock()
        self.eof = threading.Event()
        self.thread = threading.Thread(target=self._drain, daemon=True)
        self.thread.start()

    def _drain(self) -> None:
        """Read the channel to its end; reads hold the lock, so `mark` sees a consistent offset."""
        pending = b""
        while True:
            select.select([self.read_fd], [], [], 0.2)
            with self.lock:
                try:
                    block = os.read(self.read_fd, 1 << 16) if _ready(self.read_fd) else None
                except OSError:
                    block = b""
                if block is None:
                    continue
                self.consumed += len(block)
            if not block:
                break
            pending = (pending + block)[-4096:]
            *done, pending = pending.split(b"\n")
            for line in done:
                if len(self.lines) < 4 * MAX_DENIALS:
                    self.lines.append((self.consumed, line.decode(errors="replace")))
        if pending:
            self.lines.append((self.consumed, pending.decode(errors="replace")))
        with self.lock:
            os.close(self.read_fd)
            self.read_fd = -1
        self.eof.set()

    def mark(self) -> None:
        """From here on every denial is the student's: the offset is what was read plus what waits in the pipe."""
        with self.lock:
            if self.read_fd < 0:  # the kernel is gone already: nothing more can arrive
                self.start = self.consumed
                return
            waiting = struct.unpack("i", fcntl.ioctl(self.read_fd, termios.FIONREAD, b"\0" * 4))[0]
            self.start = self.consumed + waiting

    def close_writer(self) -> None:
        """Drop this process's copy of the write end (once the kernel holds its own)."""
        if self.write_fd >= 0:
            os.close(self.write_fd)
            self.write_fd = -1

    def flags(self) -> list[str]:
        """What the hook denied after the mark (a line not in the hook's format counts too, kept whole)."""
        self.close_writer()
        self.thread.join(timeout=10)
        if self.start < 0:
            return []
        return [ln[len(FLAG) + 1:] if ln.startswith(FLAG + " ") else f"wrote to the denial channel: {ln[:200]}"
                for end, ln in self.lines if end > self.start][:MAX_DENIALS]


def _ready(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])
