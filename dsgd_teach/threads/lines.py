"""Reading newline-terminated messages from a raw pipe with a timeout (the zygote protocol's transport)."""

from __future__ import annotations

import os
import select
import time


class LineReader:
    """Reads newline-terminated lines from a raw pipe fd without blocking past a timeout."""

    def __init__(self, fd: int) -> None:
        self.fd, self.buf, self.eof = fd, b"", False

    def read_line(self, timeout_s: float) -> str | None:
        """The next line, or None if none arrived within timeout_s (or the pipe is closed: see .eof)."""
        end = time.monotonic() + timeout_s
        while b"\n" not in self.buf and not self.eof:
            left = end - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self.fd], [], [], left)
            if ready:
                chunk = os.read(self.fd, 1 << 16)
                self.eof = not chunk
                self.buf += chunk
        if b"\n" not in self.buf:
            return None
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode()
