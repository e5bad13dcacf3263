"""Reading a data source's files: from a base URL (http, https), tried a few times, or from a folder.

    src = Source("https://example.org/mirror")        # or a folder, or a file:// URL
    data = src.read(src.location("dataset/antonym/train.json"), "task antonym, train.json")

``read`` raises ``NotFound`` when the file is missing and a one-line ``SourceError`` on any
other failure. Over the network, an HTTP 5xx or 429 answer (after its Retry-After, capped),
a timeout or a dropped connection is tried again, up to ``ATTEMPTS`` times; a host that
cannot be resolved or refuses the connection fails at once.
"""

from __future__ import annotations

import http.client
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from .._version import __version__
from . import SourceError

TIMEOUT_S = 60.0  # per request
ATTEMPTS = 3  # tries per file on a 5xx or 429 answer, a timeout or a dropped connection
RETRY_AFTER_MAX_S = 60  # the longest Retry-After (seconds) waited for
MAX_BYTES = 64 << 20  # a longer answer is not a data file (the FV release's largest is ~2 MB)
TRANSIENT = (TimeoutError, ConnectionResetError, http.client.RemoteDisconnected, http.client.IncompleteRead)


class NotFound(SourceError):
    """The source answers but has no such file (HTTP 404, or no file in the folder)."""


def unreachable(host: str, reason: object) -> str:
    """The one-line message for a host that cannot be reached."""
    why = getattr(reason, "strerror", None) or str(reason) or reason.__class__.__name__
    return f"cannot reach {host} ({why}); connect to the internet or pass --source (a mirror: URL or folder)"


class Source:
    """Where the files are read from: a base URL (http, https) or a folder (also as a file:// URL)."""

    def __init__(self, spec: str | os.PathLike, timeout: float = TIMEOUT_S) -> None:
        text = str(spec).strip()
        parts = urllib.parse.urlsplit(text)
        self.timeout = timeout
        self.url: str | None = None
        self.folder: Path | None = None
        if parts.scheme.lower() in ("http", "https"):
            self.url = text.rstrip("/")
        elif parts.scheme.lower() == "file":
            self.folder = Path(urllib.request.url2pathname(parts.path))
        elif len(parts.scheme) > 1:  # one letter is a Windows drive
            raise SourceError(f"source {text}: give an http(s):// or file:// URL, or a folder")
        else:
            self.folder = Path(text).expanduser().absolute()
        self.text = text
        self.where = self.url or text.rstrip("/") or text  # as given: meta.json records no resolved local path

    def location(self, rel: str) -> str:
        """The URL or path of ``rel`` (a '/'-separated path under the source)."""
        return f"{self.url}/{urllib.parse.quote(rel)}" if self.url else str(self.folder / rel)

    def shown(self, rel: str) -> str:
        """``rel`` under the source as the user gave it (what meta.json records)."""
        return self.location(rel) if self.url else f"{self.where}/{rel}"

    def read(self, location: str, what: str) -> bytes:
        """The bytes at ``location``; NotFound when it is missing, SourceError (one line) on any other failure."""
        if self.url is None:
            path = Path(location)
            try:
                return path.read_bytes()
            except FileNotFoundError:
                raise NotFound(f"{what}: not found at {path}") from None
            except OSError as e:
                raise SourceError(f"{what}: cannot read {path} ({e.strerror or e})") from None
        return self.get(location, what)

    def get(self, url: str, what: str, attempts: int = ATTEMPTS) -> bytes:
        """The bytes at ``url``, tried ``attempts`` times on HTTP 5xx or 429 (after its Retry-After, capped), a
        timeout or a dropped connection; an unknown or refusing host fails at once. NotFound on 404, else a
        one-line SourceError."""
        request = urllib.request.Request(url, headers={"User-Agent": f"site-lens/{__version__}"})
        for attempt in range(1, attempts + 1):
            wait = 2.0 ** (attempt - 1)
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    data = response.read(MAX_BYTES + 1)
                    if len(data) > MAX_BYTES:
                        raise SourceError(f"{what}: {url} is over {MAX_BYTES:,} bytes, not a data file")
                    if getattr(response, "length", None):  # fewer bytes than its Content-Length
                        raise http.client.IncompleteRead(data, response.length)
                    return data
            except urllib.error.HTTPError as e:
                if e.code == 404:
                    raise NotFound(f"{what}: not found at {url} (HTTP 404)") from None
                if not (e.code >= 500 or e.code == 429) or attempt == attempts:
                    raise SourceError(f"{what}: HTTP {e.code} {e.reason} from {url}") from None
                after = (e.headers or {}).get("Retry-After", "").strip()
                wait = min(int(after), RETRY_AFTER_MAX_S) if after.isdigit() else wait
            except urllib.error.URLError as e:  # no connection: retried only when it timed out or was reset
                if not isinstance(e.reason, TRANSIENT) or attempt == attempts:
                    raise SourceError(unreachable(urllib.parse.urlsplit(url).netloc, e.reason)) from None
            except (OSError, http.client.HTTPException) as e:  # connected, then no answer in time, or cut off
                if not isinstance(e, TRANSIENT) or attempt == attempts:
                    why = f"no answer in {self.timeout:g} s" if isinstance(e, TimeoutError) else f"{e!r}"
                    tries = f", {attempts} tries" if isinstance(e, TRANSIENT) else ""
                    msg = f"{what}: reading {url} failed ({why}{tries}); run the command again to resume"
                    raise SourceError(msg) from None
            time.sleep(wait)
        raise AssertionError("unreachable")  # the loop returns or raises
