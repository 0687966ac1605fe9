"""The lab's Hugging Face Hub: a small HTTP server that the real `huggingface_hub` client talks to through
`HF_ENDPOINT`, serving one tiny gated repo at a fixed commit.

It answers exactly the routes huggingface_hub 1.33.0 (the version the lab's wheelhouse resolves for SGLang
0.5.23: transformers 5.19.0 needs huggingface-hub>=1.31.0,<3.0) calls for `model_info`, `list_repo_tree`,
`hf_hub_download` and `snapshot_download`, each read from the client's source:

- `GET /api/models/{repo}/revision/{rev}` and `GET /api/models/{repo}` (hf_api.py l.3310-3325 `model_info`,
  which `repo_info` and snapshot_download's revision lookup use, _snapshot_download.py l.277): JSON with `id`,
  `sha` (the commit), `gated`, `private` and `siblings`; with `?blobs=True` (files_metadata, l.3318-3319) each
  sibling also has `size`, `blobId` and, for an LFS file, `lfs: {size, sha256, pointerSize}` (hf_api.py
  l.1071-1091 reads exactly these).
- `GET /api/models/{repo}/tree/{rev}[/{path}]` (hf_api.py l.4098-4102 `list_repo_tree`, through
  utils/_pagination.py `paginate`, which follows a `Link: rel=next` header; one page here): a list of
  `{type: file, oid, size, path, lfs: {oid, size, pointerSize}}` (RepoFile, hf_api.py l.815-823).
- `HEAD` and `GET /{repo}/resolve/{rev}/{filename}` (file_download.py l.211 `hf_hub_url`; l.1617-1689
  `get_hf_file_metadata` reads `X-Repo-Commit`, `X-Linked-Etag` or `ETag`, `X-Linked-Size` or `Content-Length`;
  l.1786-1803 refuse a response without the commit or the etag). The etag of an LFS file is its sha256, of
  another file its git blob sha1, as the hub's. `GET` honours `Range: bytes=N-` with 206 and `Content-Range`
  (file_download.py l.376-378 `http_get` resumes a transfer that broke within one call that way; 1.33.0 keeps
  no partial file across calls: l.1996-2044 download into a process-unique `.incomplete` file and delete it
  on failure).
- Refusals, as `hf_raise_for_status` (utils/_http.py l.841-913) tells them apart by `X-Error-Code`: a gated repo
  without a token is 401 `GatedRepo`, a wrong token 401 with `X-Error-Message: Invalid credentials in
  Authorization header`, an unknown repo 401 `RepoNotFound` (the hub answers 401 for those too, l.909-912), an
  unknown revision 404 `RevisionNotFound`, an unknown file 404 `EntryNotFound`.

What it cannot show: the hub's redirect of LFS files to a CDN on another host (the client then drops the
Authorization header, file_download.py l.1817-1821): files are served from the resolve route itself; Xet storage
(no `X-Xet-*` headers, so the client takes plain HTTP, l.2014-2036); pagination of a large tree; rate limits.

`corrupt(name)` makes the server send other bytes of the same size for one file while every route still reports
the true sha256: what a client sees when a mirror or a proxy hands it a bad copy. `cut(name)` makes it send half of
what a GET of the file asks for and close the connection, every time: a transfer cut mid-file (a dropped link, a
proxy's timeout) that the client's own resumes do not get past.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import socket
import socketserver
import struct
import sys
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

REPO_ID = "provision-lab/tiny-model"
# Linux's IP_FREEBIND (include/uapi/linux/in.h; ip(7)): bind an address no interface has yet. Python 3.11's socket
# module does not name it.
IP_FREEBIND = getattr(socket, "IP_FREEBIND", 15)
LFS_POINTER_SIZE = 134  # a git-lfs pointer file for a sha256 and a size of 6 digits, as the hub reports it


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # git object name


@dataclass
class HubFile:
    path: str
    data: bytes
    lfs: bool = False

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def blob_id(self) -> str:
        """The git object the repo holds: the file itself, or its LFS pointer for an LFS file."""
        if self.lfs:
            return git_blob_sha1(self.pointer())
        return git_blob_sha1(self.data)

    def pointer(self) -> bytes:
        return f"version https://git-lfs.github.com/spec/v1\noid sha256:{self.sha256}\nsize {len(self.data)}\n".encode()

    @property
    def etag(self) -> str:
        return self.sha256 if self.lfs else self.blob_id


@dataclass
class HubRepo:
    repo_id: str
    files: list[HubFile]
    gated: bool = True
    commit: str = ""
    branches: dict[str, str] = field(default_factory=dict)

    def __post_init__(self):
        if not self.commit:  # a fixed commit: the same files give the same id
            self.commit = hashlib.sha1("".join(f.blob_id for f in self.files).encode()).hexdigest()
        self.branches.setdefault("main", self.commit)

    def resolve(self, revision: str) -> str | None:
        if revision == self.commit:
            return self.commit
        return self.branches.get(revision)

    def file(self, path: str) -> HubFile | None:
        return next((f for f in self.files if f.path == path), None)


def safetensors_blob(n_floats: int) -> bytes:
    """A valid safetensors file: 8-byte header length, JSON header, one F32 tensor of deterministic values."""
    header = json.dumps({"weight": {"dtype": "F32", "shape": [n_floats], "data_offsets": [0, 4 * n_floats]}})
    header = header.encode() + b" " * (-len(header) % 8)
    body = bytearray()
    seed = b"provision-lab"
    while len(body) < 4 * n_floats:
        seed = hashlib.sha256(seed).digest()
        body += seed
    return struct.pack("<Q", len(header)) + header + bytes(body[: 4 * n_floats])


def tiny_repo(repo_id: str = REPO_ID, gated: bool = True) -> HubRepo:
    """config.json and tokenizer.json (plain git files) and model.safetensors (LFS, ~300 KB)."""
    config = {
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "vocab_size": 256,
        "max_position_embeddings": 512,
        "torch_dtype": "float32",
        "model_type": "llama",
    }
    tokenizer = {"version": "1.0", "model": {"type": "WordLevel", "vocab": {"<unk>": 0}, "unk_token": "<unk>"}}
    return HubRepo(
        repo_id,
        [
            HubFile("config.json", (json.dumps(config, indent=2) + "\n").encode()),
            HubFile("tokenizer.json", (json.dumps(tokenizer) + "\n").encode()),
            HubFile("model.safetensors", safetensors_blob(75_000), lfs=True),
        ],
        gated=gated,
    )


class Hub:
    """The server: `Hub(repos, tokens).start(host, port)`; `url` is what HF_ENDPOINT takes."""

    def __init__(self, repos: list[HubRepo], tokens: set[str]):
        self.repos = {r.repo_id: r for r in repos}
        self.tokens = set(tokens)
        self.corrupted: set[tuple[str, str]] = set()
        self.cuts: set[tuple[str, str]] = set()
        self.requests: list[dict] = []  # method, path, whether a token came (never the token)
        self.httpd: ThreadingHTTPServer | None = None

    def corrupt(self, repo_id: str, path: str, on: bool = True) -> None:
        (self.corrupted.add if on else self.corrupted.discard)((repo_id, path))

    def cut(self, repo_id: str, path: str, on: bool = True) -> None:
        (self.cuts.add if on else self.cuts.discard)((repo_id, path))

    def body_of(self, repo: HubRepo, f: HubFile) -> bytes:
        if (repo.repo_id, f.path) not in self.corrupted:
            return f.data
        return bytes(b ^ 0xFF for b in f.data)  # same size, other bytes

    def start(self, host: str = "127.0.0.1", port: int = 0, freebind: bool = False) -> Hub:
        """Serve on host:port (0: a free one). `freebind`: bind even where no interface has `host` yet (IP_FREEBIND),
        as for a lab link whose veth appears only when a container that an apply creates starts."""
        hub = self

        class Handler(HubHandler):
            server_hub = hub

        self.httpd = HubServer((host, port), Handler, freebind=freebind)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def stop(self) -> None:
        if self.httpd:
            self.httpd.shutdown()
            self.httpd.server_close()


class HubServer(ThreadingHTTPServer):
    """ThreadingHTTPServer, optionally bound with IP_FREEBIND."""

    def __init__(self, address: tuple[str, int], handler, freebind: bool = False):
        self.freebind = freebind
        super().__init__(address, handler)

    def server_bind(self) -> None:
        if self.freebind:
            self.socket.setsockopt(socket.IPPROTO_IP, IP_FREEBIND, 1)
        socketserver.TCPServer.server_bind(self)
        # HTTPServer.server_bind would also look up the address's name (socket.getfqdn): a reverse DNS query for a
        # lab address, which nothing here reads and which waits out the resolver's timeout where no DNS answers
        self.server_name, self.server_port = self.server_address[:2]


class Refusal(Exception):
    def __init__(self, status: int, code: str | None, message: str, headers: dict | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers or {}


API = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)(?:/(?P<kind>revision|tree)/(?P<rev>[^/]+)(?P<rest>/.*)?)?$")
RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")


class HubHandler(BaseHTTPRequestHandler):
    server_hub: Hub
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_HEAD(self):
        self.handle_request(head=True)

    def do_GET(self):
        self.handle_request(head=False)

    def handle_request(self, head: bool) -> None:
        url = urlsplit(self.path)
        path = unquote(url.path)
        hub = self.server_hub
        hub.requests.append(
            {"method": self.command, "path": path, "token": "authorization" in map(str.lower, self.headers)}
        )
        try:
            if m := API.match(path):
                self.api(m, parse_qs(url.query), head)
            elif m := RESOLVE.match(path):
                self.resolve_file(m, head)
            else:
                raise Refusal(404, None, "Not Found")
        except Refusal as r:
            self.refuse(r, head)

    def repo_for(self, repo_id: str, revision: str | None) -> tuple[HubRepo, str]:
        """The repo and commit, or the hub's refusal: no repo, no access, no such revision."""
        repo = self.server_hub.repos.get(repo_id)
        if repo is None:
            raise Refusal(401, "RepoNotFound", "Repository not found")
        auth = self.headers.get("Authorization", "")
        token = auth[7:] if auth.startswith("Bearer ") else None
        if token is not None and token not in self.server_hub.tokens:
            raise Refusal(401, None, "Invalid credentials in Authorization header")
        if repo.gated and token is None:
            raise Refusal(
                401,
                "GatedRepo",
                f"Access to model {repo_id} is restricted. You must have access to it and be "
                "authenticated to access it. Please log in.",
            )
        commit = repo.resolve(revision or "main")
        if commit is None:
            raise Refusal(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return repo, commit

    def api(self, m, query: dict, head: bool) -> None:
        repo, commit = self.repo_for(m["repo"], m["rev"])
        blobs = query.get("blobs", ["false"])[0].lower() == "true"
        if m["kind"] == "tree":
            prefix = (m["rest"] or "").strip("/")
            body = [self.tree_entry(f) for f in repo.files if not prefix or f.path.startswith(prefix + "/")]
        else:
            body = {
                "_id": repo.repo_id,
                "id": repo.repo_id,
                "modelId": repo.repo_id,
                "sha": commit,
                "private": False,
                "gated": "manual" if repo.gated else False,
                "disabled": False,
                "tags": [],
                "siblings": [self.sibling(f, blobs) for f in repo.files],
            }
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if not head:
            self.wfile.write(data)

    @staticmethod
    def sibling(f: HubFile, blobs: bool) -> dict:
        if not blobs:
            return {"rfilename": f.path}
        entry = {"rfilename": f.path, "size": len(f.data), "blobId": f.blob_id}
        if f.lfs:
            entry["lfs"] = {"size": len(f.data), "sha256": f.sha256, "pointerSize": LFS_POINTER_SIZE}
        return entry

    @staticmethod
    def tree_entry(f: HubFile) -> dict:
        entry = {"type": "file", "oid": f.blob_id, "size": len(f.data), "path": f.path}
        if f.lfs:
            entry["lfs"] = {"oid": f.sha256, "size": len(f.data), "pointerSize": LFS_POINTER_SIZE}
        return entry

    def resolve_file(self, m, head: bool) -> None:
        repo, commit = self.repo_for(m["repo"], m["rev"])
        f = repo.file(m["path"])
        if f is None:  # with the commit: the client caches the absence per commit (file_download.py l.1770-1783)
            raise Refusal(
                404, "EntryNotFound", f'{m["path"]} does not exist on "{m["rev"]}"', {"X-Repo-Commit": commit}
            )
        data = self.server_hub.body_of(repo, f)
        start = self.range_start(len(data))
        self.send_response(206 if start else 200)
        self.send_header("X-Repo-Commit", commit)
        self.send_header("ETag", f'"{f.etag}"')
        if f.lfs:
            self.send_header("X-Linked-Etag", f'"{f.sha256}"')
            self.send_header("X-Linked-Size", str(len(f.data)))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(len(data) - start))
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.end_headers()
        if head:
            return
        if (repo.repo_id, f.path) in self.server_hub.cuts:  # half of what was promised, then the connection goes
            self.wfile.write(data[start : start + (len(data) - start) // 2])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.wfile.write(data[start:])

    def range_start(self, size: int) -> int:
        """The start of a `Range: bytes=N-` request (the only form the client sends), else 0."""
        m = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range", "").strip())
        if not m or int(m.group(1)) >= size:
            return 0
        return int(m.group(1))

    def refuse(self, r: Refusal, head: bool) -> None:
        data = json.dumps({"error": r.message}).encode()
        self.send_response(r.status)
        if r.code:
            self.send_header("X-Error-Code", r.code)
        self.send_header("X-Error-Message", r.message)
        for name, value in r.headers.items():
            self.send_header(name, value)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if not head:
            self.wfile.write(data)


def main(argv: list[str] | None = None) -> int:
    """`python -m provision.lab.hfhub --host H [--freebind] --port P --token-file F [--ready-file R] [--corrupt P]`."""
    parser = argparse.ArgumentParser(prog="provision.lab.hfhub")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--token-file", type=Path, required=True)
    parser.add_argument("--ready-file", type=Path)
    parser.add_argument("--corrupt", action="append", default=[], help="a file of the lab repo to serve corrupted")
    parser.add_argument("--freebind", action="store_true", help="bind --host before any interface has it")
    args = parser.parse_args(argv)
    hub = Hub([tiny_repo()], {args.token_file.read_text().strip()})
    for path in args.corrupt:
        hub.corrupt(REPO_ID, path)
    hub.start(args.host, args.port, freebind=args.freebind)
    if args.ready_file:
        args.ready_file.write_text(json.dumps({"url": hub.url, "repo": REPO_ID, "commit": tiny_repo().commit}))
    print(f"hfhub: serving {REPO_ID} at {hub.url}", flush=True)
    threading.Event().wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
