"""Peer fan-out through the model_stage role, for real: several inventory hosts on one machine
(``ansible_connection: local``, loopback addresses 127.0.0.2-5, a destination root each), one seed reading the
shared directory, the others pulling pieces from it and from each other over the piece servers.

What a user relies on: every host ends byte-identical to the revision; the shared filesystem serves about one
copy; a peer handing out corrupted pieces is caught and the pieces fetched elsewhere; a peer killed in the middle
does not fail the play; the servers want the run's token and are gone after the play.
"""
from __future__ import annotations

import hashlib
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_marker as _marker
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_peer
from ansible_collections.llmops.serving.tests.lib import stage_synth

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PIECE = 1024 * 1024
TOTAL = 24 * 1024 * 1024
PLAYBOOK = """
- hosts: fleet
  gather_facts: false
  roles:
    - role: llmops.serving.model_stage
"""


def _free_port():
    s = socket.socket()
    s.bind(("127.0.0.2", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture(scope="module")
def collections(tmp_path_factory):
    tree = tmp_path_factory.mktemp("fanout-coll")
    os.makedirs(str(tree / "ansible_collections" / "llmops"))
    os.symlink(ROOT, str(tree / "ansible_collections" / "llmops" / "serving"))
    return str(tree)


@pytest.fixture(scope="module")
def revision(tmp_path_factory):
    shared = tmp_path_factory.mktemp("fanout-shared")
    src = str(shared / "synth" / "r1")
    stage_synth.write_checkpoint(src, TOTAL, shards=4, seed=11)
    sums = dict((name, digest) for digest, name in
                (line.split() for line in open(os.path.join(src, "SHA256SUMS"))))
    return {"shared": str(shared), "src": src, "sums": sums}


def _addr(hosts, host):
    return "127.0.0.%d" % (hosts.index(host) + 2)


def _inventory(tmp_path, hosts, port):
    lines = ["fleet:", "  hosts:"]
    for i, name in enumerate(hosts):
        if name == "dead":  # nothing answers there: unreachable at the play's first connection
            lines += ["    dead:", "      ansible_host: 127.0.0.%d" % (i + 2), "      ansible_connection: ssh",
                      "      ansible_port: 1", "      ansible_ssh_common_args: -o ConnectTimeout=3"]
        else:
            lines += ["    %s:" % name, "      ansible_host: 127.0.0.%d" % (i + 2), "      ansible_connection: local"]
        lines += ["      ansible_python_interpreter: %s" % sys.executable,
                  "      model_stage_dest_root: %s" % (tmp_path / name / "nvme"),
                  "      model_stage_progress_dir: %s" % (tmp_path / name / "progress"),
                  "      model_stage_fanout_state_dir: %s" % (tmp_path / name / "peer")]
    path = tmp_path / "inventory.yml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _start_play(tmp_path, collections, revision, hosts, **extra):
    port = _free_port()
    inv = _inventory(tmp_path, hosts, port)
    book = tmp_path / "play.yml"
    book.write_text(PLAYBOOK)
    role_vars = dict({
        "model_stage_src_root": revision["shared"], "model_stage_models": [{"name": "synth", "revision": "r1"}],
        "model_stage_verify": "sha256", "model_stage_fsync": False, "model_stage_poll_interval": 1,
        "model_stage_fleet_slots_dir": os.path.join(revision["shared"], ".slots-%s" % tmp_path.name),
        "model_stage_fleet_read_streams": 4, "model_stage_read_streams": 2, "model_stage_keep_revisions": 0,
        "model_stage_fanout": True, "model_stage_fanout_port": port, "model_stage_fanout_piece_size": PIECE,
        "model_stage_fanout_summary_file": str(tmp_path / "summary.json"),
    }, **extra)
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=collections, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0",
               ANSIBLE_ASYNC_DIR=str(tmp_path / "async"), ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-tmp"),
               ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_FORKS="8")
    cmd = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), str(book), "-i", inv, "-v",
           "-e", json.dumps(role_vars)]
    proc = subprocess.Popen(cmd, cwd=str(tmp_path), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    return proc, port


def _finish(proc, timeout=420):
    out, _err = proc.communicate(timeout=timeout)
    return proc.returncode, out


def _dest(tmp_path, host):
    return str(tmp_path / host / "nvme" / "synth" / "r1")


def _assert_identical(revision, dest):
    names = sorted(n for n in os.listdir(dest) if n != _marker.MARKER)
    assert names == sorted(os.listdir(revision["src"]))
    for name in names:
        if name == "SHA256SUMS":
            continue
        with open(os.path.join(dest, name), "rb") as f:
            assert hashlib.sha256(f.read()).hexdigest() == revision["sums"][name], (dest, name)


def _summary(tmp_path):
    with open(str(tmp_path / "summary.json")) as f:
        return json.load(f)


def _no_token_shown(out):
    # the token is 43 letters and digits; it must not appear next to any key naming it
    assert not re.search(r"token\W{1,6}[A-Za-z0-9]{43}", out)
    assert "Bearer " not in out


def _servers_gone(tmp_path, hosts, port):
    for host in hosts:
        if host == "dead":
            continue
        assert _stage_peer.running(str(tmp_path / host / "peer"), _addr(hosts, host), port) is None
        with pytest.raises(OSError):
            socket.create_connection((_addr(hosts, host), port), timeout=2).close()


def _liar_board(tmp_path, revision, host):
    """``host``'s build directory as a broken node would leave it: every piece marked verified, every piece
    with one byte flipped on disk."""
    partial = _dest(tmp_path, host) + ".partial"
    os.makedirs(partial)
    board = _stage_peer.Board(partial, PIECE)
    for name in os.listdir(revision["src"]):
        data = bytearray(open(os.path.join(revision["src"], name), "rb").read())
        digests = [hashlib.sha256(bytes(data[i:i + PIECE])).hexdigest() for i in range(0, len(data), PIECE)]
        for i in range(0, len(data), PIECE):
            data[i + min(7, len(data) - i - 1)] ^= 0x5A
        with open(os.path.join(partial, name), "wb") as f:
            f.write(bytes(data))
        st = os.stat(os.path.join(revision["src"], name))
        fdict = {"size": st.st_size, "ino": st.st_ino, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns}
        board.add(name, fdict, None, None, digests, held=True, done=True)
    board.write()
    return partial


def _hold_lock(path, release):
    """Hold ``path``'s flock (a run of another stager) until ``release`` is set."""
    import fcntl
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    held = threading.Event()

    def wait():
        held.set()
        release.wait(300)
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    t = threading.Thread(target=wait, daemon=True)
    t.start()
    held.wait()
    return t


def test_fleet_is_byte_identical_shared_fs_serves_one_copy_and_a_lying_peer_is_caught(tmp_path, collections,
                                                                                      revision):
    hosts = ["n1", "n2", "n3", "liar"]
    # the liar's own staging waits on its lock while its server hands out corrupted pieces it claims verified
    _liar_board(tmp_path, revision, "liar")
    release = threading.Event()
    _hold_lock(_dest(tmp_path, "liar") + ".lock", release)
    proc, port = _start_play(tmp_path, collections, revision, hosts, model_stage_fanout_rate_limit=16 << 20)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            if all(os.path.isfile(os.path.join(_dest(tmp_path, h), _marker.MARKER)) for h in hosts[:3]):
                break
            time.sleep(0.2)
    finally:
        release.set()
    rc, out = _finish(proc)
    assert rc == 0, out[-5000:]
    for host in hosts:
        _assert_identical(revision, _dest(tmp_path, host))
    summary = _summary(tmp_path)
    rev = summary["revisions"][0]
    total = rev["bytes_total"]
    assert rev["hosts"] == 4 and not summary["hosts_without_report"]
    # the seed read the revision once; the fleet read at most a few pieces more from the shared directory
    by_host = dict((h["host"], h) for h in summary["hosts"])
    assert by_host["n1"]["seed"] and by_host["n1"]["bytes_from_source"] == total
    assert total <= rev["bytes_from_source"] <= 1.05 * total, summary
    assert rev["bytes_from_peers"] >= 2.9 * total
    assert sum(h["bad_pieces_rejected"] for h in summary["hosts"]) >= 1, summary
    dropped = [d for h in summary["hosts"] for d in h["peers_dropped"]]
    assert dropped and all("bad piece" in d["reason"] for d in dropped if ".5:" in d["url"]), dropped
    _no_token_shown(out)
    _servers_gone(tmp_path, hosts, port)


def test_a_peer_killed_mid_transfer_and_an_unreachable_host_do_not_fail_the_others(tmp_path, collections, revision):
    # "dead" comes first in the inventory: it would be the seed if seeds were chosen before it was found out
    hosts = ["dead", "n1", "n2", "n3"]
    # slow enough (4 MiB/s per stream) that the seed's server dies while the others still need pieces
    proc, port = _start_play(tmp_path, collections, revision, hosts, model_stage_read_rate_limit=4 << 20,
                             model_stage_fanout_rate_limit=4 << 20)
    killed = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None and killed is None:
        rec = _stage_peer.running(str(tmp_path / "n1" / "peer"), _addr(hosts, "n1"), port)
        partial = _dest(tmp_path, "n2") + ".partial"
        if rec and os.path.isfile(os.path.join(partial, _stage_peer.BOARD)):
            board = json.load(open(os.path.join(partial, _stage_peer.BOARD)))
            if any(any(e["digests"]) for e in board["files"].values()):
                os.kill(rec["pid"], signal.SIGKILL)
                killed = rec["pid"]
        time.sleep(0.05)
    rc, out = _finish(proc)
    assert killed, "the seed's server was never seen serving: " + out[-3000:]
    assert rc == 4, out[-5000:]  # 4: a host was unreachable; nothing failed
    assert re.search(r"dead\s*:.*unreachable=1", out) and not re.search(r"n\d\s*:.*failed=[1-9]", out), out[-3000:]
    for host in hosts[1:]:
        _assert_identical(revision, _dest(tmp_path, host))
    summary = _summary(tmp_path)
    assert summary["hosts_without_report"] == ["dead"]
    assert [h["host"] for h in summary["hosts"] if h["seed"]] == ["n1"]
    dropped = [d["url"] for h in summary["hosts"] for d in h["peers_dropped"]]
    assert any(_addr(hosts, "n1") in u for u in dropped), summary
    _servers_gone(tmp_path, hosts, port)


def test_the_piece_server_wants_the_token(tmp_path, collections, revision):
    """model_stage_peer as the role runs it: a daemon that outlives the task, 403 without the token."""
    dest = _dest(tmp_path, "n1")
    from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage
    _stage.stage(revision["src"], dest, record_pieces=True, piece_size=PIECE)
    port = _free_port()
    token = "a-token-of-this-run-0123456789abcdef"
    # the server is given only the token's digest (receivers alone get the token)
    args = {"address": "127.0.0.2", "port": port, "token_sha256": hashlib.sha256(token.encode()).hexdigest(),
            "piece_size": PIECE,
            "state_dir": str(tmp_path / "peer"), "lifetime": 120,
            "revisions": [{"name": "synth", "revision": "r1", "dest": dest}]}
    module = os.path.join(ROOT, "plugins", "modules", "model_stage_peer.py")

    def run(a):
        path = tmp_path / "args.json"
        path.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": a}))
        env = dict(os.environ, PYTHONPATH=collections)
        p = subprocess.run([sys.executable, module, str(path)], capture_output=True, text=True, env=env,
                           timeout=60, check=False)
        return json.loads(p.stdout[p.stdout.index("{"):])

    assert "token_sha256" in run(dict(args, token_sha256=token))["msg"]  # the token itself is refused
    r = run(args)
    assert r["changed"] and r["pid"] and token not in json.dumps(r)
    assert args["token_sha256"] not in json.dumps(r)
    try:
        assert not run(args)["changed"]  # same configuration: left running
        with open("/proc/%d/cmdline" % r["pid"], "rb") as f:
            assert token.encode() not in f.read()
        with open("/proc/%d/environ" % r["pid"], "rb") as f:
            assert token.encode() not in f.read()

        def get(path, tok):
            c = http.client.HTTPConnection("127.0.0.2", port, timeout=10)
            c.request("GET", path, headers={"Authorization": "Bearer " + tok} if tok else {})
            resp = c.getresponse()
            body = resp.read()
            c.close()
            return resp.status, body
        assert get("/r/synth/r1/pieces", None)[0] == 403
        assert get("/r/synth/r1/pieces", "wrong-" + token)[0] == 403
        status, body = get("/r/synth/r1/pieces", token)
        assert status == 200 and json.loads(body)["state"] == "complete"
    finally:
        stopped = run(dict(args, state="stopped"))
    assert stopped["changed"] and stopped["pid"] == r["pid"]
    assert _stage_peer.running(str(tmp_path / "peer"), "127.0.0.2", port) is None
    assert not run(dict(args, state="stopped"))["changed"]
