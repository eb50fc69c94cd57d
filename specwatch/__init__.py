"""specwatch, a sidecar watching vLLM speculative decoding (``__version__``); may import nothing.

``__version__`` is a constant, equal to ``pyproject.toml``'s ``[project] version`` (a test keeps
them equal): reading it from the installed distribution with ``importlib.metadata`` costs tens
of milliseconds, which ``specwatch --help`` and importing a pure module should not pay.
"""

__all__ = ["__version__"]

__version__ = "0.1.0"
