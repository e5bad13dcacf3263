"""A loopback stand-in for the Hugging Face Hub's download endpoints, for offline tests of pulling.

Answers what ``huggingface_hub.snapshot_download`` asks (model repositories only):

    GET  /api/models/{repo}/revision/{rev}    the revision's commit sha and its files
    GET  /api/models/{repo}/tree/{commit}     the files with size and oid
    HEAD /{repo}/resolve/{rev}/{path}         X-Repo-Commit, ETag, Content-Length
    GET  /{repo}/resolve/{rev}/{path}         the bytes

An unknown repository or revision gets the Hub's 404 with its ``X-Error-Code``. Serves 127.0.0.1 only.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self
from urllib.parse import unquote, urlparse


class Repos:
    """repo id -> {"refs": {name: commit}, "commits": {commit: {path: bytes}}}."""

    def __init__(self) -> None:
        self.repos: dict[str, dict] = {}

    def add(self, repo: str, files: dict[str, bytes], ref: str = "main") -> str:
        commit = hashlib.sha1(json.dumps(sorted((p, hashlib.sha256(b).hexdigest()) for p, b in files.items())).encode()).hexdigest()
        r = self.repos.setdefault(repo, {"refs": {}, "commits": {}})
        r["commits"][commit] = dict(files)
        r["refs"][ref] = commit
        return commit

    def resolve(self, repo: str, rev: str) -> tuple[str, dict[str, bytes]] | None:
        r = self.repos[repo]
        commit = r["refs"].get(rev, rev)
        return (commit, r["commits"][commit]) if commit in r["commits"] else None


def handler(repos: Repos):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # quiet
            pass

        def _send(self, code: int, body: bytes = b"", headers: dict | None = None, head: bool = False) -> None:
            self.send_response(code)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)

        def _error(self, code: str, head: bool = False) -> None:
            self._send(404, json.dumps({"error": code}).encode(), {"X-Error-Code": code, "Content-Type": "application/json"}, head)

        def _resolve(self, repo: str, rev: str, head: bool):
            """(commit, files) of a repository's revision, or None after answering the Hub's 404."""
            if repo not in repos.repos:
                self._error("RepoNotFound", head)
                return None
            found = repos.resolve(repo, rev)
            if found is None:
                self._error("RevisionNotFound", head)
            return found

        def _route(self, head: bool) -> None:
            path = unquote(urlparse(self.path).path)
            m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/(revision|tree)/([^/]+)(/.*)?", path)
            if m:
                repo, kind, rev = m.group(1), m.group(2), m.group(3)
                found = self._resolve(repo, rev, head)
                if found is None:
                    return None
                commit, files = found
                if kind == "revision":
                    body = {"id": repo, "modelId": repo, "sha": commit, "private": False,
                            "siblings": [{"rfilename": p} for p in sorted(files)]}  # fmt: skip
                else:
                    body = [{"type": "file", "path": p, "size": len(b), "oid": hashlib.sha1(b).hexdigest()}
                            for p, b in sorted(files.items())]  # fmt: skip
                return self._send(200, json.dumps(body).encode(), {"Content-Type": "application/json"}, head)
            m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
            if m:
                repo, rev, name = m.groups()
                found = self._resolve(repo, rev, head)
                if found is None:
                    return None
                commit, files = found
                if name not in files:
                    return self._error("EntryNotFound", head)
                body = files[name]
                etag = f'"{hashlib.sha256(body).hexdigest()}"'
                return self._send(200, body, {"X-Repo-Commit": commit, "ETag": etag,
                                              "Content-Type": "application/octet-stream"}, head)  # fmt: skip
            return self._send(404, b"not found", {}, head)

        def do_GET(self) -> None:
            self._route(head=False)

        def do_HEAD(self) -> None:
            self._route(head=True)

    return Handler


class HubServer:
    """``with HubServer() as hub: hub.repos.add(...); hub.url``: a loopback Hub on a free port."""

    def __init__(self) -> None:
        self.repos = Repos()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler(self.repos))
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> Self:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
