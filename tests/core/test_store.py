"""core.store.Store: one immutable value, swapped by reference, listeners told in order."""

from __future__ import annotations

import pytest

from specwatch.core.store import Store


class TestStore:
    def test_get_returns_the_initial_value(self) -> None:
        """Before any swap, ``get`` is the value the store was built with."""
        store: Store[tuple[int, ...]] = Store((1, 2))
        assert store.get() == (1, 2)

    def test_swap_replaces_and_notifies_in_subscription_order(self) -> None:
        """Each swap reaches every listener, first subscriber first, after the value changed."""
        store: Store[int] = Store(0)
        heard: list[tuple[str, int, int]] = []
        store.subscribe(lambda v: heard.append(("a", v, store.get())))
        store.subscribe(lambda v: heard.append(("b", v, store.get())))
        store.swap(5)
        store.swap(7)
        assert heard == [("a", 5, 5), ("b", 5, 5), ("a", 7, 7), ("b", 7, 7)]

    def test_update_applies_the_change_to_the_current_value(self) -> None:
        """``update(f)`` swaps in ``f(current)`` and returns it: 3 → 3·2+1 = 7."""
        store: Store[int] = Store(3)
        assert store.update(lambda v: v * 2 + 1) == 7
        assert store.get() == 7

    def test_listener_error_propagates_after_the_swap(self) -> None:
        """A failing listener raises to the caller of swap; the new value is already in."""
        store: Store[int] = Store(0)

        def boom(v: int) -> None:
            raise RuntimeError(f"listener saw {v}")

        store.subscribe(boom)
        with pytest.raises(RuntimeError, match="listener saw 4"):
            store.swap(4)
        assert store.get() == 4
