"""File plumbing shared by the loaders and writers.

Output files are written atomically: a failed run never leaves a half-written file.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(path: str | Path, text: str | bytes) -> None:
    """Write ``text`` (or bytes) to ``path`` through a temporary file in the same directory and a rename."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes 0600; give the file the mode open() would
        with os.fdopen(fd, "wb" if isinstance(text, bytes) else "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def document_name(raw, source: str, expected_format: str, kind: str) -> str:
    """Check the header every synth JSON document shares (an object, its ``format``); return its ``name``
    (the file's stem when absent). Raises InputError naming ``source`` and the field."""
    from synth.errors import InputError

    if not isinstance(raw, dict):
        raise InputError(source, "", f"a {kind} file must hold a JSON object")
    fmt = raw.get("format", expected_format)
    if fmt != expected_format:
        raise InputError(source, "format", f"unknown format {fmt!r}; expected {expected_format!r}")
    name = raw.get("name", Path(source).stem)
    if not isinstance(name, str) or not name:
        raise InputError(source, "name", "must be a non-empty string")
    return name
