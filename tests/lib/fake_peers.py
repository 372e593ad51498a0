"""Peers that misbehave on purpose, for the fan-out tests: each is the real piece server (``_stage_peer``) over a
real staged copy, with one behaviour swapped in.

Behaviours (``BEHAVIOURS``):

* ``honest``: the real server;
* ``unserved``: lists every piece, answers 404 to every transfer;
* ``errors``: lists every piece, answers 500 to every transfer;
* ``stall``: starts every transfer (206, the right length), sends a few bytes, then nothing;
* ``truncated``: sends half of every piece, then closes;
* ``stall_list``: starts every piece list, then nothing;
* ``malformed:<kind>``: piece lists broken one way (``MALFORMED``): non-ASCII digits, nesting, absurd or negative
  counters, wrong types, not JSON, oversized, non-finite numbers;
* ``lie_bytes``: its board claims the seed's digests for pieces whose bytes it flipped;
* ``lie_seed``: (as a seed) flipped bytes *and* digests recomputed from them, so it is consistent with itself
  and only the shared filesystem can tell it lied;
* ``oscillate``: (as a seed) a copy that never ends: its lists say ``copying`` and hold the first two pieces of
  each file, then only the first, then two again, forever (it serves what it lists): a list that shrinks and grows
  back, which is no progress.
* ``version:<kind>``: its whole list is honest (protocol 2), every list of changes asked of it lies one way
  (``VERSION_LIES``): a version that goes back (an old list replayed), changes under the version asked from, an
  epoch not asked about, a list of changes over the size cap;
* ``v1``: a protocol 1 server (before lists of changes): it ignores the query and answers its whole list without
  ``seq``, as a peer not upgraded yet does.

:func:`board_copy` makes a peer's partial build of given source files under any names (a name that is not UTF-8
included), for tests that hand a receiver files directly.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
from urllib.parse import parse_qs

from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_marker as _marker
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_peer

TOKEN = "fanout-test-token-0123456789abcdef"

MALFORMED = {
    # one ASCII-looking digit string each: Arabic-Indic and superscript digits pass str.isdigit()
    "arabic_have": lambda d: _each_file(d, lambda e: e.update(have=e["have"].replace("1", "\u0661").replace("0", "\u0660"))),
    "arabic_sent": lambda d: _each_file(d, lambda e: e.update(sent="\u0661" * len(e["have"]))),
    "superscript_sent": lambda d: _each_file(d, lambda e: e.update(sent="\u00b2" * len(e["have"]))),
    "nested": lambda d: dict(d, files=_nest(200)),
    "absurd_load": lambda d: dict(d, load=10 ** 30),
    "negative_load": lambda d: dict(d, load=-1000000),
    "huge_load": lambda d: dict(d, load=2 ** 62),
    "bool_load": lambda d: dict(d, load=True),
    "string_piece_size": lambda d: dict(d, piece_size=str(d["piece_size"])),
    "list_have": lambda d: _each_file(d, lambda e: e.update(have=list(e["have"]))),
    "short_have": lambda d: _each_file(d, lambda e: e.update(have=e["have"][:-1])),
    "files_list": lambda d: dict(d, files=list(d["files"])),
    "entry_string": lambda d: dict(d, files=dict((k, "x") for k in d["files"])),
    "negative_size": lambda d: _each_file(d, lambda e: e.update(size=-1)),
    "float_src": lambda d: _each_file(d, lambda e: e.update(src=[float(x) for x in e["src"]])),
    "bad_sha": lambda d: _each_file(d, lambda e: e.update(header_sha256="Z" * 64)),
    "unknown_state": lambda d: dict(d, state="\u0661"),
    "negative_age": lambda d: dict(d, board_age=-5),
    "not_object": lambda d: [d],
}
RAW = {
    "not_json": b"\xff\xfe{not json",
    "nan_age": b'{"piece_size": %(ps)d, "state": "complete", "board_age": NaN, "load": 0, "files": {}}',
    "big_int": b'{"piece_size": %(ps)d, "load": 1' + b"0" * 500 + b', "files": {}}',
    "oversized": b'{"piece_size": %(ps)d, "pad": "' + b"x" * (9 * 1024 * 1024) + b'", "files": {}}',
}
#: a list of changes (protocol 2) that lies, from the honest one and the request's ``since``
VERSION_LIES = {
    "backwards": lambda d, since: dict(d, seq=max(0, since - 1)),
    "same_seq": lambda d, since: dict(d, seq=since, files=d["full_files"]),
    "other_epoch": lambda d, since: dict(d, epoch="ab" * 8),
    "oversized": lambda d, since: dict(d, pad="x" * (9 * 1024 * 1024)),
}
BEHAVIOURS = (["honest", "unserved", "errors", "stall", "truncated", "stall_list", "lie_bytes", "lie_seed", "oscillate",
               "v1"] + ["malformed:" + k for k in sorted(MALFORMED)] + ["malformed:" + k for k in sorted(RAW)]
              + ["version:" + k for k in sorted(VERSION_LIES)])
#: behaviours of a peer that sends bytes or digests the authority contradicts (reported ``lied``)
LYING = ("lie_bytes", "lie_seed")


def _each_file(doc, edit):
    for e in doc["files"].values():
        edit(e)
    return doc


def _nest(depth):
    v = {}
    for _i in range(depth):
        v = {"a": v}
    return v


class _Handler(_stage_peer._Handler):
    def do_GET(self):
        b = self.server.behaviour
        path = self.path.split("?")[0]
        if b.startswith("malformed:") and path.endswith("/pieces") and self._authorized():
            return self._send_raw(200, self._malformed(b.split(":", 1)[1]))
        if b == "stall_list" and path.endswith("/pieces"):
            return self._stall(b"{")
        if b == "oscillate" and path.endswith("/pieces") and self._authorized():
            return self._send_raw(200, self._oscillating())
        if path.endswith("/pieces") and self._authorized():
            with self.server._count_lock:  # pylint: disable=protected-access
                self.server.lists += 1
            offer = list(self.server.offers.values())[0]
            if b == "v1":
                return self._send_raw(200, offer.public_body(0))
            since = parse_qs(self.path.partition("?")[2]).get("since")
            if b.startswith("version:") and since:
                doc = json.loads(offer.list_body(0, int(since[0]), offer.epoch, True, 0.0))
                doc["full_files"] = json.loads(offer.list_body(0))["files"]
                doc = VERSION_LIES[b.split(":", 1)[1]](dict(doc, full=False), int(since[0]))
                doc.pop("full_files")
                return self._send_raw(200, json.dumps(doc).encode("utf-8"))
        if "/files/" in path and b in ("unserved", "errors", "stall", "truncated"):
            self.server.transfers += 1
            if b == "unserved":
                return self._send_json(404, {"error": "not held"})
            if b == "errors":
                return self._send_json(500, {"error": "internal"})
            first, last = [int(x) for x in self.headers["Range"].split("=", 1)[1].split("-")]
            n = last - first + 1
            self.send_response(206)
            self.send_header("Content-Length", str(n))
            self.end_headers()
            if b == "stall":
                return self._stall(b"\0" * min(100, n - 1), headers_sent=True)  # never the whole piece
            self.wfile.write(b"\0" * (n // 2))
            self.close_connection = True
            return None
        return _stage_peer._Handler.do_GET(self)

    def _malformed(self, kind):
        if kind in RAW:
            return RAW[kind] % {b"ps": self.server.piece_size}
        offer = list(self.server.offers.values())[0]
        return json.dumps(MALFORMED[kind](offer.public(0)), ensure_ascii=False).encode("utf-8")

    def _oscillating(self):
        with self.server._count_lock:  # pylint: disable=protected-access
            self.server.lists += 1
            keep = 2 if self.server.lists % 2 else 1
        doc = list(self.server.offers.values())[0].public(0)
        doc["state"] = "copying"
        for e in doc["files"].values():
            e["have"] = "".join(h if i < keep else "0" for i, h in enumerate(e["have"]))
        return json.dumps(doc).encode("utf-8")

    def _send_raw(self, code, body):
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _stall(self, first, headers_sent=False):
        if not headers_sent:
            self.send_response(200)
            self.send_header("Content-Length", "1000000")
            self.end_headers()
        self.wfile.write(first)
        self.wfile.flush()
        self.server.stalled.wait(60)
        self.close_connection = True


class FakePeer(object):
    """A piece server over ``dest`` behaving as ``behaviour``; ``url`` its revision URL."""

    def __init__(self, dest, piece_size, behaviour="honest", token=TOKEN):
        self.behaviour = behaviour
        self.server = _stage_peer.PeerServer("127.0.0.1", 0, _stage_peer.token_digest(token),
                                             {"m/r1": _stage_peer.Offer(dest, piece_size, ttl=0)})
        self.server.RequestHandlerClass = _Handler
        self.server.behaviour = behaviour
        self.server.piece_size = piece_size
        self.server.transfers = 0
        self.server.lists = 0
        self.server.stalled = threading.Event()
        self.server.handle_error = lambda *_args: None  # a receiver hanging up on a lie is no news here
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)
        self.thread.start()
        self.url = "http://127.0.0.1:%d/r/m/r1" % self.server.server_address[1]

    def close(self):
        self.server.stalled.set()
        self.server.shutdown()
        self.server.server_close()


def flipped_copy(seed_dest, where, piece_size, consistent, flip=None):
    """A peer's partial build: ``seed_dest``'s files with one byte flipped in a piece of each file given in
    ``flip`` (``{rel: piece}``, default: piece 1 of the second file), its board listing every piece held. With
    ``consistent`` the board carries the flipped pieces' own digests (a seed lying consistently); without, the
    seed's digests (bytes that contradict the digests it lists)."""
    records = _marker.read_marker(seed_dest).marker.records
    if flip is None:
        rel = sorted(r.path for r in records if _marker.piece_count(r.size, piece_size) > 1)[0]
        flip = {rel: 1}
    partial = where + ".partial"
    shutil.copytree(seed_dest, partial)
    os.unlink(os.path.join(partial, _marker.MARKER))
    board = _stage_peer.Board(partial, piece_size)
    for rec in records:
        digests = list(rec.pieces)
        if rec.path in flip:
            i = flip[rec.path]
            at = i * piece_size + 5
            with open(os.path.join(partial, rec.path), "r+b") as f:
                f.seek(at)
                b = f.read(1)
                f.seek(at)
                f.write(bytes([b[0] ^ 0xFF]))
                if consistent:
                    f.seek(i * piece_size)
                    digests[i] = hashlib.sha256(f.read(min(piece_size, rec.size - i * piece_size))).hexdigest()
        f = {"size": rec.size, "ino": rec.src[1], "mtime_ns": rec.src[2], "ctime_ns": rec.src[3], "mode": 0o644}
        board.add(rec.path, f, rec.header_sha256, None if consistent else rec.sha256, digests, held=True, done=True)
    board.write()
    return where


def board_copy(src, files, where, piece_size):
    """A peer's partial build of ``files`` (the source listing's dicts, ``path`` as ``os.fsdecode`` gives it) from
    ``src``: ``<where>.partial`` holds a copy of each and a board listing every piece held with its digest, under the
    names given (no marker: a name need not be one the marker can record). Returns ``where``, for :class:`FakePeer`."""
    partial = where + ".partial"
    os.makedirs(partial)
    board = _stage_peer.Board(partial, piece_size)
    for f in files:
        with open(os.path.join(src, f["path"]), "rb") as fin:
            data = fin.read()
        with open(os.path.join(partial, f["path"]), "wb") as fout:
            fout.write(data)
        digests = [hashlib.sha256(data[i:i + piece_size]).hexdigest() for i in range(0, len(data), piece_size)]
        board.add(f["path"], f, None, hashlib.sha256(data).hexdigest(), digests, held=True, done=True)
    board.write()
    return where


def same_tree(a, b):
    """The regular files under ``b`` (marker aside) are exactly those of ``a``, byte for byte."""
    def sums(root):
        out = {}
        for dirpath, _dirs, files in os.walk(root):
            for fn in files:
                full = os.path.join(dirpath, fn)
                rel = os.path.relpath(full, root)
                if rel != _marker.MARKER:
                    with open(full, "rb") as f:
                        out[rel] = hashlib.sha256(f.read()).hexdigest()
        return out
    return sums(a) == sums(b)


def pick_within(receiver, seconds):
    """``receiver._pick()`` if it returns within ``seconds``, else ``"waits"`` (the receiver is then stopped and
    released again): how the fan-out tests see whether a receiver waits for a peer or takes a piece."""
    out = []
    t = threading.Thread(target=lambda: out.append(receiver._pick()), daemon=True)  # pylint: disable=protected-access
    t.start()
    t.join(seconds)
    if t.is_alive():
        receiver._stop.set()  # pylint: disable=protected-access
        t.join(5)
        receiver._stop.clear()  # pylint: disable=protected-access
        return "waits"
    return out[0]
