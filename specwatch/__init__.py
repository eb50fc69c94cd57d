"""specwatch, a sidecar watching vLLM speculative decoding (``__version__``); may import nothing.

``__version__`` is read from the installed distribution on first use (``importlib.metadata``
costs tens of milliseconds, which importing a pure module such as ``specwatch.observe.tracker``
should not pay).
"""

__version__: str

__all__ = ["__version__"]


def __getattr__(name: str) -> str:
    if name != "__version__":
        raise AttributeError(f"module 'specwatch' has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("specwatch")
    except PackageNotFoundError:  # running from a source tree that was not installed
        found = "0.0.0+unknown"
    globals()["__version__"] = found
    return found
