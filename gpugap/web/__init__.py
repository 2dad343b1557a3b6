"""The capacity-gap web page (``gpugap web``): a small page over the warehouse views, served on
aiohttp with every asset in the package. ``server`` serves it, ``api`` answers its named
queries (``queries``) with validated parameters (``params``)."""

DEFAULT_PORT = 8321  # `gpugap web --port`


def answers(url: str, timeout_s: float = 20.0) -> bool:
    """Whether the page at ``url`` answers its health check within ``timeout_s``."""
    import contextlib
    import time
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), urllib.request.urlopen(f"{url}healthz", timeout=1):  # noqa: S310 (our own http URL)
            return True
        time.sleep(0.2)
    return False
