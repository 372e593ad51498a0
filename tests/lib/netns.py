# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A fleet of N simulated nodes on one machine: network namespaces that Ansible reaches over SSH as real hosts.

Each node is a network namespace (``lfo<fid>-<i>``) with its own UTS namespace (hostname ``node<i>``), one
veth link to a bridge (``br0``) in a switch namespace of its own (``lfo<fid>-sw``; node i is
10.231.<fid>.<10+i>/24) and one sshd bound to that address with a generated host key and an authorized generated
client key. The controller (this process, root namespace) is on the same bridge through one more veth
(``lfo<fid>-c``, 10.231.<fid>.1) and reaches every node at ``ansible_host`` with ``ansible_user: root``. The
bridge is not in the root namespace so that the root namespace's firewall (a FORWARD policy of DROP with
bridge netfilter, as Docker sets it) never sees the traffic between nodes.

Shaping: with ``rate_mbit`` every node's link is shaped with ``tbf`` to that rate in both directions (the
node's egress inside its namespace, and the switch side's egress towards the node), so a node sends and
receives at most ``rate_mbit`` like a full-duplex NIC; traffic between two nodes crosses both shapers.

Storage: every node gets its own "NVMe" directory (``<root>/node<i>/nvme``); the namespaces share the
filesystem, so the "shared filesystem" is one directory (``<root>/shared``) every node reads. With
``shared_device_mib`` it is an ext4 filesystem on its own loop device, and :meth:`Fleet.shared_read_bytes`
counts the bytes read from that device (an independent count of what the shared filesystem served). With
``shared_read_mbit`` as well, every process the nodes' sshd starts runs in one blkio cgroup whose reads of that
device are throttled to that rate in total: the shared filesystem is one pipe of that bandwidth for the whole
fleet, whatever the readers do (cgroup v1 ``blkio.throttle.read_bps_device``).

Teardown is a context manager: every process in the namespaces is killed (sshd and whatever the sessions
left), the namespaces (their veths and the bridge with them), the controller's veth, the loop device and the fleet directory are removed, also
after a failure. A fleet whose owner was killed is removed by :func:`cleanup_stale` (called by every new
fleet): state files live in ``/run/llmops-netns``, and names with the ``lfo<digits>-`` prefix that no live
owner claims are deleted.

Needs root, ``ip`` (iproute2) with ``ip netns``, ``tc``, ``unshare``, ``sshd`` and ``ssh-keygen``;
:func:`unavailable` says which is missing, for a clear skip.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

PREFIX = "lfo"
STATE_DIR = "/run/llmops-netns"
BASE_DIR = os.environ.get("LLMOPS_NETNS_ROOT", "/var/tmp/llmops-netns")
SUBNET = "10.231.%d"
SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
BLKIO = "/sys/fs/cgroup/blkio"
_NAME_RE = re.compile(r"^%s(\d+)-" % PREFIX)


def _login_dotfiles():
    """The files bash reads for a command sshd starts as root (``~/.bashrc``; bash's SSH_SOURCE_BASHRC) and for a
    login shell, in root's home directory (the nodes log in as root)."""
    home = os.path.expanduser("~root")
    return [os.path.join(home, name) for name in (".bashrc", ".bash_profile", ".bash_login", ".profile")]


def _run(argv, check=True, timeout=30, **kw):
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, **kw)
    if check and proc.returncode != 0:
        raise RuntimeError("%s failed (rc %d): %s" % (" ".join(argv), proc.returncode, (proc.stderr or proc.stdout).strip()))
    return proc


def unavailable():
    """None when a fleet can be built here, else the reason it cannot (for ``pytest.skip``)."""
    if os.geteuid() != 0:
        return "network namespaces need root (euid %d)" % os.geteuid()
    for tool in ("ip", "tc", "unshare", "ssh-keygen"):
        if not shutil.which(tool):
            return "%s is not installed" % tool
    if not os.access(SSHD, os.X_OK):
        return "sshd is not installed (apt-get install openssh-server)"
    probe = "%sprobe%d" % (PREFIX, os.getpid() % 100000)
    proc = _run(["ip", "netns", "add", probe], check=False)
    if proc.returncode != 0:
        return "ip netns add is not permitted here: %s" % proc.stderr.strip()
    try:
        proc = _run(["ip", "link", "add", probe[:15], "type", "bridge"], check=False)
        if proc.returncode != 0:
            return "creating a bridge is not permitted here: %s" % proc.stderr.strip()
        _run(["ip", "link", "del", probe[:15]], check=False)
    finally:
        _run(["ip", "netns", "del", probe], check=False)
    return None


def _start_time(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(state):
    pid = state.get("pid")
    return bool(pid) and _start_time(pid) is not None and _start_time(pid) == state.get("start_time")


def _netns_names():
    out = _run(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _link_names():
    out = _run(["ip", "-o", "link", "show"], check=False).stdout
    names = []
    for line in out.splitlines():
        parts = line.split(":", 2)
        if len(parts) > 1:
            names.append(parts[1].strip().split("@")[0])
    return names


def _kill_netns_pids(ns):
    out = _run(["ip", "netns", "pids", ns], check=False).stdout
    pids = [int(p) for p in out.split() if p.isdigit()]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    deadline = time.monotonic() + 5
    while pids and time.monotonic() < deadline:
        pids = [p for p in pids if _start_time(p) is not None and not _zombie(p)]
        time.sleep(0.05)


def _zombie(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _remove(state):
    """Remove everything a fleet state names (each step tolerates what is already gone)."""
    for ns in state.get("namespaces", []):
        if ns in _netns_names():
            _kill_netns_pids(ns)
            _run(["ip", "netns", "del", ns], check=False)
    links = _link_names()
    for link in state.get("links", []):
        if link in links:
            _run(["ip", "link", "del", link], check=False)
    mnt = state.get("mount")
    if mnt and os.path.ismount(mnt):
        _run(["umount", "-l", mnt], check=False)
    loop = state.get("loop")
    if loop:
        _run(["losetup", "-d", loop], check=False)
    cgroup = state.get("cgroup")
    if cgroup and os.path.isdir(cgroup):
        _rmdir_cgroup(cgroup)
    root = state.get("root")
    if root and os.path.realpath(root).startswith(os.path.realpath(BASE_DIR) + os.sep):
        shutil.rmtree(root, ignore_errors=True)


def _rmdir_cgroup(path):
    deadline = time.monotonic() + 5
    while True:
        try:
            with open(os.path.join(path, "cgroup.procs")) as f:
                for pid in f.read().split():
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except OSError:
                        pass
            os.rmdir(path)
            return
        except OSError:
            if time.monotonic() > deadline or not os.path.isdir(path):
                return
            time.sleep(0.05)


class _Lock:
    def __enter__(self):
        os.makedirs(STATE_DIR, exist_ok=True)
        self.fd = os.open(os.path.join(STATE_DIR, ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        os.close(self.fd)


def _states():
    out = {}
    if os.path.isdir(STATE_DIR):
        for name in os.listdir(STATE_DIR):
            if name.endswith(".json"):
                try:
                    with open(os.path.join(STATE_DIR, name)) as f:
                        st = json.load(f)
                    out[int(st["fid"])] = st
                except (OSError, ValueError, KeyError):
                    continue
    return out


def cleanup_stale():
    """Remove fleets whose owner process is gone, and ``lfo<n>-`` names no live fleet claims; returns their ids."""
    removed = []
    with _Lock():
        states = _states()
        live = {fid for fid, st in states.items() if _alive(st)}
        for fid, st in states.items():
            if fid not in live:
                _remove(st)
                try:
                    os.unlink(os.path.join(STATE_DIR, "%d.json" % fid))
                except OSError:
                    pass
                removed.append(fid)
        orphans = {}
        for name in _netns_names():
            m = _NAME_RE.match(name)
            if m and int(m.group(1)) not in live:
                orphans.setdefault(int(m.group(1)), {"namespaces": [], "links": []})["namespaces"].append(name)
        for name in _link_names():
            m = _NAME_RE.match(name)
            if m and int(m.group(1)) not in live:
                orphans.setdefault(int(m.group(1)), {"namespaces": [], "links": []})["links"].append(name)
        for fid, st in orphans.items():
            _remove(st)
            removed.append(fid)
        if os.path.isdir(BASE_DIR):
            for name in os.listdir(BASE_DIR):
                m = re.match(r"^%s(\d+)$" % PREFIX, name)
                if m and int(m.group(1)) not in live:
                    _remove({"root": os.path.join(BASE_DIR, name), "mount": os.path.join(BASE_DIR, name, "shared")})
        if os.path.isdir(BLKIO):
            for name in os.listdir(BLKIO):
                m = re.match(r"^%s(\d+)$" % PREFIX, name)
                if m and int(m.group(1)) not in live:
                    _rmdir_cgroup(os.path.join(BLKIO, name))
    return sorted(set(removed))


class Node:
    def __init__(self, fleet, index):
        self.index = index
        self.name = "node%d" % index
        self.ns = "%s%d-%d" % (PREFIX, fleet.fid, index)
        self.veth = "%s%d-v%d" % (PREFIX, fleet.fid, index)
        self.peer = "%s%d-p%d" % (PREFIX, fleet.fid, index)
        self.address = (SUBNET % fleet.fid) + ".%d" % (10 + index)
        self.dir = os.path.join(fleet.root, self.name)
        self.nvme = os.path.join(self.dir, "nvme")
        self.sshd = None

    def __repr__(self):
        return "<Node %s %s ns=%s>" % (self.name, self.address, self.ns)


class Fleet:
    """``with Fleet(3, rate_mbit=200) as fleet:`` — N nodes reachable over SSH; see the module docstring."""

    def __init__(self, n, rate_mbit=None, shared_device_mib=None, shared_read_mbit=None, python=None, ssh_timeout=20.0):
        if n < 1:
            raise ValueError("n must be >= 1")
        if shared_read_mbit and not shared_device_mib:
            raise ValueError("shared_read_mbit throttles the shared device: pass shared_device_mib too")
        self.shared_read_mbit = shared_read_mbit
        self.cgroup = None
        self.n = n
        self.rate_mbit = rate_mbit
        self.shared_device_mib = shared_device_mib
        self.python = python or sys.executable
        self.ssh_timeout = ssh_timeout
        self.fid = None
        self.root = None
        self.nodes = []
        self.state = None
        self.loop = None

    # ---- lifecycle ------------------------------------------------------------------------------
    def __enter__(self):
        reason = unavailable()
        if reason:
            raise RuntimeError(reason)
        cleanup_stale()
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        for node in self.nodes:
            if node.sshd and node.sshd.poll() is None:
                node.sshd.kill()
                try:
                    node.sshd.wait(5)
                except subprocess.TimeoutExpired:
                    pass
        if self.state:
            _remove(self.state)
            try:
                os.unlink(os.path.join(STATE_DIR, "%d.json" % self.fid))
            except OSError:
                pass
            self.state = None

    def _claim(self):
        with _Lock():
            taken = set(_states())
            for name in _netns_names() + _link_names():
                m = _NAME_RE.match(name)
                if m:
                    taken.add(int(m.group(1)))
            free = [f for f in range(1, 251) if f not in taken]
            if not free:
                raise RuntimeError("no free fleet id (250 fleets exist under %s)" % STATE_DIR)
            self.fid = free[0]
            self.root = os.path.join(BASE_DIR, "%s%d" % (PREFIX, self.fid))
            self.nodes = [Node(self, i) for i in range(1, self.n + 1)]
            self.switch = "%s%d-sw" % (PREFIX, self.fid)
            self.uplink = "%s%d-c" % (PREFIX, self.fid)
            self.state = {"fid": self.fid, "pid": os.getpid(), "start_time": _start_time(os.getpid()),
                          "root": self.root, "namespaces": [nd.ns for nd in self.nodes] + [self.switch],
                          "links": [nd.veth for nd in self.nodes] + [nd.peer for nd in self.nodes]
                          + [self.uplink, self.uplink + "s"],
                          "mount": os.path.join(self.root, "shared"), "loop": None, "cgroup": None}
            self._save()

    def _save(self):
        path = os.path.join(STATE_DIR, "%d.json" % self.fid)
        with open(path + ".tmp", "w") as f:
            json.dump(self.state, f)
        os.replace(path + ".tmp", path)

    def _create(self):
        self._claim()
        shutil.rmtree(self.root, ignore_errors=True)
        os.makedirs(self.root)
        self.shared = os.path.join(self.root, "shared")
        os.makedirs(self.shared)
        if self.shared_device_mib:
            self._make_shared_device()
        self.client_key = os.path.join(self.root, "client_key")
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "llmops-netns", "-f", self.client_key])
        self.control_dir = os.path.join(self.root, "cp")
        os.makedirs(self.control_dir)
        os.makedirs("/run/sshd", exist_ok=True)
        _run(["ip", "netns", "add", self.switch])
        self._sw(["ip", "link", "set", "lo", "up"])
        self._sw(["ip", "link", "add", "br0", "type", "bridge"])
        self._sw(["ip", "link", "set", "br0", "up"])
        _run(["ip", "link", "add", self.uplink, "type", "veth", "peer", "name", self.uplink + "s"])
        _run(["ip", "link", "set", self.uplink + "s", "netns", self.switch])
        self._sw(["ip", "link", "set", self.uplink + "s", "master", "br0"])
        self._sw(["ip", "link", "set", self.uplink + "s", "up"])
        _run(["ip", "addr", "add", (SUBNET % self.fid) + ".1/24", "dev", self.uplink])
        _run(["ip", "link", "set", self.uplink, "up"])
        for node in self.nodes:
            self._make_node(node)
        for node in self.nodes:
            self._wait_ssh(node)

    def _make_shared_device(self):
        image = os.path.join(self.root, "shared.img")
        with open(image, "wb") as f:
            f.truncate(self.shared_device_mib << 20)
        _run(["mkfs.ext4", "-q", "-F", "-m", "0", "-E", "lazy_itable_init=0,lazy_journal_init=0", image], timeout=120)
        self.loop = _run(["losetup", "-f", "--show", image]).stdout.strip()
        self.state["loop"] = self.loop
        self._save()
        _run(["mount", self.loop, self.shared])
        os.chmod(self.shared, 0o755)
        if self.shared_read_mbit:
            if not os.path.isfile(os.path.join(BLKIO, "blkio.throttle.read_bps_device")):
                raise RuntimeError("shared_read_mbit needs the cgroup v1 blkio controller at %s" % BLKIO)
            self.cgroup = os.path.join(BLKIO, "%s%d" % (PREFIX, self.fid))
            self.state["cgroup"] = self.cgroup
            self._save()
            os.mkdir(self.cgroup)
            self.set_shared_rate(self.shared_read_mbit)

    def _make_node(self, node):
        os.makedirs(node.nvme)
        _run(["ip", "netns", "add", node.ns])
        _run(["ip", "link", "add", node.veth, "type", "veth", "peer", "name", node.peer])
        _run(["ip", "link", "set", node.peer, "netns", node.ns])
        _run(["ip", "link", "set", node.veth, "netns", self.switch])
        self._sw(["ip", "link", "set", node.veth, "master", "br0"])
        self._sw(["ip", "link", "set", node.veth, "up"])
        self.exec(node, ["ip", "link", "set", "lo", "up"])
        self.exec(node, ["ip", "link", "set", node.peer, "name", "eth0"])
        self.exec(node, ["ip", "addr", "add", node.address + "/24", "dev", "eth0"])
        self.exec(node, ["ip", "link", "set", "eth0", "up"])
        if self.rate_mbit:
            self.set_rate(node, self.rate_mbit)
        key = os.path.join(node.dir, "ssh_host_ed25519_key")
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key])
        cfg = os.path.join(node.dir, "sshd_config")
        with open(cfg, "w") as f:
            f.write("\n".join([
                "Port 22", "ListenAddress %s" % node.address, "HostKey %s" % key,
                "AuthorizedKeysFile %s.pub" % self.client_key, "PermitRootLogin prohibit-password",
                "PubkeyAuthentication yes", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
                "UsePAM no", "StrictModes no", "UseDNS no", "PidFile %s" % os.path.join(node.dir, "sshd.pid"),
                "MaxStartups 200:30:400", "MaxSessions 100", "LogLevel ERROR",
                "Subsystem sftp internal-sftp", ""]))
        log = open(os.path.join(node.dir, "sshd.log"), "ab")
        # A node's sessions read none of this machine's dotfiles: sshd runs every command through the login shell,
        # and bash sources ~/.bashrc for a command that sshd starts, so a controller's shell setup (here pyenv's init
        # and rehash: ~60 processes, about 0.08 CPU-s at rest) ran before each of Ansible's commands on every node, which a
        # GPU node's shell does not. In the mount namespace `ip netns exec` gives the sshd (and its sessions only),
        # an empty file is bound over each dotfile that exists.
        hidden = [f for f in _login_dotfiles() if os.path.isfile(f)]
        empty = os.path.join(node.dir, "empty_dotfile")
        with open(empty, "w"):
            pass
        # own UTS namespace: each node has its own hostname (model_stage's fleet leases name the host)
        node.sshd = subprocess.Popen(
            ["ip", "netns", "exec", node.ns, "unshare", "--uts", "--", "sh", "-c",
             'hostname "$1" && d="$2" c="$3" e="$4" && shift 4 && '
             'for f in "$@"; do mount --bind "$e" "$f" || exit 1; done && exec "$d" -D -e -f "$c"',
             "sh", node.name, SSHD, cfg, empty] + hidden,
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        if self.cgroup:
            # from here: `ip netns exec` mounts its own /sys, without the cgroup tree. The pid stays the same
            # through the execs (ip -> unshare -> sh -> sshd), and sshd forks only for connections, which come
            # after _wait_ssh.
            with open(os.path.join(self.cgroup, "cgroup.procs"), "w") as f:
                f.write("%d\n" % node.sshd.pid)

    def _wait_ssh(self, node):
        deadline = time.monotonic() + self.ssh_timeout
        while True:
            if node.sshd.poll() is not None:
                with open(os.path.join(node.dir, "sshd.log"), "rb") as f:
                    log = f.read().decode("utf-8", "replace")[-2000:]
                raise RuntimeError("sshd of %s exited (rc %s): %s" % (node.name, node.sshd.returncode, log))
            try:
                with socket.create_connection((node.address, 22), timeout=1) as s:
                    if s.recv(4).startswith(b"SSH"):
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("sshd of %s did not answer on %s:22 within %.0f s"
                                   % (node.name, node.address, self.ssh_timeout))
            time.sleep(0.1)

    def _sw(self, argv):
        return _run(["ip", "netns", "exec", self.switch] + list(argv))

    # ---- using the fleet ------------------------------------------------------------------------
    def exec(self, node, argv, check=True, timeout=60, **kw):
        """Run ``argv`` inside the node's network namespace (subprocess.run; text output)."""
        return _run(["ip", "netns", "exec", node.ns] + list(argv), check=check, timeout=timeout, **kw)

    def popen(self, node, argv, **kw):
        return subprocess.Popen(["ip", "netns", "exec", node.ns] + list(argv), **kw)

    def set_rate(self, node, mbit):
        """Shape the node's link to ``mbit`` Mbit/s each way (tbf); None removes the shaping."""
        burst = max(256 * 1024, int(mbit * 1e6 / 8 / 100))  # >= one 64 KiB GSO packet, ~10 ms at the rate
        for prefix, dev in ((["ip", "netns", "exec", node.ns], "eth0"), (["ip", "netns", "exec", self.switch], node.veth)):
            _run(prefix + ["tc", "qdisc", "del", "dev", dev, "root"], check=False)
            if mbit:
                _run(prefix + ["tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", "%dkbit" % int(mbit * 1000),
                               "burst", str(burst), "latency", "200ms"])

    def link_counters(self, node):
        """The node's shaped link as its two ``tbf`` qdiscs counted so far: ``{"up": {...}, "down": {...}}``, each
        ``bytes``, ``packets``, ``dropped`` (the shaper's queue was full: TCP backs off) and ``overlimits`` (a packet
        waited for tokens), from ``tc -s qdisc show`` (iproute2 tc/q_tbf.c and tc/tc_qdisc.c print
        ``Sent <bytes> bytes <pkts> pkt (dropped <n>, overlimits <n> requeues <n>)``). ``up`` is the node's egress
        (what it sends), ``down`` the switch side's egress towards it (what it receives)."""
        out = {}
        for way, prefix, dev in (("up", ["ip", "netns", "exec", node.ns], "eth0"),
                                 ("down", ["ip", "netns", "exec", self.switch], node.veth)):
            text = _run(prefix + ["tc", "-s", "qdisc", "show", "dev", dev]).stdout
            m = re.search(r"Sent (\d+) bytes (\d+) pkt \(dropped (\d+), overlimits (\d+)", text)
            if not m:
                raise RuntimeError("tc -s qdisc show dev %s printed no counters: %r" % (dev, text[:200]))
            out[way] = dict(zip(("bytes", "packets", "dropped", "overlimits"), (int(x) for x in m.groups())))
        return out

    def set_shared_rate(self, mbit):
        """Throttle all the nodes' reads of the shared device to ``mbit`` Mbit/s in total (0: unthrottled)."""
        if not self.cgroup:
            raise RuntimeError("the fleet has no shared-device throttle (pass shared_read_mbit)")
        rdev = os.stat(self.loop).st_rdev
        with open(os.path.join(self.cgroup, "blkio.throttle.read_bps_device"), "w") as f:
            f.write("%d:%d %d\n" % (os.major(rdev), os.minor(rdev), int(mbit * 1e6 / 8)))

    def shared_read_bytes(self):
        """Bytes read from the shared filesystem's loop device so far (needs ``shared_device_mib``)."""
        if not self.loop:
            raise RuntimeError("the fleet has no shared device (pass shared_device_mib)")
        with open("/sys/block/%s/stat" % os.path.basename(self.loop)) as f:
            return int(f.read().split()[2]) * 512

    def remount_shared(self):
        """Unmount and mount the shared filesystem: its page cache is dropped, so the next reads hit the device."""
        if not self.loop:
            raise RuntimeError("the fleet has no shared device (pass shared_device_mib)")
        os.sync()
        _run(["umount", self.shared])
        _run(["mount", self.loop, self.shared])

    def ssh_args(self):
        return ("-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR "
                "-o ConnectTimeout=10 -o ServerAliveInterval=5 -o ServerAliveCountMax=3")

    def hostvars(self, node):
        return {"ansible_host": node.address, "ansible_user": "root", "ansible_port": 22,
                "ansible_ssh_private_key_file": self.client_key, "ansible_ssh_common_args": self.ssh_args(),
                "ansible_python_interpreter": self.python}

    def write_inventory(self, path, hostvars=None, groupvars=None, group="fleet"):
        """A YAML (JSON) inventory of every node in ``group``; ``hostvars(node)`` adds per-host variables."""
        hosts = {}
        for node in self.nodes:
            hv = self.hostvars(node)
            if hostvars:
                hv.update(hostvars(node))
            hosts[node.name] = hv
        doc = {"all": {"children": {group: {"hosts": hosts, "vars": dict(groupvars or {})}}}}
        with open(path, "w") as f:
            json.dump(doc, f, indent=2)
        return path

    def ansible_env(self, base=None):
        """Environment for ansible/ansible-playbook against this fleet (private ControlPath, pipelining)."""
        env = dict(base if base is not None else os.environ)
        env.update({"ANSIBLE_HOST_KEY_CHECKING": "False", "ANSIBLE_PIPELINING": "True",
                    "ANSIBLE_SSH_CONTROL_PATH_DIR": self.control_dir, "ANSIBLE_FORKS": str(max(8, self.n)),
                    "ANSIBLE_TIMEOUT": "20"})
        return env

    def ssh(self, node, command, timeout=60):
        """Run a shell command on the node over SSH (as Ansible would reach it)."""
        argv = ["ssh", "-i", self.client_key, "-o", "BatchMode=yes"] + self.ssh_args().split() + [
            "root@%s" % node.address, command]
        return _run(argv, check=False, timeout=timeout)


# ---- the model_stage role over the fleet ----------------------------------------------------------
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

STAGE_PLAYBOOK = """---
- name: Stage the revision on every node of the fleet
  hosts: fleet
  gather_facts: false
  roles:
    - role: llmops.serving.model_stage
  post_tasks:
    - name: Keep this node's results where the controller reads them
      ansible.builtin.copy:
        content: "{{ model_stage_results | to_json }}"
        dest: "{{ netns_result_file }}"
        mode: "0644"
"""


def collections_path():
    """An ansible_collections tree whose llmops.serving is this working tree (as the root conftest makes it)."""
    tree = os.path.join(REPO, ".build", "pycoll")
    link = os.path.join(tree, "ansible_collections", "llmops", "serving")
    if not os.path.islink(link):
        os.makedirs(os.path.dirname(link), exist_ok=True)
        try:
            os.symlink(REPO, link)
        except FileExistsError:
            pass
    return tree


def run_stage_play(fleet, nodes, group_vars, extra_args=(), timeout=900, tag="play", on_line=None, collections=None):
    """Run the model_stage role on ``nodes`` of ``fleet`` over SSH; returns rc, output, wall seconds, results.

    Each node stages into its own NVMe directory (``model_stage_dest_root``) with its own progress directory;
    ``group_vars`` gives everything else (src root, models, fan-out settings). ``results`` maps node name to
    that node's ``model_stage_results`` (None where the play did not get that far). ``on_line`` is called with
    each output line as it comes (progress). ``collections``: the ansible_collections tree to use (default:
    this working tree).
    """
    work = os.path.join(fleet.root, tag)
    os.makedirs(work, exist_ok=True)
    playbook = os.path.join(work, "stage.yml")
    with open(playbook, "w") as f:
        f.write(STAGE_PLAYBOOK)
    for node in nodes:
        try:
            os.unlink(os.path.join(node.dir, "%s-result.json" % tag))
        except OSError:
            pass

    def hostvars(node):
        return {"model_stage_dest_root": node.nvme, "model_stage_progress_dir": os.path.join(node.dir, "progress"),
                "model_stage_fanout_state_dir": os.path.join(node.dir, "peer"),
                "netns_result_file": os.path.join(node.dir, "%s-result.json" % tag)}

    inventory = fleet.write_inventory(os.path.join(work, "inventory.yml"), hostvars=hostvars, groupvars=group_vars)
    env = fleet.ansible_env()
    env.update({"ANSIBLE_CONFIG": os.path.join(REPO, "ansible.cfg"), "ANSIBLE_COLLECTIONS_PATH": collections or collections_path(),
                "ANSIBLE_FORCE_COLOR": "0", "ANSIBLE_NOCOLOR": "1", "PYTHONUNBUFFERED": "1"})
    argv = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", inventory, playbook,
            "--limit", ",".join(n.name for n in nodes)] + list(extra_args)
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    deadline = t0 + timeout
    try:
        for line in proc.stdout:
            lines.append(line)
            if on_line:
                on_line(line)
            if time.monotonic() > deadline:
                proc.kill()
                lines.append("netns: ansible-playbook killed after %d s\n" % timeout)
        proc.wait(max(1, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    wall = time.monotonic() - t0
    results = {}
    for node in nodes:
        try:
            with open(os.path.join(node.dir, "%s-result.json" % tag)) as f:
                results[node.name] = json.load(f)
        except (OSError, ValueError):
            results[node.name] = None
    return {"rc": proc.returncode, "output": "".join(lines), "wall": wall, "results": results}


def _main(argv):
    """``python -m ...tests.lib.netns cleanup``: remove fleets left by killed runs."""
    if argv[1:] == ["cleanup"]:
        print("removed fleets: %s" % (cleanup_stale() or "none"))
        return 0
    sys.stderr.write("usage: netns.py cleanup\n")
    return errno.EINVAL


if __name__ == "__main__":
    sys.exit(_main(sys.argv))
