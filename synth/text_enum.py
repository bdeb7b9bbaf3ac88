"""A string-valued enum base shared by every enum that reaches reports and JSON (statuses, methods, kinds)."""

from __future__ import annotations

from enum import Enum


class TextEnum(str, Enum):
    """A ``str`` enum whose ``str()`` and f-string form are the value, so reports print ``optimal``, not
    ``Status.OPTIMAL``, and comparisons with plain strings keep working.

    >>> class Colour(TextEnum):
    ...     RED = "red"
    >>> f"{Colour.RED}", str(Colour.RED), Colour.RED == "red"
    ('red', 'red', True)
    """

    def __str__(self) -> str:
        return self.value

    __format__ = str.__format__
