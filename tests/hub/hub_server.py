"""A local stand-in for the Hugging Face Hub's file API, on the loopback address, serving folders as model repos.

It answers what huggingface_hub 2.4 asks (read from its source: hf_api.py `model_info`/`repo_info` and
`_iter_repo_tree_pages`, file_download.py `get_hf_file_metadata` and the download GET): model info at a revision,
the tree listing, and `resolve/<rev>/<file>` with HEAD and ranged GET, with the headers the client reads
(X-Repo-Commit, ETag, X-Linked-Etag, X-Linked-Size, Content-Length, Content-Range). Every byte of file content
sent is counted per file, so a test can tell a header read from a download. Point HF_ENDPOINT at `endpoint`.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

RANGE = re.compile(r"bytes=(\d+)-(\d*)$")
LFS_SUFFIXES = (".safetensors", ".bin")


class HubRepo:
    def __init__(self, repo_id: str, folder: Path):
        self.repo_id = repo_id
        self.folder = Path(folder).resolve()
        self.commit = hashlib.sha1(repo_id.encode()).hexdigest()  # one immutable revision per repo

    def files(self) -> list[Path]:
        return sorted(p for p in self.folder.rglob("*") if p.is_file())

    def path(self, name: str) -> Path | None:
        candidate = (self.folder / name).resolve()
        return candidate if candidate.is_file() and self.folder in candidate.parents else None

    def etag(self, path: Path) -> str:
        stat = path.stat()
        return hashlib.sha256(f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()


class HubServer:
    """`with HubServer({"org/base": folder}) as hub:` … `hub.endpoint`, `hub.bytes_sent(repo, file)`."""

    def __init__(self, repos: dict[str, Path]):
        self.repos = {rid: HubRepo(rid, folder) for rid, folder in repos.items()}
        self.sent: Counter = Counter()  # (repo_id, filename) -> file content bytes sent
        self.requests: list[tuple[str, str, str]] = []  # (method, path, Range header)
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def serve(self, repos: dict[str, Path]) -> None:
        """Serve `repos` from now on, the bytes sent and the requests counted from zero (a Hub kept for many tests:
        tests/served_hub.py)."""
        with self._lock:
            self.repos = {rid: HubRepo(rid, folder) for rid, folder in repos.items()}
            self.sent = Counter()
            self.requests = []

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def bytes_sent(self, repo_id: str, filename: str | None = None) -> int:
        return sum(n for (r, f), n in self.sent.items() if r == repo_id and filename in (None, f))

    def __enter__(self) -> HubServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handler(self):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_HEAD(self):
                self._serve(head=True)

            def do_GET(self):
                self._serve(head=False)

            def _serve(self, head: bool):
                url = urlparse(self.path)
                path = unquote(url.path)
                with hub._lock:
                    hub.requests.append((self.command, path, self.headers.get("range", "")))
                tree = re.match(r"^/api/models/(?P<repo>[^/]+/[^/]+)/tree/(?P<rev>[^/]+)(?P<sub>/.*)?$", path)
                info = re.match(r"^/api/models/(?P<repo>[^/]+/[^/]+)(?:/revision/(?P<rev>[^/]+))?$", path)
                resolve = re.match(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$", path)
                if tree:
                    return self._tree(hub.repos.get(tree["repo"]), "recursive=true" in url.query.lower(), head)
                if info:
                    return self._model_info(hub.repos.get(info["repo"]), head)
                if resolve:
                    return self._file(hub.repos.get(resolve["repo"]), resolve["file"], head)
                self._json({"error": "not found"}, 404, head)

            def _not_found(self, head: bool, code: str = "RepoNotFound"):
                self._json({"error": code}, 404, head, {"X-Error-Code": code})

            def _model_info(self, repo: HubRepo | None, head: bool):
                if repo is None:
                    return self._not_found(head)
                siblings = [{"rfilename": p.relative_to(repo.folder).as_posix()} for p in repo.files()]
                self._json({"id": repo.repo_id, "modelId": repo.repo_id, "sha": repo.commit, "private": False,
                            "siblings": siblings, "tags": [], "downloads": 0, "likes": 0}, 200, head,
                           {"X-Repo-Commit": repo.commit})

            def _tree(self, repo: HubRepo | None, recursive: bool, head: bool):
                if repo is None:
                    return self._not_found(head)
                entries = []
                for p in repo.files():
                    rel = p.relative_to(repo.folder)
                    if not recursive and len(rel.parts) > 1:
                        continue
                    size = p.stat().st_size
                    entry = {"type": "file", "path": rel.as_posix(), "size": size, "oid": repo.etag(p)[:40]}
                    if p.suffix in LFS_SUFFIXES:
                        entry["lfs"] = {"oid": repo.etag(p), "size": size, "pointerSize": 134}
                    entries.append(entry)
                self._json(entries, 200, head)

            def _file(self, repo: HubRepo | None, name: str, head: bool):
                if repo is None:
                    return self._not_found(head)
                path = repo.path(name)
                if path is None:
                    return self._not_found(head, "EntryNotFound")
                size = path.stat().st_size
                headers = {"X-Repo-Commit": repo.commit, "ETag": f'"{repo.etag(path)}"', "Accept-Ranges": "bytes",
                           "Content-Type": "application/octet-stream"}
                if path.suffix in LFS_SUFFIXES:
                    headers["X-Linked-Size"] = str(size)
                    headers["X-Linked-Etag"] = f'"{repo.etag(path)}"'
                ranged = RANGE.match(self.headers.get("range", "").strip())
                start, end, status = 0, size - 1, 200
                if ranged and not head:
                    start = int(ranged[1])
                    end = min(int(ranged[2]) if ranged[2] else size - 1, size - 1)
                    if start >= size:
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{size}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    status = 206
                    headers["Content-Range"] = f"bytes {start}-{end}/{size}"
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(max(end - start + 1, 0)))
                self.end_headers()
                if head:
                    return
                with open(path, "rb") as fh:
                    fh.seek(start)
                    remaining = end - start + 1
                    while remaining > 0:
                        chunk = fh.read(min(remaining, 1 << 20))
                        if not chunk:
                            break
                        self.wfile.write(chunk)
                        remaining -= len(chunk)
                        with hub._lock:
                            hub.sent[(repo.repo_id, name)] += len(chunk)

            def _json(self, data, status: int, head: bool, extra: dict | None = None):
                body = json.dumps(data).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                for key, value in (extra or {}).items():
                    self.send_header(key, value)
                self.end_headers()
                if not head:
                    self.wfile.write(body)

        return Handler
