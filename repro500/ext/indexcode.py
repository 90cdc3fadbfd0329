"""Elias-Fano coding of the ascending positions a sparse payload sends (top-k's indices).

k distinct positions ``0 <= p_0 < ... < p_{k-1} < n`` are split at ``L = floor(log2(n/k))``
bits: the low L bits of each position are stored as they are, k fields of L bits; the high
part ``h_i = p_i >> L`` is stored in unary, as the bit ``h_i + i`` of a bit array of
``U = ((n-1) >> L) + k`` bits.  The coded size,

    nbytes(n, k) = ceil(k·L / 8) + ceil(U / 8)       (about k·(2 + log2(n/k)) bits)

depends on (n, k) only, never on which positions were chosen: every rank of an allgather
sends the same number of bytes, and the wire model (repro500.scaling.wire) is exact.  For
top-k 1% that is L = 6 and 8.6 bits per position instead of int32's 32, within 0.5 bit of
the log2(C(n, k)) / k that any code of a k-subset needs.

Layout (little-endian bit order throughout, as ``sign_pack``): the low section is
``ceil(k·L/8)`` bytes, field i in stream bits ``[i·L, (i+1)·L)``, least significant bit first;
bit b of the stream is bit ``b % 8`` of byte ``b // 8``.  The high section follows, starting
at a byte boundary, its bit j likewise.  Padding bits are 0.

Everything is whole-tensor torch arithmetic (no Python loop over positions), on the
positions' device, and works on "meta" tensors (shapes only) for the wire model.
Positions must fit int32, the indices the top-k operator returns: n up to 2^31 - 1.
"""

from __future__ import annotations

import torch

MAX_N = 2**31 - 1  # positions are int32 top-k indices
_WORD_BITS = 32  # streams are assembled in 32-bit words held in int64 (shifts never overflow)


def low_bits(n: int, k: int) -> int:
    """L = floor(log2(n / k)) for 1 <= k <= n (0 when k > n/2)."""
    return (n // k).bit_length() - 1


def _check(n: int, k: int) -> None:
    if not 0 <= n <= MAX_N:
        raise ValueError(f"positions are coded for n <= 2^31 - 1 (int32 indices), got n = {n}")
    if not 0 <= k <= n:
        raise ValueError(f"k must be in [0, {n}], got {k}")


def _sections(n: int, k: int) -> tuple[int, int, int]:
    """(L, bytes of the low section, bits of the high section) for k of n positions."""
    if k == 0:
        return 0, 0, 0
    low = low_bits(n, k)
    return low, -(-k * low // 8), ((n - 1) >> low) + k


def nbytes(n: int, k: int) -> int:
    """Bytes that :func:`encode` produces for k positions out of n (a function of n, k only)."""
    _check(n, k)
    _, low_bytes, high_bits = _sections(n, k)
    return low_bytes + -(-high_bits // 8)


def bits_per_element(ratio: float) -> float:
    """Nominal index bits per element of the whole tensor when k = ratio·n (n large)."""
    low = int(1.0 / ratio).bit_length() - 1  # as low_bits(n, ratio·n)
    return ratio * (low + 1) + 2.0**-low


def _put_fields(words: torch.Tensor, start: torch.Tensor, values: torch.Tensor, width: int) -> None:
    """OR each value (< 2^width, width <= 31) into the word stream at bit offset *start*.

    A field spans at most two 32-bit words; the fields never overlap, so adding them is
    OR-ing them, and index_add_ does it for all fields at once.
    """
    word, shift = start // _WORD_BITS, start % _WORD_BITS
    shifted = values << shift  # < 2^62: no overflow in int64
    words.index_add_(0, word, shifted & 0xFFFFFFFF)
    if width > 1:  # a one-bit field never crosses a word boundary
        words.index_add_(0, word + 1, shifted >> _WORD_BITS)


def _to_bytes(words: torch.Tensor, count: int) -> torch.Tensor:
    """The first *count* bytes of 32-bit words (int64 in [0, 2^32)), little-endian."""
    shifts = torch.arange(0, _WORD_BITS, 8, device=words.device)
    return ((words.unsqueeze(1) >> shifts) & 0xFF).reshape(-1)[:count].to(torch.uint8)


def _to_words(data: torch.Tensor) -> torch.Tensor:
    """Bytes as 32-bit little-endian words (int64), zero-padded, plus one zero word."""
    pad = -data.numel() % 4 + 4
    padded = torch.cat([data, data.new_zeros(pad)]).to(torch.int64).view(-1, 4)
    shifts = torch.arange(0, _WORD_BITS, 8, device=data.device)
    return (padded << shifts).sum(dim=1)


def encode(positions: torch.Tensor, n: int) -> torch.Tensor:
    """The uint8 code of *positions* (1-D, ascending, distinct, in [0, n)); see the module doc.

    The positions are not checked (that would read them back from an accelerator); positions
    that are not ascending and distinct give a code that decodes to something else.
    """
    k = positions.numel()
    _check(n, k)
    low, low_bytes, high_bits = _sections(n, k)
    device = positions.device
    total = low_bytes + -(-high_bits // 8)
    # Two spare words: a field's spill into the next word never runs off the end.
    words = torch.zeros(-(-total // 4) + 2, dtype=torch.int64, device=device)
    if k == 0:
        return words[:0].to(torch.uint8)
    p = positions.reshape(-1).to(torch.int64)
    rank = torch.arange(k, dtype=torch.int64, device=device)
    if low:
        _put_fields(words, rank * low, p & ((1 << low) - 1), low)
    high_start = 8 * low_bytes
    _put_fields(words, high_start + (p >> low) + rank, torch.ones_like(p), 1)
    return _to_bytes(words, total)


def decode(code: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """The k ascending positions (int64) that :func:`encode` coded into *code* for this n."""
    _check(n, k)
    low, low_bytes, high_bits = _sections(n, k)
    if code.numel() != nbytes(n, k):
        raise ValueError(
            f"a code of {k} positions out of {n} has {nbytes(n, k)} bytes, got {code.numel()}"
        )
    device = code.device
    if k == 0:
        return torch.zeros(0, dtype=torch.int64, device=device)
    rank = torch.arange(k, dtype=torch.int64, device=device)
    # High parts: the set bits of the high section, in order; bit h_i + i is the i-th one.
    shifts = torch.arange(8, dtype=torch.uint8, device=device)
    bits = ((code[low_bytes:].unsqueeze(1) >> shifts) & 1).reshape(-1)[:high_bits].bool()
    high = torch.nonzero_static(bits, size=k).reshape(-1) - rank
    if not low:
        return high
    words = _to_words(code[:low_bytes])
    start = rank * low
    word, shift = start // _WORD_BITS, start % _WORD_BITS
    # Two adjacent words as one 63-bit number (the upper one cut to 31 bits: a field ends
    # at most 31 + 31 bits in), then the field's bits.
    pair = words[word] | ((words[word + 1] & 0x7FFFFFFF) << _WORD_BITS)
    return (high << low) | ((pair >> shift) & ((1 << low) - 1))
