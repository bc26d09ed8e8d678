"""1-bit SGD (Seide et al. 2014): send the sign of each gradient entry plus two scales, keep the error locally.

Quantising to one bit throws information away; error feedback adds what was lost last time to the next gradient
before quantising, so nothing is lost for good: after any number of steps, everything sent plus the residual
still held equals the sum of the true gradients. With error feedback off the loss is permanent, and bias builds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Bytes of a message besides the packed bits: two float32 scales and the int64 length.
HEADER_BYTES = 4 + 4 + 8


@dataclass(frozen=True)
class OneBitMessage:
    """One compressed gradient: packed sign bits and the values that decode a 1 and a 0."""

    bits: np.ndarray  # uint8, np.packbits of (value >= 0)
    pos: float  # mean of the entries quantised to 1 (what a 1 decodes to)
    neg: float  # mean of the entries quantised to 0 (what a 0 decodes to)
    n: int

    @property
    def nbytes(self) -> int:
        """Bytes this message puts on the wire."""
        return int(self.bits.nbytes) + HEADER_BYTES

    def decode(self) -> np.ndarray:
        """The float32 vector the receiver reconstructs."""
        ones = np.unpackbits(self.bits, count=self.n).astype(bool)
        return np.where(ones, np.float32(self.pos), np.float32(self.neg)).astype(np.float32)


def quantize(v: np.ndarray) -> OneBitMessage:
    """Sign-quantise v: entries >= 0 become 1, others 0; each group decodes to its own mean (least squares)."""
    v = np.asarray(v, dtype=np.float32).ravel()
    ones = v >= 0
    n_pos = int(ones.sum())
    pos = float(v[ones].mean(dtype=np.float64)) if n_pos else 0.0
    neg = float(v[~ones].mean(dtype=np.float64)) if n_pos < v.size else 0.0
    return OneBitMessage(np.packbits(ones), pos, neg, int(v.size))


class OneBitCompressor:
    """A worker's sender side: quantise gradient + residual, keep the new residual (if error feedback is on)."""

    def __init__(self, n: int, error_feedback: bool = True) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be a positive integer (the gradient length), got {n!r}")
        self.n = n
        self.error_feedback = bool(error_feedback)
        self.residual = np.zeros(n, dtype=np.float64)  # float64 so the bookkeeping itself loses nothing

    def encode(self, grad: np.ndarray) -> OneBitMessage:
        """Compress one gradient; with error feedback, what the message misses is carried to the next call."""
        grad = np.asarray(grad, dtype=np.float32).ravel()
        if grad.size != self.n:
            raise ValueError(f"gradient has {grad.size} entries, the compressor was built for {self.n}")
        target = grad.astype(np.float64) + (self.residual if self.error_feedback else 0.0)
        msg = quantize(target.astype(np.float32))
        if self.error_feedback:
            self.residual = target - msg.decode().astype(np.float64)
        return msg


def raw_nbytes(n: int) -> int:
    """Bytes of the same gradient sent uncompressed as float32."""
    return 4 * n
