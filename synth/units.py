"""Parsing and printing sizes. Sizes are bytes; 1KB = 1024 bytes (as nccl-tests prints them)."""

import re

from synth.errors import InputError

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MB": 1 << 20,
          "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30, "T": 1 << 40, "TB": 1 << 40}
MAX_SIZE_BYTES = 1 << 50      # 1 PB per rank: beyond any buffer, and still exact as a float
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*$")


def parse_size(text: str, option: str = "--size") -> int:
    """Parse ``"1MB"``, ``"64KB"``, ``"1048576"`` into bytes (binary multiples).

    >>> parse_size("1KB")
    1024
    """
    m = _SIZE_RE.match(str(text))
    unit = m.group(2).upper() if m else None
    if not m or unit not in _UNITS:
        raise InputError(option, "", f"cannot read size {text!r}; write e.g. 1MB, 64KB, 1GB or a number of bytes")
    value = float(m.group(1)) * _UNITS[unit]
    if value <= 0:
        raise InputError(option, "", f"size {text!r} must be positive")
    if round(value) < 1 or value > MAX_SIZE_BYTES:
        raise InputError(option, "", f"size {text!r} must be from 1 byte to {MAX_SIZE_BYTES >> 40}TB")
    return int(round(value))


def format_size(size_bytes: float) -> str:
    """Print bytes with the largest binary unit that keeps the number >= 1 (``1048576 -> '1MB'``)."""
    for unit, factor in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if size_bytes >= factor:
            value = size_bytes / factor
            return f"{value:g}{unit}"
    return f"{size_bytes:g}B"
