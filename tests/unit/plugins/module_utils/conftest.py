"""Fixtures shared by the module_utils tests.

Test modules import the plain helpers below by the collection path
(``ansible_collections.llmops.serving.tests.unit.plugins.module_utils.conftest``); pytest finds the fixtures.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid

import pytest
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", "..", ".."))
# the Kubernetes version the rendered objects are validated against (kubernetes-validate)
K8S_VERSION = "1.33.0"
# the engine role's profile data, as the role passes it
with open(os.path.join(ROOT, "roles", "engine", "vars", "profiles.yml")) as _f:
    PROFILES = yaml.safe_load(_f)["engine_k8s_builtin_profiles"]


@pytest.fixture
def free_port():
    """A function returning a loopback TCP port nothing listens on (bound, then closed)."""
    def pick():
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        return port

    return pick


# ---- engine processes found by a per-test token in their argv ------------------------------------ #

def engines(token):
    """Live processes whose argv carries ``token`` (the supervisor's argv does not)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % d, "rb") as f:
                argv = f.read().split(b"\0")
            with open("/proc/%s/stat" % d) as f:
                zombie = f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
        except (OSError, IndexError):
            continue
        if token.encode() in argv and not zombie:
            out.append(int(d))
    return sorted(out)


@pytest.fixture
def token():
    """A token for the engines' argv; every engine still carrying it is SIGKILLed (its group too) afterwards."""
    tok = "llmops-test-engine-%s" % uuid.uuid4().hex
    yield tok
    for pid in engines(tok):
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, signal.SIGKILL)
            except OSError:
                pass


# ---- processes that use a directory: an open file, a mapping, a working directory, a bind mount ---- #

HOLD = r"""
import mmap, os, sys, time
mode, path = sys.argv[1], sys.argv[2]
if mode == "open":
    f = open(path, "rb")
elif mode == "mmap":
    # libc mmap, then close: Python's mmap object would keep a dup of the fd open
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    fd = os.open(path, os.O_RDONLY)
    addr = libc.mmap(None, 4096, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    assert addr not in (None, ctypes.c_void_p(-1).value)
    os.close(fd)
elif mode == "cwd":
    os.chdir(path)
print("ready", flush=True)
time.sleep(60)
"""


def hold(mode, path, env=None, argv_prefix=()):
    """A real process using ``path`` (``open``, ``mmap``, ``cwd``; any other mode only sleeps), once it is ready."""
    p = subprocess.Popen(list(argv_prefix) + [sys.executable, "-c", HOLD, mode, path], stdout=subprocess.PIPE,
                         env=env, text=True)
    assert p.stdout.readline().strip() == "ready"
    return p


def as_a_module_starts():
    """Run in the driver's process before it execs (``preexec_fn``): the signals the tests send at their default,
    as a module starts when its runner ignores none of them. A runner under ``nohup`` (SIGHUP ignored) or in a
    background job of a non-interactive shell (SIGINT ignored) would pass that on - an ignored signal stays ignored
    across exec, by design - and a signal sent before the interpreter is up would be lost."""
    for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)


def stop(p):
    p.kill()
    p.wait()


def hold_bind_mount(src, mnt):
    """A process in its own mount namespace holding a bind mount of ``src`` at ``mnt`` and no file open there:
    how a pod sees a hostPath volume (/proc/PID/mountinfo, proc(5)). Needs root and unshare(1)."""
    script = "mount --bind %s %s && echo ready && exec sleep 60" % (src, mnt)
    p = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                         stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        deadline = time.time() + 5
        while time.time() < deadline and "sleep" not in open("/proc/%d/cmdline" % p.pid).read():
            time.sleep(0.05)
    except BaseException:
        stop(p)
        raise
    return p
