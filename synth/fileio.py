"""File plumbing shared by the loaders and writers.

Every JSON input goes through :func:`read_json` (one set of limits and one error style for all formats), and
every command's outputs through :class:`OutputPlan`: paths are checked before any work starts, and all outputs
of a run are committed together at the end (temporary files, then renames), or none. Output files are written
atomically: a failed run never leaves a half-written file.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path


from synth.errors import InputError

MAX_JSON_BYTES = 16 << 20     # the largest JSON input we read (a 1024-rank topology is about 2 MB)
MAX_JSON_DEPTH = 64           # deeper nesting is never a synth document (and would exhaust recursion)


def read_json(path: str | Path, kind: str = "JSON", max_bytes: int = MAX_JSON_BYTES):
    """Read a JSON document from a file, refusing what no synth format holds; errors name the file.

    Refused with an :class:`~synth.errors.InputError`: a path that is not a regular file, more than
    ``max_bytes``, text that is not UTF-8, nesting deeper than :data:`MAX_JSON_DEPTH`, duplicate keys in an
    object, ``NaN``/``Infinity``, and invalid JSON (with the line).
    """
    source = str(path)
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):   # before open(): opening a FIFO would block
            raise InputError(source, "", f"is not a regular file; give a {kind} file")
        with open(path, "rb") as fh:
            data = fh.read(max_bytes + 1)
    except OSError as exc:
        raise InputError(source, "", f"cannot read file ({exc.strerror})") from None
    if len(data) > max_bytes:
        raise InputError(source, "", f"is larger than {max_bytes} bytes, more than any {kind} file holds")
    return parse_json(data, source, kind)


def parse_json(data: bytes | str, source: str, kind: str = "JSON"):
    """Parse JSON text or bytes with :func:`read_json`'s rules (no size check).

    >>> parse_json(b'{"a": 1}', "x.json")
    {'a': 1}
    >>> parse_json(b'{"a": 1, "a": 2}', "x.json")
    Traceback (most recent call last):
    ...
    synth.errors.InputError: x.json: a: duplicate key
    """
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(source, f"byte {exc.start}", f"is not UTF-8 text; save the {kind} file as UTF-8") from None
    depth = _max_depth(data)
    if depth > MAX_JSON_DEPTH:
        raise InputError(source, "", f"nests {depth} levels deep; a {kind} file never nests more than "
                         f"{MAX_JSON_DEPTH}")
    try:
        return json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise InputError(source, f"line {exc.lineno}", f"invalid JSON: {exc.msg}") from None
    except _JsonRefusal as exc:
        raise InputError(source, exc.field, exc.problem) from None


class _JsonRefusal(Exception):
    def __init__(self, field: str, problem: str):
        super().__init__(problem)
        self.field, self.problem = field, problem


def _unique_keys(pairs):
    out = {}
    for key, value in pairs:
        if key in out:
            raise _JsonRefusal(key, "duplicate key")
        out[key] = value
    return out


def _no_constant(name: str):
    raise _JsonRefusal("", f"{name} is not a number JSON allows; give a finite value")


def _max_depth(data: bytes) -> int:
    """Deepest ``[``/``{`` nesting outside string literals, vectorised (inputs may be megabytes).

    >>> _max_depth(b'{"a": [[1], "]]]["], "b\\\\": {}}')
    3
    """
    import numpy as np  # lazily: commands import this module before deciding to do any work

    code = np.frombuffer(data, dtype=np.uint8)
    index = np.arange(len(code))
    backslash = code == ord("\\")
    last_plain = np.maximum.accumulate(np.where(backslash, -1, index))   # last non-backslash at or before i
    before = np.concatenate(([-1], last_plain[:-1]))
    escaped = ((index - 1 - before) % 2) == 1                          # odd run of backslashes before i
    quote = (code == ord('"')) & ~escaped
    inside = (np.cumsum(quote) - quote) % 2 == 1                       # strictly inside a string literal
    opens = ((code == ord("[")) | (code == ord("{"))) & ~inside
    closes = ((code == ord("]")) | (code == ord("}"))) & ~inside
    return int(np.cumsum(opens.astype(np.int64) - closes).max(initial=0))


def write_atomic(path: str | Path, text: str | bytes) -> None:
    """Write ``text`` (or bytes) to ``path`` through a temporary file in the same directory and a rename."""
    os.replace(_write_temp(Path(path), text), path)


class OutputPlan:
    """Every output file of one command: checked before any work, written together at the end, or not at all.

    ``declare(option, path)`` checks a path the moment the command starts (a regular file or a new name in an
    existing writable directory; no trailing slash; no two options naming one file), ``stage`` keeps the text,
    and ``commit`` writes every staged file to a temporary file beside its target and only then renames them
    all. A run that fails or is interrupted before ``commit`` leaves nothing; devices, FIFOs and directories are
    never replaced.

    >>> import tempfile, os
    >>> d = tempfile.mkdtemp()
    >>> plan = OutputPlan()
    >>> plan.declare("-o", os.path.join(d, "a.xml"))
    >>> plan.stage("-o", "<algo/>")
    >>> [os.path.basename(p) for p in plan.commit()]
    ['a.xml']
    """

    def __init__(self):
        self._paths: dict[str, Path] = {}
        self._texts: dict[str, str | bytes] = {}

    def declare(self, option: str, path: str | Path | None) -> None:
        """Check ``path`` (given with ``option``) as an output; None means the option was not given."""
        if path is None:
            return
        text = str(path)
        if not text.strip():
            raise InputError(option, "", "the output path is empty; give a file name")
        if text.endswith(("/", os.sep)):
            raise InputError(option, text, "names a directory; give a file name inside it")
        _check_usable(option, text)
        target = Path(text)
        if target.exists() or target.is_symlink():
            info = os.stat(target) if target.exists() else None
            if info is None or not stat.S_ISREG(info.st_mode):
                raise InputError(option, text, "exists and is not a regular file; refusing to replace it")
            if not os.access(target, os.W_OK):
                raise InputError(option, text, "is not writable")
        parent = target.parent
        if not parent.is_dir():
            raise InputError(option, text, f"directory {str(parent)!r} does not exist (or is not a directory)")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise InputError(option, text, f"directory {str(parent)!r} is not writable")
        resolved = target.resolve()
        for other, known in self._paths.items():
            if known.resolve() == resolved:
                raise InputError(option, text, f"is also given to {other}; give each output its own file")
        self._paths[option] = target

    def stage(self, option: str, text: str | bytes) -> None:
        """Keep the content for the path declared with ``option`` (written at :meth:`commit`)."""
        if option not in self._paths:
            raise KeyError(f"{option} was not declared")
        self._texts[option] = text

    def path(self, option: str) -> Path | None:
        return self._paths.get(option)

    def commit(self) -> list[Path]:
        """Write every staged output: all temporary files first, then the renames. Returns the paths written."""
        temps: list[tuple[str, Path]] = []
        try:
            for option, text in self._texts.items():
                temps.append((_write_temp(self._paths[option], text), self._paths[option]))
            for tmp, target in temps:
                os.replace(tmp, target)
        except BaseException:
            for tmp, _ in temps:
                if os.path.exists(tmp):
                    os.unlink(tmp)
            raise
        return [target for _, target in temps]


def _check_usable(option: str, text: str) -> None:
    """Refuse a path the system cannot even look up (a name over NAME_MAX, a loop of links), in one line."""
    try:
        os.lstat(text)
    except (FileNotFoundError, NotADirectoryError):
        pass
    except OSError as exc:
        raise InputError(option, text[:80] + ("..." if len(text) > 80 else ""),
                         f"cannot be used as a path ({exc.strerror})") from None


def _write_temp(path: Path, text: str | bytes) -> str:
    """Write ``text`` to a new temporary file beside ``path`` with the mode a plain open() gives; return it."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes 0600; give the file the mode open() would
        with os.fdopen(fd, "wb" if isinstance(text, bytes) else "w") as fh:
            fh.write(text)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return tmp


def document_name(raw, source: str, expected_format: str, kind: str) -> str:
    """Check the header every synth JSON document shares (an object, its ``format``); return its ``name``
    (the file's stem when absent). Raises InputError naming ``source`` and the field."""
    if not isinstance(raw, dict):
        raise InputError(source, "", f"a {kind} file must hold a JSON object")
    fmt = raw.get("format", expected_format)
    if fmt != expected_format:
        raise InputError(source, "format", f"unknown format {fmt!r}; expected {expected_format!r}")
    name = raw.get("name", Path(source).stem)
    if not isinstance(name, str) or not name:
        raise InputError(source, "name", "must be a non-empty string")
    return name
