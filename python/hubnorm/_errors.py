"""The exceptions hubnorm raises: the same facts as the command-line tool's messages."""

from __future__ import annotations


class HubnormError(Exception):
    """Any failure of a hubnorm job (the base of the others)."""


class InputError(HubnormError, ValueError):
    """The data is wrong: a bad value, a missing column, a ragged embedding.

    ``file`` names the input file (or URL), ``row`` the 0-based row within it
    and ``column`` the column, where known (``None`` otherwise).
    """

    def __init__(self, message: str, file: str | None = None, row: int | None = None,
                 column: str | None = None):
        super().__init__(message)
        self.file = file
        self.row = row
        self.column = column


class UsageError(HubnormError, ValueError):
    """The arguments are wrong or disagree with each other or with the
    inputs: an unknown method, a parameter out of its domain or of the wrong
    type, ``k`` above the gallery, an output that exists without
    ``overwrite=True``. (Inputs whose embeddings differ in dimension raise
    :class:`InputError`, naming the table.)"""


class MemoryLimitError(HubnormError, MemoryError):
    """The job cannot run within ``memory_limit``: raise it."""
