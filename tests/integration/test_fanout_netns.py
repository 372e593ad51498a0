"""Peer fan-out over SSH between real network hosts: N=3 namespaces of tests/lib/netns.py, each with its own
sshd, address, "NVMe" directory and tc-shaped link, the shared filesystem a loop device whose reads are counted
at the block device. Ansible reaches the nodes as remote hosts, so the piece servers listen on the nodes'
data-plane addresses and the receivers cross the bridge to reach them.

Two plays run at the same time, on two fleets:

* A: node1 seeds, node2 receives, node3 is a lying peer (its build directory claims every piece verified, every
  piece has a flipped byte; its own staging waits on its lock until the others are done). Every node ends
  byte-identical to the revision, the shared filesystem serves about one copy, the lie is caught and the
  pieces fetched elsewhere, and the piece servers answer 403 to requests without the run's token.
* B: node1's piece server is killed (SIGKILL) while the others still pull from it; the play does not fail and
  every copy is byte-identical.

Skips, naming the reason, only where network namespaces cannot be made.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import http.client
import json
import os
import re
import signal
import threading
import time

import pytest

from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_marker as _marker
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_peer
from ansible_collections.llmops.serving.tests.lib import netns
from ansible_collections.llmops.serving.tests.lib import stage_synth

_REASON = netns.unavailable()
pytestmark = pytest.mark.skipif(_REASON is not None, reason="network namespaces unavailable: %s" % _REASON)

PIECE = 1024 * 1024
TOTAL = 24 * 1024 * 1024
PORT = 18790
# the collection tree the plays use (default: this working tree)
COLLECTIONS = os.environ.get("LLMOPS_NETNS_COLLECTIONS") or None
MODEL, REV = "synth", "r1"


def _group_vars(fleet, **extra):
    return dict({
        "model_stage_src_root": fleet.shared, "model_stage_models": [{"name": MODEL, "revision": REV}],
        "model_stage_verify": "sha256", "model_stage_poll_interval": 1, "model_stage_keep_revisions": 0,
        "model_stage_fleet_slots_dir": os.path.join(fleet.root, "slots"), "model_stage_fleet_read_streams": 4,
        "model_stage_read_streams": 2, "model_stage_fanout": True, "model_stage_fanout_port": PORT,
        "model_stage_fanout_piece_size": PIECE,
        "model_stage_fanout_summary_file": os.path.join(fleet.root, "summary.json"),
    }, **extra)


def _dest(node):
    return os.path.join(node.nvme, MODEL, REV)


def _write_revision(fleet):
    src = os.path.join(fleet.shared, MODEL, REV)
    stage_synth.write_checkpoint(src, TOTAL, shards=4, seed=23)
    with open(os.path.join(src, "SHA256SUMS")) as f:
        sums = dict((name, digest) for digest, name in (line.split() for line in f))
    fleet.remount_shared()  # cold page cache: what the nodes read is counted at the device
    return src, sums


def _liar_board(src, node):
    """The node's build directory as a broken node would leave it: every piece marked verified, every piece
    with one byte flipped on disk."""
    partial = _dest(node) + ".partial"
    os.makedirs(partial)
    board = _stage_peer.Board(partial, PIECE)
    for name in os.listdir(src):
        with open(os.path.join(src, name), "rb") as f:
            data = bytearray(f.read())
        digests = [hashlib.sha256(bytes(data[i:i + PIECE])).hexdigest() for i in range(0, len(data), PIECE)]
        for i in range(0, len(data), PIECE):
            data[i + min(7, len(data) - i - 1)] ^= 0x5A
        with open(os.path.join(partial, name), "wb") as f:
            f.write(bytes(data))
        st = os.stat(os.path.join(src, name))
        fdict = {"size": st.st_size, "ino": st.st_ino, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns}
        board.add(name, fdict, None, None, digests, held=True, done=True)
    board.write()


def _probe(address, token=None):
    """Status of a piece request to ``address`` (None while nothing listens)."""
    headers = {"Range": "bytes=0-4095"}
    if token is not None:
        headers["Authorization"] = "Bearer " + token
    try:
        conn = http.client.HTTPConnection(address, PORT, timeout=5)
        conn.request("GET", "/r/%s/%s/files/model-00001-of-00004.safetensors" % (MODEL, REV), headers=headers)
        status = conn.getresponse().status
        conn.close()
        return status
    except OSError:
        return None


def _scenario_liar(fleet, out):
    a, b, liar = fleet.nodes
    src, out["sums"] = _write_revision(fleet)
    out["src"] = src
    out["liar_url"] = "http://%s:%d/" % (liar.address, PORT)
    _liar_board(src, liar)
    os.makedirs(os.path.dirname(_dest(liar)), exist_ok=True)
    lock = os.open(_dest(liar) + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(lock, fcntl.LOCK_EX)  # another stager holds the liar's dest: its own copy waits
    done = threading.Event()
    statuses = {"none": set(), "wrong": set()}

    def watch():
        released = False
        while not done.is_set():
            for key, tok in (("none", None), ("wrong", "x" * 43)):
                st = _probe(a.address, tok)
                if st is not None:
                    statuses[key].add(st)
            if not released and all(os.path.isfile(os.path.join(_dest(n), _marker.MARKER)) for n in (a, b)):
                fcntl.flock(lock, fcntl.LOCK_UN)
                released = True
            time.sleep(0.2)
        if not released:
            fcntl.flock(lock, fcntl.LOCK_UN)

    t = threading.Thread(target=watch, daemon=True)
    before = fleet.shared_read_bytes()
    t.start()
    try:
        out["play"] = netns.run_stage_play(fleet, fleet.nodes, _group_vars(fleet, model_stage_fanout_rate_limit=16 << 20),
                                           timeout=400, tag="liar", collections=COLLECTIONS)
    finally:
        done.set()
        t.join(10)
        os.close(lock)
    out["shared_bytes"] = fleet.shared_read_bytes() - before
    out["statuses"] = statuses
    out["listening_after"] = [_probe(n.address) for n in fleet.nodes]
    out["dests"] = [_dest(n) for n in fleet.nodes]
    with open(os.path.join(fleet.root, "summary.json")) as f:
        out["summary"] = json.load(f)


def _scenario_kill(fleet, out):
    seed, b, c = fleet.nodes
    src, out["sums"] = _write_revision(fleet)
    out["src"] = src
    killed = []
    done = threading.Event()

    def watch():
        while not done.is_set() and not killed:
            rec = _stage_peer.running(os.path.join(seed.dir, "peer"), seed.address, PORT)
            board = os.path.join(_dest(b) + ".partial", _stage_peer.BOARD)
            try:
                with open(board) as f:
                    files = json.load(f)["files"]
            except (OSError, ValueError, KeyError):
                files = {}
            held = sum(len([d for d in (e.get("digests") or []) if d]) for e in files.values())
            if rec and held >= 2:  # node2 holds pieces from the seed, and needs more
                os.kill(rec["pid"], signal.SIGKILL)
                killed.append(rec["pid"])
            time.sleep(0.05)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    try:
        out["play"] = netns.run_stage_play(fleet, fleet.nodes, _group_vars(fleet, model_stage_fanout_rate_limit=4 << 20),
                                           timeout=400, tag="kill", collections=COLLECTIONS)
    finally:
        done.set()
        t.join(10)
    out["killed"] = killed
    out["dests"] = [_dest(n) for n in fleet.nodes]
    out["seed_url"] = "http://%s:%d/" % (seed.address, PORT)
    with open(os.path.join(fleet.root, "summary.json")) as f:
        out["summary"] = json.load(f)


@pytest.fixture(scope="module")
def plays():
    """Both scenarios at once (each on its own fleet of 3): Ansible's per-task cost dominates on a small machine."""
    results = {"liar": {}, "kill": {}}
    with contextlib.ExitStack() as stack:
        fleets = {}
        for name, rate in (("liar", 100), ("kill", 50)):
            fleets[name] = stack.enter_context(netns.Fleet(3, rate_mbit=rate, shared_device_mib=96,
                                                           shared_read_mbit=rate))

        def run(name, fn):
            try:
                fn(fleets[name], results[name])
            except Exception as e:  # pylint: disable=broad-except  # raised by the tests that need this scenario
                results[name]["error"] = e

        threads = [threading.Thread(target=run, args=("liar", _scenario_liar)),
                   threading.Thread(target=run, args=("kill", _scenario_kill))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        yield results


def _ok(res):
    if "error" in res:
        raise res["error"]
    play = res["play"]
    assert play["rc"] == 0, play["output"][-5000:]
    assert not re.search(r"node\d\s*:.*failed=[1-9]", play["output"]), play["output"][-3000:]
    return play


def _assert_identical(res):
    for dest in res["dests"]:
        names = sorted(n for n in os.listdir(dest) if n != _marker.MARKER)
        assert names == sorted(os.listdir(res["src"])), dest
        for name, digest in res["sums"].items():
            with open(os.path.join(dest, name), "rb") as f:
                assert hashlib.sha256(f.read()).hexdigest() == digest, (dest, name)


def test_every_node_is_byte_identical_and_the_shared_fs_serves_one_copy(plays):
    res = plays["liar"]
    _ok(res)
    _assert_identical(res)
    rev = res["summary"]["revisions"][0]
    total = rev["bytes_total"]
    assert rev["hosts"] == 3 and not res["summary"]["hosts_without_report"]
    by_host = dict((h["host"], h) for h in res["summary"]["hosts"])
    assert by_host["node1"]["seed"] and by_host["node1"]["bytes_from_source"] == total
    # what the module counts, and what the shared filesystem's block device saw (headers and readahead of the
    # receivers' identity checks are the slack)
    assert total <= rev["bytes_from_source"] <= 1.05 * total, res["summary"]
    assert total <= res["shared_bytes"] <= 1.15 * total, (res["shared_bytes"], total)
    assert rev["bytes_from_peers"] >= 1.9 * total


def test_a_peer_serving_corrupted_pieces_is_caught_and_the_pieces_refetched(plays):
    res = plays["liar"]
    _ok(res)
    hosts = res["summary"]["hosts"]
    assert sum(h["bad_pieces_rejected"] for h in hosts) >= 1, hosts
    dropped = [d for h in hosts for d in h["peers_dropped"]]
    assert any(d["url"].startswith(res["liar_url"]) and "bad piece" in d["reason"] for d in dropped), dropped
    # the refetched pieces are right: node2's copy (and the liar's own, staged once its lock was free) match
    _assert_identical(res)


def test_piece_servers_refuse_requests_without_the_token_and_stop_with_the_play(plays):
    res = plays["liar"]
    play = _ok(res)
    assert res["statuses"]["none"] == {403}, res["statuses"]
    assert res["statuses"]["wrong"] == {403}, res["statuses"]
    assert res["listening_after"] == [None, None, None]
    # the run's token (43 letters and digits) is never printed
    assert not re.search(r"token\W{1,6}[A-Za-z0-9]{43}", play["output"])
    assert "Bearer " not in play["output"]


def test_a_peer_killed_mid_transfer_does_not_fail_the_play(plays):
    res = plays["kill"]
    _ok(res)
    assert res["killed"], "the seed's piece server was never seen serving: " + res["play"]["output"][-3000:]
    _assert_identical(res)
    dropped = [d["url"] for h in res["summary"]["hosts"] for d in h["peers_dropped"]]
    assert any(u.startswith(res["seed_url"]) for u in dropped), res["summary"]
