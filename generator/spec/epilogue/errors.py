"""EpilogueError, what every refused epilogue raises, and its subclass _Refusal, raised by a traced function's
refused step (``trace`` adds the function's name and line)."""
from __future__ import annotations


class EpilogueError(ValueError):
    """An epilogue that cannot be described or generated; the message says why and how to fix it."""


class _Refusal(EpilogueError):
    """Raised while a traced function runs; ``trace`` prefixes the function's name and line."""
