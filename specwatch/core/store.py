"""A holder of one immutable value: readers ``get`` it, one writer ``swap``s it and listeners hear.

:class:`Store` is generic and knows no domain type; the server keeps the published
:class:`specwatch.export.snapshot.Snapshot` in one. Nothing here blocks or does I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["Store"]

T = TypeVar("T")


class Store(Generic[T]):
    """Holds one immutable value of type ``T``; :meth:`swap` replaces it and notifies.

    ``get`` is safe from collectors and routes (no I/O, no lock: the value never changes in
    place, only the reference does). Listeners run synchronously on the caller's thread (the
    event loop) after each swap, in the order they subscribed; an exception from one
    propagates to the caller of :meth:`swap`, and the value is already replaced.
    """

    def __init__(self, initial: T) -> None:
        self._value = initial
        self._listeners: list[Callable[[T], None]] = []

    def get(self) -> T:
        """The current value."""
        return self._value

    def swap(self, value: T) -> None:
        """Replace the value with ``value`` and call every listener with it."""
        self._value = value
        for listener in self._listeners:
            listener(value)

    def update(self, change: Callable[[T], T]) -> T:
        """Swap in ``change(current)`` and return it (one read-modify-write, no await inside)."""
        value = change(self._value)
        self.swap(value)
        return value

    def subscribe(self, listener: Callable[[T], None]) -> None:
        """Call ``listener(value)`` after every later :meth:`swap` (must not block)."""
        self._listeners.append(listener)
