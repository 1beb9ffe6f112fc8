"""What a one-line report says of an exception."""

from __future__ import annotations


def first_line(err: BaseException) -> str:
    """The first line of the message, or the exception's type when it has none."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
