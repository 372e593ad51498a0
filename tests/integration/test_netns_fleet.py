"""The network-namespace fleet harness (tests/lib/netns.py) itself: nodes Ansible reaches over SSH, links shaped
to the rate asked for, and nothing left behind (also by a run that was killed).

Skips, naming the reason, only where network namespaces cannot be made (no root, no ``ip netns``, no sshd).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from ansible_collections.llmops.serving.tests.lib import netns

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ANSIBLE = os.path.join(os.path.dirname(sys.executable), "ansible")

_REASON = netns.unavailable()
pytestmark = pytest.mark.skipif(_REASON is not None, reason="network namespaces unavailable: %s" % _REASON)

RECEIVER = r"""
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1)
print("ready", flush=True)
c, peer = s.accept()
first = None; n = 0
while True:
    b = c.recv(1 << 20)
    if not b:
        break
    if first is None:
        first = time.monotonic(); n0 = len(b)
    n += len(b)
print(n, n0, time.monotonic() - first, flush=True)
"""

SENDER = r"""
import socket, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30)
c.sendall(b"x" * int(sys.argv[3])); c.shutdown(socket.SHUT_WR); c.recv(1); c.close()
"""


CONNECT = r"""
import socket, sys
print(socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10).recv(64).decode())
"""


def names_of(fleet):
    return set(fleet.state["namespaces"]), set(fleet.state["links"])


def contents(paths):
    """``{path: bytes}`` of each file."""
    out = {}
    for path in paths:
        with open(path, "rb") as f:
            out[path] = f.read()
    return out


def assert_gone(namespaces, links, root):
    assert not namespaces & set(netns._netns_names()), "namespaces left behind"
    assert not links & set(netns._link_names()), "links left behind"
    assert not os.path.exists(root), "fleet directory left behind"


def test_two_nodes_are_ssh_hosts_that_ansible_pings_and_teardown_removes_them(tmp_path):
    with netns.Fleet(2) as fleet:
        namespaces, links, root = names_of(fleet) + (fleet.root,)
        inv = fleet.write_inventory(str(tmp_path / "inventory.yml"))
        proc = subprocess.run([ANSIBLE, "-i", inv, "fleet", "-m", "ansible.builtin.command", "-a", "hostname"],
                              env=fleet.ansible_env(), capture_output=True, text=True, timeout=120, check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        proc = subprocess.run([ANSIBLE, "-i", inv, "fleet", "-m", "ansible.builtin.ping"],
                              env=fleet.ansible_env(), capture_output=True, text=True, timeout=120, check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert proc.stdout.count("pong") == 2, proc.stdout
        # each node is its own host: own hostname, own address, and it reaches the other node over the bridge
        for node, other in zip(fleet.nodes, reversed(fleet.nodes)):
            out = fleet.ssh(node, "hostname && ip -4 -o addr show dev eth0")
            assert out.returncode == 0, out.stderr
            assert out.stdout.split()[0] == node.name
            assert node.address + "/24" in out.stdout
            assert fleet.exec(node, ["ip", "route", "get", other.address]).stdout.split()[2] == "eth0"
            reach = fleet.exec(node, [sys.executable, "-c", CONNECT, other.address, "22"], check=False)
            assert reach.stdout.startswith("SSH"), "%s cannot reach %s:22: %s" % (node.name, other.address, reach.stderr)
        assert len({n.nvme for n in fleet.nodes}) == 2 and all(os.path.isdir(n.nvme) for n in fleet.nodes)
        # a node's sessions read none of this machine's dotfiles (root's ~/.bashrc here runs pyenv's init before
        # every command over SSH); the machine's own files stay as they are
        dotfiles = contents(f for f in netns._login_dotfiles() if os.path.isfile(f))
        for f in dotfiles:
            out = fleet.ssh(fleet.nodes[0], "wc -c < %s" % f)
            assert (out.returncode, out.stdout.strip()) == (0, "0"), (f, out.stdout, out.stderr)
        assert contents(dotfiles) == dotfiles
        sshd_pids = [n.sshd.pid for n in fleet.nodes]
    assert_gone(namespaces, links, root)
    assert contents(dotfiles) == dotfiles
    for pid in sshd_pids:
        assert netns._start_time(pid) is None or netns._zombie(pid), "sshd %d still runs" % pid


def test_peer_link_is_shaped_to_the_rate(tmp_path):
    rate_mbit = 80
    total = 10 * 1000 * 1000  # 1 s at 80 Mbit/s
    with netns.Fleet(2, rate_mbit=rate_mbit) as fleet:
        a, b = fleet.nodes
        before = {"a": fleet.link_counters(a), "b": fleet.link_counters(b)}
        recv = fleet.popen(b, [sys.executable, "-c", RECEIVER, b.address, "5901"], stdout=subprocess.PIPE, text=True)
        try:
            assert recv.stdout.readline().strip() == "ready"
            fleet.exec(a, [sys.executable, "-c", SENDER, b.address, "5901", str(total)], timeout=60)
            got, first, seconds = recv.stdout.readline().split()
        finally:
            recv.kill()
            recv.wait()
        assert int(got) == total
        mbit = (int(got) - int(first)) * 8 / 1e6 / float(seconds)
        # the shaper holds the rate (small slack for the token bucket's burst); the floor only proves that the
        # machine was not so loaded that the measurement says nothing
        assert 0.5 * rate_mbit <= mbit <= 1.15 * rate_mbit, "measured %.1f Mbit/s on a %d Mbit/s link" % (mbit, rate_mbit)
        # the shapers' own counters (what fanout_bench reports per link) saw the bytes on a's uplink and b's downlink,
        # and not the other way round (b only acknowledged)
        after = {"a": fleet.link_counters(a), "b": fleet.link_counters(b)}
        up_a = after["a"]["up"]["bytes"] - before["a"]["up"]["bytes"]
        down_b = after["b"]["down"]["bytes"] - before["b"]["down"]["bytes"]
        assert total <= up_a <= 1.2 * total and total <= down_b <= 1.2 * total, (up_a, down_b)
        assert after["b"]["up"]["bytes"] - before["b"]["up"]["bytes"] < 0.2 * total
        assert after["a"]["down"]["bytes"] - before["a"]["down"]["bytes"] < 0.2 * total


KILLED_OWNER = r"""
import json, sys, time
from ansible_collections.llmops.serving.tests.lib import netns
f = netns.Fleet(1).__enter__()
print(json.dumps({"namespaces": f.state["namespaces"], "links": f.state["links"], "root": f.root,
                  "sshd": f.nodes[0].sshd.pid}), flush=True)
time.sleep(600)
"""


def test_fleet_of_a_killed_run_is_removed_by_the_next_one():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p.endswith("pycoll")))
    owner = subprocess.Popen([sys.executable, "-c", KILLED_OWNER], stdout=subprocess.PIPE, text=True, env=env)
    try:
        left = json.loads(owner.stdout.readline())
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    assert set(left["namespaces"]) <= set(netns._netns_names())
    assert netns._start_time(left["sshd"]) is not None, "the killed run's sshd should outlive it"
    with netns.Fleet(1) as fleet:
        # the new fleet's start removed the old one (its sshd included) before building its own
        assert netns._start_time(left["sshd"]) is None or netns._zombie(left["sshd"]), "the killed run's sshd still runs"
        assert fleet.nodes[0].sshd.pid != left["sshd"]
        assert fleet.ssh(fleet.nodes[0], "true").returncode == 0
    assert_gone(set(left["namespaces"]), set(left["links"]), left["root"])
