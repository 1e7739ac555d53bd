"""Can pip reach a package index? One quick request instead of pip's retries per package.

    python tools/upkeep/probe_index.py https://download.pytorch.org/whl/cpu      # exit 0: reachable
    python tools/upkeep/probe_index.py http://127.0.0.1:9/simple --timeout 2     # exit 1, one line on stderr

`make venv` asks this before it hands an extra index to pip. pip retries a connection that fails
five times, with back-off, for torch and for every package torch depends on: behind a firewall,
a proxy that blocks the host, or offline with only a local mirror, that is minutes of
"Retrying ... Failed to establish a new connection" before pip falls back to its other index.
One request with a short time-out decides it in seconds.

The request is a GET of the index's page for `package` (PEP 503: ``<index>/<package>/``) through
the proxies the environment names (``https_proxy`` and the like, as pip uses them). Reachable
means an HTTP answer below 400; a 404 means the index is there but does not serve the package,
which is no use either. Exit status: 0 usable, 1 not usable (the reason on one line).
"""

from __future__ import annotations

import argparse
import socket
import sys
import urllib.error
import urllib.request

DEFAULT_TIMEOUT_S = 5.0


def probe(index: str, package: str = "torch", timeout: float = DEFAULT_TIMEOUT_S) -> str | None:
    """None when `index` serves a page for `package` within `timeout` seconds, else the reason, in words."""
    if not index.startswith(("http://", "https://", "file://")):
        return f"not an http(s) or file URL: {index!r}"
    if timeout <= 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
    url = index.rstrip("/") + f"/{package}/"
    request = urllib.request.Request(url, headers={"User-Agent": "specref-setup-probe"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:  # noqa: S310 (the URL is the user's index)
            status = getattr(answer, "status", 200)
    except urllib.error.HTTPError as e:
        status = e.code
    except (urllib.error.URLError, TimeoutError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        if isinstance(reason, (socket.timeout, TimeoutError)):
            return f"no answer within {timeout:g} s"
        return str(reason) or type(reason).__name__
    if status == 404:
        return f"the index answers but has no {package!r} (HTTP 404 for {url})"
    if status >= 400:
        return f"HTTP {status} for {url}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("index", help="the index URL pip would be given (--extra-index-url)")
    parser.add_argument("--package", default="torch", help="the package the index must serve (default torch)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds (default 5)")
    args = parser.parse_args(argv)
    reason = probe(args.index, args.package, args.timeout)
    if reason is None:
        return 0
    print(f"{args.index} cannot be reached ({reason})", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
