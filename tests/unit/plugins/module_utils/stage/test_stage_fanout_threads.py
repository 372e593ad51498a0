"""No thread of a fan-out run dies silently: whatever the poll of a peer or a pulling worker raises ends the run
with that error (``Receiver._spawn``), never a dead thread and a receiver waiting for what it would have brought.
A file name that is not UTF-8, should one reach the receiver, travels on the wire byte for byte
(``_stage_fanout_wire.name_to_url``); the rules are kept by scans of the fan-out's source."""
from __future__ import annotations

import ast
import os

import pytest

from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_fanout
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_fanout_wire
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_verify
from ansible_collections.llmops.serving.plugins.module_utils.stage._stage_marker import StageError
from ansible_collections.llmops.serving.tests.lib import fake_peers
from ansible_collections.llmops.serving.tests.lib.no_hang import no_hang

PIECE = 64 * 1024
ROOT = os.path.dirname(os.path.abspath(__file__))
for _i in range(5):
    ROOT = os.path.dirname(ROOT)
STAGE = os.path.join(ROOT, "plugins", "module_utils", "stage")
NAME = os.fsdecode(b"caf\xe9-\xff.bin")  # Latin-1 bytes: not UTF-8


class _Progress(object):
    def add(self, n=0, files=0):
        pass


def _source(tmp_path, names):
    src = tmp_path / "shared" / "m" / "r1"
    src.mkdir(parents=True)
    files = []
    for k, name in enumerate(names):
        path = os.path.join(str(src), name)
        with open(path, "wb") as f:
            f.write(os.urandom(3 * PIECE + 17 * (k + 1)))
        st = os.lstat(path)
        files.append({"path": name, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns,
                      "dev": st.st_dev, "ino": st.st_ino, "mode": st.st_mode & 0o777})
    return str(src), files


def _receiver(src, tmp_path, peers, **kw):
    partial = str(tmp_path / "n1" / "m" / "r1.partial")
    os.makedirs(partial)
    return _stage_fanout.Receiver(src, partial, "size", _stage_verify.SourceContent({}, {}, None), peers,
                                  fake_peers.TOKEN, PIECE, 1, None, _Progress(), False, timeout=2.0, **kw), partial


def test_a_name_that_is_not_utf8_travels_from_a_seed_byte_for_byte(tmp_path):
    src, files = _source(tmp_path, [NAME, "plain.bin"])
    seed = fake_peers.FakePeer(fake_peers.board_copy(src, files, str(tmp_path / "seed" / "m" / "r1"), PIECE), PIECE)
    try:
        rx, partial = _receiver(src, tmp_path, [{"url": seed.url, "seed": True}])
        box = no_hang(lambda: rx.run(files), timeout=20)  # before: the poll thread died, the receiver waited on
    finally:
        seed.close()
    assert "error" not in box, box
    assert rx.bytes_from_source == 0 and rx.bytes_from_peers == sum(f["size"] for f in files)
    for f in files:
        with open(os.path.join(src, f["path"]), "rb") as a, open(os.path.join(partial, f["path"]), "rb") as b:
            assert a.read() == b.read()


def test_names_on_the_wire_are_their_bytes_percent_encoded():
    for name in (NAME, "a b/c+d&e=f?#%.bin", "\u00e9t\u00e9/x.bin"):
        url = _stage_fanout_wire.name_to_url(name)
        assert url.isascii() and " " not in url and "?" not in url and "&" not in url
        assert _stage_fanout_wire.name_from_url(url) == name
        assert os.fsencode(_stage_fanout_wire.name_from_url(url)) == os.fsencode(name)


def test_a_poll_thread_that_fails_ends_the_run_with_its_error(tmp_path, monkeypatch):
    src, files = _source(tmp_path, ["a.bin"])
    seed = fake_peers.FakePeer(fake_peers.board_copy(src, files, str(tmp_path / "seed" / "m" / "r1"), PIECE), PIECE)

    def broken(*_args, **_kw):
        raise RuntimeError("a defect in the parser")
    monkeypatch.setattr(_stage_fanout, "parse_piece_list", broken)
    try:
        rx, _partial = _receiver(src, tmp_path, [{"url": seed.url, "seed": True}])  # seed_wait: 120 s by default
        box = no_hang(lambda: rx.run(files), timeout=10)
    finally:
        seed.close()
    e = box.get("error")
    assert isinstance(e, StageError) and e.reason == "thread_failed", box
    assert "poll of %s" % seed.url in str(e) and "RuntimeError: a defect in the parser" in str(e)


def test_a_worker_that_fails_ends_the_run_with_a_named_error(tmp_path, monkeypatch):
    src, files = _source(tmp_path, ["a.bin"])

    def broken(*_args, **_kw):
        raise KeyError("defect")
    monkeypatch.setattr(_stage_fanout.Receiver, "_from_source", broken)
    rx, _partial = _receiver(src, tmp_path, [])
    box = no_hang(lambda: rx.run(files), timeout=10)
    e = box.get("error")
    assert isinstance(e, StageError) and e.reason == "thread_failed" and "pull " in str(e), box


def test_a_stage_error_in_a_thread_is_the_runs_error_as_it_is(tmp_path, monkeypatch):
    src, files = _source(tmp_path, ["a.bin"])

    def refused(*_args, **_kw):
        raise StageError("src: changed while it was staged", reason="changed")
    monkeypatch.setattr(_stage_fanout.Receiver, "_from_source", refused)
    rx, _partial = _receiver(src, tmp_path, [])
    box = no_hang(lambda: rx.run(files), timeout=10)
    assert isinstance(box.get("error"), StageError) and box["error"].reason == "changed", box


# ---- the rules cannot be bypassed -------------------------------------------------------------------------
def _fanout_sources():
    return sorted(os.path.join(STAGE, n) for n in os.listdir(STAGE)
                  if n.startswith(("_stage_fanout", "_stage_peer")) and n.endswith(".py"))


def _calls(path):
    """``(qualified function name, call name, node)`` of every call in ``path``."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    out = []

    def walk(node, scope):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.ClassDef)):
                walk(child, scope + [child.name])
                continue
            if isinstance(child, ast.Call):
                fn = child.func
                name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", None)
                out.append((".".join(scope), name, child))
            walk(child, scope)
    walk(tree, [])
    return out


#: file -> functions that may start a thread of a receiver's run: only the one whose death ends the run, and the
#: process's one deadline thread (it serves every request's whole-answer deadline, holds no state of a run, and
#: catches what firing a deadline raises; a request whose deadline did not fire still ends by its socket timeout)
THREADS_ALLOWED = {"_stage_fanout.py": {"Receiver._spawn"}, "_stage_fanout_wire.py": {"_Deadlines.add"}}


def test_every_thread_of_a_receiver_starts_through_spawn():
    bad = []
    for path in _fanout_sources():
        base = os.path.basename(path)
        if base == "_stage_peer.py":
            continue  # the server's threads serve requests; a dead one fails a request, not a receiver's wait
        for scope, name, node in _calls(path):
            if name == "Thread" and scope not in THREADS_ALLOWED.get(base, ()):
                bad.append("%s:%d %s starts a thread directly; start it with Receiver._spawn, whose thread's "
                           "death ends the run" % (base, node.lineno, scope or "<module>"))
    assert not bad, "\n".join(bad)


#: file -> functions that may percent-encode or decode a name: the wire's pair, and the URL check (a peer URL's
#: own path, not a file name)
QUOTING_ALLOWED = {"_stage_fanout_wire.py": {"name_to_url", "name_from_url", "check_peer_url"}}


def test_file_names_go_on_the_wire_only_through_name_to_url():
    bad = []
    for path in _fanout_sources():
        base = os.path.basename(path)
        for scope, name, node in _calls(path):
            if name in ("quote", "unquote", "quote_plus", "unquote_plus") and scope not in QUOTING_ALLOWED.get(base, ()):
                bad.append("%s:%d %s calls %s on a name; use _stage_fanout_wire.name_to_url / name_from_url "
                           "(a name need not be UTF-8)" % (base, node.lineno, scope, name))
            if name == "parse_qs" and not any(k.arg == "errors" for k in node.keywords):
                bad.append("%s:%d %s parses a query without errors='surrogateescape'" % (base, node.lineno, scope))
    assert not bad, "\n".join(bad)


def test_a_peers_progress_is_judged_only_by_copy_progress():
    """``moved_at`` (when a peer's copy last moved) is written only by ``CopyProgress``: no caller decides by
    another rule (a board's age, a list's length) that a seed moves."""
    bad = []
    for dirpath, _dirs, names in os.walk(os.path.join(ROOT, "plugins")):
        for n in sorted(names):
            if not n.endswith(".py"):
                continue
            path = os.path.join(dirpath, n)
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read(), path)
            for cls in [c for c in ast.walk(tree) if isinstance(c, ast.ClassDef)] + [tree]:
                if getattr(cls, "name", None) == "CopyProgress" and n == "_stage_fanout_wire.py":
                    continue
                for node in ast.walk(cls):
                    targets = node.targets if isinstance(node, ast.Assign) else (
                        [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
                    for t in targets:
                        if isinstance(t, ast.Attribute) and t.attr in ("moved_at", "copy_seen"):
                            if not _inside_copy_progress(tree, node):
                                bad.append("%s:%d sets .%s; a peer's progress is CopyProgress.note's alone"
                                           % (os.path.relpath(path, ROOT), node.lineno, t.attr))
    assert not bad, "\n".join(sorted(set(bad)))


def _inside_copy_progress(tree, node):
    for cls in ast.walk(tree):
        if isinstance(cls, ast.ClassDef) and cls.name == "CopyProgress":
            if any(n is node for n in ast.walk(cls)):
                return True
    return False


@pytest.mark.parametrize("scan", [test_every_thread_of_a_receiver_starts_through_spawn,
                                  test_file_names_go_on_the_wire_only_through_name_to_url])
def test_the_scans_see_a_violation(scan, tmp_path, monkeypatch):
    """The scans fail on a file that bypasses the rule (so a scan that sees nothing is not what passes)."""
    bad = tmp_path / "_stage_fanout_extra.py"
    bad.write_text("import threading\nfrom urllib.parse import quote\n\n\ndef go(rel):\n"
                   "    threading.Thread(target=print).start()\n    return quote(rel)\n")
    real = _fanout_sources()
    monkeypatch.setitem(globals(), "_fanout_sources", lambda: real + [str(bad)])
    with pytest.raises(AssertionError):
        scan()
