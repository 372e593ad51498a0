# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: one supervised engine per name, whose exit status is never masked.

The supervisor is a small Python parent (``supervisor.py``, written from SUPERVISOR_SOURCE) that runs the command
as a direct child in its own session (so the engine's process group id is its pid), forwards SIGTERM/SIGINT to
that process group, and records the child's real exit status in ``state.json`` (the files of
``<run_dir>/<name>/`` and how they are read: ``_process_state``; the rule that the command is the engine itself:
``_process_command``).

One engine per name. The rules that make ``(run_dir, name)`` name at most one engine:

* ``name`` is one plain path component (``_process_state.check_name``) and ``run_dir`` is absolute, so the pair
  always spells the same directory; the *identity key* is a hash of ``realpath(run_dir)`` and ``name``.
* Every run that may start or stop the engine holds a lock for that name across the whole check-and-spawn
  (:class:`NameLock`): an ``flock`` on ``<run_dir>/<name>/lock``, a file only this user can open, in a directory
  only this user can write, so another local user cannot take it first (a computable abstract socket name could
  be bound by any user). The kernel releases it when the holder dies; a lock taken on a file whose run
  directory was deleted meanwhile is taken again, and :meth:`NameLock.check` is asked again just before a spawn.
* The engine's identity does not live only in the run directory. The supervisor passes
  ``LLMOPS_ENGINE_PROCESS=<key>`` and ``LLMOPS_ENGINE_SPEC=<spec hash>`` in the engine's environment (inherited
  by its workers) and carries ``--llmops-engine-process=<key>`` on its own command line; ``state.json`` records
  pid *and* start time (``/proc/<pid>/stat`` field 22) of both, so a reused pid is never taken for the engine.
  When ``state.json`` does not show a live engine (deleted run dir, killed supervisor), :func:`locate` scans
  ``/proc`` for the marker and still finds it, so a second ``started`` does not start a second engine and
  ``stopped`` can still stop it. A supervisor whose state file was deleted writes it again within a second.
* ``stopped`` signals the supervisor when it lives; when it was killed, the engine's process group gets SIGTERM
  directly, then SIGKILL after the grace period.

Secrets: ``env`` values reach the engine only through the supervisor's process environment; they are never
written to ``spec.json`` (names only), ``state.json`` or the log by this code. Credentials written in the command
(``--api-key X``) reach the supervisor on its stdin; ``spec.json`` and the log banner show them masked.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import stat
import subprocess
import sys
import time

from ansible_collections.llmops.serving.plugins.module_utils.common import _fsutil, _secrets
from ansible_collections.llmops.serving.plugins.module_utils.common._process_run import (
    group_alive, live, proc_cmdline, proc_stat, stop_group,
)
from ansible_collections.llmops.serving.plugins.module_utils.engine._process_state import (
    ProcessError, STATE_MAX_BYTES, check_name, describe_exit, log_tail, paths, read_state_doc, read_state_file,
    write_private,
)
from ansible_collections.llmops.serving.plugins.module_utils.common._untrusted import UntrustedInput, load_json

MARKER_ENV = "LLMOPS_ENGINE_PROCESS"
SPEC_ENV = "LLMOPS_ENGINE_SPEC"
SUPERVISOR_FLAG = "--llmops-engine-process="

SUPERVISOR_SOURCE = r'''
import json, os, signal, subprocess, sys, time

def proc_start(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None

def write_state(path, data):
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)  # the run dir may have been deleted under us
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, sort_keys=True)
    os.replace(tmp, path)

def now():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

def main():
    key = sys.argv[1][len("--llmops-engine-process="):]
    state_path, log_path, spec_path = sys.argv[2:5]
    with open(spec_path) as f:
        spec = json.load(f)
    # spec.json holds the command with credentials masked; the real one comes on stdin
    given = json.loads(sys.stdin.read() or "{}")
    command = given.get("command") or spec["command"]
    log = open(log_path, "ab", buffering=0)
    log.write(("==== %s starting: %s\n" % (now(), " ".join(spec["command"]))).encode())
    state = {"state": "running", "key": key, "name": spec.get("name"), "supervisor_pid": os.getpid(),
             "supervisor_start": proc_start(os.getpid()), "started_at": time.time(), "spec_hash": spec["spec_hash"],
             "returncode": None, "signal": None}
    try:
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                 cwd=spec.get("chdir") or None, start_new_session=True)
    except OSError as e:
        rc = 127 if e.errno == 2 else 126
        log.write(("==== %s cannot start %s: %s\n" % (now(), spec["command"][0], e.strerror)).encode())
        state.update({"state": "exited", "pid": None, "ended_at": time.time(), "returncode": rc, "stop_requested": False})
        write_state(state_path, state)
        sys.exit(0)
    state.update({"pid": child.pid, "pid_start": proc_start(child.pid)})
    write_state(state_path, state)
    stop_timeout = float(spec.get("stop_timeout", 60))
    stopping = {"requested": None}

    def on_signal(signum, frame):
        if stopping["requested"] is None:
            stopping["requested"] = time.monotonic()  # the stop timeout is a duration: never the wall clock
            try:
                os.killpg(child.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    while True:
        try:
            rc = child.wait(timeout=1.0)
            break
        except subprocess.TimeoutExpired:
            if stopping["requested"] is not None and time.monotonic() - stopping["requested"] > stop_timeout:
                try:
                    os.killpg(child.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if not os.path.exists(state_path):
                try:
                    write_state(state_path, state)
                except OSError:
                    pass
    try:  # reap anything the engine left in its process group (workers)
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    state.update({"state": "exited", "ended_at": time.time(), "returncode": rc,
                  "signal": (-rc if rc < 0 else None), "stop_requested": stopping["requested"] is not None})
    write_state(state_path, state)
    log.write(("==== %s exited: returncode=%s\n" % (now(), rc)).encode())
    sys.exit(0)

main()
'''
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


NO_LOG_PLACEHOLDER = "VALUE_SPECIFIED_IN_NO_LOG_PARAMETER"


def mask_everywhere(env_name, value):
    """Whether Ansible should mask ``value`` inside every string of the result, not only where env is shown.

    True for credentials by the collection's one rule (:mod:`_secrets`: the name, or a token-shaped value).
    Plain settings are not: masking ``1`` everywhere would turn pids and times into the mask.
    """
    return _secrets.is_credential_name(env_name) or _secrets.token_shape(value) is not None


def command_secrets(command):
    """``(values, fields)``: credentials written in ``command`` (``--api-key X``, a token-shaped word).

    The collection's one rule (:class:`_secrets.Scan`, shell scripts split into words). They are masked in
    results and in every file this module writes, but stay readable to local users in the engine's
    ``/proc/<pid>/cmdline``.
    """
    scan = _secrets.Scan()
    scan.command(list(command or []))
    fields = []
    for f in scan.findings:
        if f.value and f.field not in fields:
            fields.append(f.field)
    return scan.secret_values(), fields


def redact(argv, values):
    """``argv`` with every occurrence of ``values`` replaced by ``********``."""
    out = []
    for tok in argv:
        for v in sorted(values, key=len, reverse=True):
            tok = tok.replace(v, "********")
        out.append(tok)
    return out


def check_env(env):
    """Validated ``env`` as ``{str: str}``. Messages name variables, never values."""
    clean = {}
    for k, v in (env or {}).items():
        k = str(k)
        if not ENV_NAME_RE.match(k):
            raise ProcessError("env: %r is not a valid environment variable name (letters, digits and '_', not "
                               "starting with a digit)" % k[:100], reason="bad_env")
        if k in (MARKER_ENV, SPEC_ENV):
            raise ProcessError("env: %s is set by engine_process to find the engine again; remove it" % k,
                               reason="bad_env")
        if v is None or isinstance(v, (dict, list)):
            raise ProcessError("env: %s must be a string, not %s; quote the value in YAML ('' for empty)"
                               % (k, "null" if v is None else type(v).__name__), reason="bad_env")
        v = str(v)
        if "\x00" in v:
            raise ProcessError("env: the value of %s contains a NUL byte" % k, reason="bad_env")
        clean[k] = v
    return clean


def masked_env(env):
    """``env`` with every value replaced, for anything shown to the user (names stay, values never)."""
    return {k: NO_LOG_PLACEHOLDER for k in env}


# --------------------------------------------------------------------------------------------- #
# Identity, lock, /proc
# --------------------------------------------------------------------------------------------- #


def spec_hash(command, env, chdir):
    """Stable hash of what is started; env values are hashed, never stored in clear."""
    payload = json.dumps({"command": list(command), "env": sorted((env or {}).items()), "chdir": chdir or ""},
                         sort_keys=True)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:16]


def identity_key(run_dir, name):
    """The key of one engine: the same for every spelling of ``run_dir``, before and after it is deleted."""
    real = os.path.realpath(run_dir)
    return hashlib.sha256(("%s\0%s" % (real, name)).encode("utf-8", "surrogateescape")).hexdigest()[:24]


class NameLock(object):
    """Exclusive lock for one ``(run_dir, name)``, held across check-and-spawn (or stop).

    An ``flock`` on ``<run_dir>/<name>/lock``: a regular file of mode 0600 that this user owns, in a directory
    this user owns that no one else can write, in a ``run_dir`` that belongs to this user or root and that others
    cannot write (or only with the sticky bit, like ``/tmp``). Another local user can neither open the file to
    lock it nor put one of their own in its place: what they could have planted is refused with
    ``reason=not_owned`` (:func:`_own_dir`), never waited on. The kernel releases the lock when the holder exits
    or is killed; its descriptor is close-on-exec, so neither the supervisor nor the engine holds it after the
    spawn. A lock taken on a file that was unlinked or replaced meanwhile (the run dir deleted) is taken again on
    the file the path names now; :meth:`check` says, before a spawn, whether that is still the locked file. Waits
    up to ``timeout`` seconds.
    """

    def __init__(self, run_dir, name, timeout=120.0):
        self.key = identity_key(run_dir, name)
        self.run_dir = run_dir
        self.name = name
        self.path = paths(run_dir, name)["lock"]
        self.timeout = timeout
        self.fd = None

    def __enter__(self):
        deadline = time.monotonic() + self.timeout
        while True:
            fd = _open_lock(self.run_dir, self.name)
            try:
                taken = _fsutil.wait_flock(fd, deadline, poll=0.2, first_poll=0.01)
            except BaseException:
                os.close(fd)
                raise
            if not taken:
                os.close(fd)
                raise ProcessError(
                    "%s: another engine_process run for this name has been starting or stopping it for over "
                    "%d s; let it finish (or stop that run) and run again" % (self.name, self.timeout),
                    reason="locked")
            self.fd = fd
            if self.check():
                return self
            self.fd = None
            os.close(fd)  # the run dir was deleted or the file replaced while this run waited: lock the new one

    def check(self):
        """The lock path still names the file this run locked (the run dir was not deleted meanwhile)."""
        try:
            st = os.stat(self.path, follow_symlinks=False)
        except OSError:
            return False
        held = os.fstat(self.fd)
        return (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino)

    def __exit__(self, *exc):
        os.close(self.fd)
        self.fd = None
        return False


def _not_owned(msg, path):
    return ProcessError(msg, reason="not_owned", file=path)


def _own_dir(fd, path, option, create_fix):
    """Refuse the directory open on ``fd`` unless this user owns it; take away write access of group and others
    it should not have (a directory engine_process made under a umask of 002)."""
    st = os.fstat(fd)
    me = os.geteuid()
    if st.st_uid != me:
        raise _not_owned(
            "%s: %s belongs to uid %d, not to uid %d that runs engine_process; another user could hold the engine's "
            "lock there and keep this run from starting or stopping it; %s"
            % (option, path, st.st_uid, me, create_fix), path)
    if st.st_mode & 0o022:
        os.fchmod(fd, stat.S_IMODE(st.st_mode) & ~0o022)


def _open_lock(run_dir, name):
    """``<run_dir>/<name>/lock`` opened for :class:`NameLock`, each step checked as :class:`NameLock` says;
    creates the directories (``<name>`` with mode 0700) and the file (0600) when they are missing."""
    try:
        return _open_lock_checked(run_dir, name)
    except ProcessError:
        raise
    except OSError as e:
        raise ProcessError("run_dir: cannot create or open %s (%s: %s); point run_dir at a directory this user can "
                           "write" % (os.path.join(run_dir, name, "lock"), e.filename or run_dir, e.strerror),
                           reason="bad_run_dir", file=run_dir)


def _open_lock_checked(run_dir, name):
    me = os.geteuid()
    os.makedirs(run_dir, mode=0o755, exist_ok=True)
    rfd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        st = os.fstat(rfd)
        if st.st_uid not in (me, 0):
            raise _not_owned(
                "run_dir: %s belongs to uid %d; only that user (or root) could then start or stop engines there, "
                "another user could replace <run_dir>/%s and take the engine's lock first; use a run_dir that "
                "belongs to uid %d or root (for example /var/tmp/llmops/run-%d)" % (run_dir, st.st_uid, name, me, me),
                run_dir)
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            raise _not_owned(
                "run_dir: %s can be written by group or others (mode %04o) without the sticky bit; another user "
                "could replace <run_dir>/%s and take the engine's lock first; chmod go-w %s (or +t), or use a "
                "run_dir only its owner can write" % (run_dir, stat.S_IMODE(st.st_mode), name, run_dir), run_dir)
        try:
            os.mkdir(name, 0o700, dir_fd=rfd)
        except FileExistsError:
            pass
        base = os.path.join(run_dir, name)
        try:
            dfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=rfd)
        except OSError as e:
            raise ProcessError("name: %s is not a directory (%s); remove it or choose another name"
                               % (base, e.strerror), reason="bad_name")
    finally:
        os.close(rfd)
    try:
        _own_dir(dfd, base, "name", "remove %s (as its owner or root) or choose another name or run_dir" % base)
        lock = os.path.join(base, "lock")
        try:
            fd = os.open("lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600,
                         dir_fd=dfd)
        except OSError as e:
            raise _not_owned("name: %s cannot be opened as engine_process's lock (%s); remove it and run again"
                             % (lock, e.strerror), lock)
    finally:
        os.close(dfd)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != me:
        os.close(fd)
        raise _not_owned(
            "name: %s is not a regular file of uid %d (it is %s of uid %d); another user could hold it and keep "
            "this run from starting or stopping the engine; remove it (as its owner or root) and run again"
            % (lock, me, "a file" if stat.S_ISREG(st.st_mode) else "not a file", st.st_uid), lock)
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.fchmod(fd, 0o600)
    return fd


def _proc_environ(pid, proc_root="/proc"):
    """The two marker variables of ``pid`` (``{}`` when unreadable or absent)."""
    try:
        with open("%s/%d/environ" % (proc_root, pid), "rb") as f:
            data = f.read()
    except OSError:
        return {}
    out = {}
    for item in data.split(b"\0"):
        for var in (MARKER_ENV, SPEC_ENV):
            if item.startswith(var.encode() + b"="):
                out[var] = item[len(var) + 1:].decode("ascii", "replace")
    return out


def _started_at(start_ticks, proc_root="/proc"):
    try:
        with open("%s/stat" % proc_root) as f:
            btime = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        return btime + start_ticks / float(os.sysconf("SC_CLK_TCK"))
    except (OSError, StopIteration, ValueError):
        return None


def _mount_ns(pid, proc_root="/proc"):
    try:
        return os.readlink("%s/%d/ns/mnt" % (proc_root, pid))
    except OSError:
        return None


def _same_ns(my_ns, pid, proc_root="/proc"):
    """Same mount namespace as this run (a container with the same run_dir path holds another engine)."""
    other = _mount_ns(pid, proc_root)
    return my_ns is None or other is None or other == my_ns


def scan(key, proc_root="/proc"):
    """Processes of the engine ``key`` found in ``/proc``: supervisor, engine (session leader), its group."""
    found = {"supervisor": None, "supervisor_start": None, "engine": None, "engine_start": None, "group": [],
             "spec_hash": None}
    marked = []
    try:
        pids = [int(d) for d in os.listdir(proc_root) if d.isdigit()]
    except OSError:
        return found
    me = os.getpid()
    my_ns = _mount_ns(me, proc_root)
    for pid in pids:
        if pid == me:
            continue
        st = proc_stat(pid, proc_root)
        if st is None or st["state"] in ("Z", "X"):
            continue
        cmd = proc_cmdline(pid, proc_root)
        if SUPERVISOR_FLAG + key in cmd:
            if _same_ns(my_ns, pid, proc_root):
                found.update(supervisor=pid, supervisor_start=st["start"])
            continue
        env = _proc_environ(pid, proc_root)
        if env.get(MARKER_ENV) == key and _same_ns(my_ns, pid, proc_root):
            marked.append((pid, st, env))
    leaders = [m for m in marked if m[0] == m[1]["session"] == m[1]["pgrp"]]
    if leaders:
        pid, st, env = min(leaders, key=lambda m: m[1]["start"])
        found.update(engine=pid, engine_start=st["start"])
        found["spec_hash"] = env.get(SPEC_ENV)
        pgrp = pid
    elif marked:
        pgrp = marked[0][1]["pgrp"]  # the leader is gone, its workers are not
        found["spec_hash"] = marked[0][2].get(SPEC_ENV)
    else:
        return found
    found["pgrp"] = pgrp
    found["group"] = sorted(m[0] for m in marked if m[1]["pgrp"] == pgrp)
    return found


def _runs_spec(pid, spec_path, proc_root="/proc"):
    """Process ``pid`` runs the command recorded in ``spec_path`` (masked credentials match any text)."""
    try:
        spec = load_json(spec_path, "spec file", max_bytes=STATE_MAX_BYTES)
    except (OSError, UntrustedInput):
        return False
    command = spec.get("command") if isinstance(spec, dict) else None
    if not isinstance(command, list) or not command or not all(isinstance(c, str) for c in command):
        return False
    argv = proc_cmdline(pid, proc_root)
    if argv and argv[-1] == "":
        argv = argv[:-1]
    if len(argv) != len(command):
        return False
    for want, got in zip(command, argv):
        pattern = ".*".join(re.escape(part) for part in want.split("********"))
        if not re.fullmatch(pattern, got, re.S):
            return False
    return True


def read_state(run_dir, name):
    """Current state: ``absent`` | ``running`` | ``exited`` (with returncode/signal) | ``lost``."""
    return locate(run_dir, name)


def locate(run_dir, name, proc_root="/proc"):
    """State of the engine ``name``, from ``state.json`` when it shows a live engine, else from ``/proc``.

    A running engine is found even when its run directory was deleted or its supervisor was killed;
    ``supervisor_lost: true`` says that nothing will record its exit status any more.
    """
    p = paths(run_dir, name)
    key = identity_key(run_dir, name)
    st, problem = read_state_doc(p["state"])
    if problem:
        st["state_file_error"] = problem
    eng = False
    if st.get("state") == "running":
        # an engine the file names without a marker in its environment (started before markers existed) is taken
        # only with its recorded start time, and only as its own session leader (as the supervisor starts it)
        # and running the command spec.json records
        known = (st.get("pid") or 0) > 1 and st.get("pid_start") is not None
        leader = proc_stat(st["pid"], proc_root) if known else None
        eng = (bool(leader and leader["session"] == st["pid"]) and live(st["pid"], st["pid_start"], proc_root)
               and _runs_spec(st["pid"], p["spec"], proc_root))
        # the supervisor named by the file is taken only when it carries this engine's identity on its command line
        sup = live(st.get("supervisor_pid"), st.get("supervisor_start"), proc_root)
        if sup and SUPERVISOR_FLAG + key in proc_cmdline(st["supervisor_pid"], proc_root):
            return dict(st, supervisor_lost=False, recovered=False)
        if sup:
            problem = ("state file: %s names supervisor pid %d, a process that does not carry this engine's "
                       "identity; it was not signalled" % (p["state"], st["supervisor_pid"]))
            st = {k: v for k, v in st.items() if k not in ("supervisor_pid", "supervisor_start")}
            st["state_file_error"] = problem
    elif not st.get("state"):
        st = {"state_file_error": problem} if problem else {}
    found = scan(key, proc_root)
    if found["engine"] or found["group"] or found["supervisor"]:
        out = dict(st) if st.get("state") == "running" else {"state": "running", "returncode": None,
                                                             "signal": None}
        if problem:
            out["state_file_error"] = problem
        out["state"] = "running"
        out["recovered"] = st.get("state") != "running"
        if found["engine"]:
            if out.get("pid") != found["engine"]:
                out.update(pid=found["engine"], pid_start=found["engine_start"],
                           started_at=_started_at(found["engine_start"], proc_root))
        elif found["group"]:
            out.update(pid=found["pgrp"], pid_start=None, leader_exited=True)
        if found["supervisor"]:
            out.update(supervisor_pid=found["supervisor"], supervisor_start=found["supervisor_start"],
                       supervisor_lost=False)
        else:
            out["supervisor_lost"] = True
        if found["spec_hash"]:
            out["spec_hash"] = found["spec_hash"]
        out["group"] = found["group"]
        return out
    if st.get("state") == "running" and eng:  # started before identities were recorded in the environment
        return dict(st, supervisor_lost=True)
    again = read_state_doc(p["state"])[0]
    if again.get("state") in ("exited", "lost") and again != {k: v for k, v in st.items() if k != "state_file_error"}:
        # the supervisor recorded the end while /proc was read
        return again
    if st.get("state") == "running":
        return dict(st, state="lost", returncode=None)
    if not st.get("state"):
        return dict(st, state="absent")
    return st


# --------------------------------------------------------------------------------------------- #
# Start / stop (callers hold NameLock)
# --------------------------------------------------------------------------------------------- #


def start(run_dir, name, command, env=None, chdir=None, stop_timeout=60, startup_grace=2.0, python=None, lock=None):
    """Start under a supervisor; fail with the exit status if the command dies within ``startup_grace``.

    ``env`` reaches the engine through the supervisor's environment only, never through a file. ``lock``: the
    caller's :class:`NameLock`, checked to still be this name's lock right before the spawn.
    """
    check_name(name)
    p = paths(run_dir, name)
    os.makedirs(p["dir"], mode=0o700, exist_ok=True)
    merged = dict(env or {})
    h = spec_hash(command, merged, chdir)
    key = identity_key(run_dir, name)
    spec = {"command": redact(command, command_secrets(command)[0]), "env_names": sorted(merged), "chdir": chdir,
            "stop_timeout": stop_timeout, "spec_hash": h, "name": name, "key": key}
    with open(p["supervisor"], "w") as f:
        f.write(SUPERVISOR_SOURCE)
    write_private(p["spec"], spec)
    try:
        os.unlink(p["state"])
    except FileNotFoundError:
        pass
    proc_env = dict(os.environ)
    proc_env.update(merged)
    proc_env[MARKER_ENV] = key
    proc_env[SPEC_ENV] = h
    if lock is not None and not lock.check():
        raise ProcessError("run_dir: %s was deleted or replaced while this run held the lock of %s; nothing was "
                           "started; run again" % (run_dir, name), reason="locked")
    sup = subprocess.Popen([python or sys.executable, p["supervisor"], SUPERVISOR_FLAG + key, p["state"], p["log"],
                            p["spec"]], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           start_new_session=True, close_fds=True, env=proc_env)
    try:
        sup.stdin.write(json.dumps({"command": list(command)}).encode("utf-8"))
        sup.stdin.close()
    except OSError:
        pass
    deadline = time.monotonic() + max(startup_grace, 0.5) + 10
    st = {"state": "absent"}
    while time.monotonic() < deadline:  # wait for the supervisor to record the child
        st = read_state_file(p["state"])
        if st["state"] != "absent":
            break
        time.sleep(0.05)
    if st["state"] == "absent":
        raise ProcessError("%s: the supervisor did not start (see %s)" % (name, p["log"]), log_file=p["log"])
    end = time.monotonic() + startup_grace
    while time.monotonic() < end and st["state"] == "running":
        time.sleep(0.2)
        st = read_state_file(p["state"])
    if st["state"] == "running" and not live(st.get("pid"), st.get("pid_start")):
        # child died; give the supervisor a moment to record the status
        for dummy in range(50):
            time.sleep(0.1)
            st = read_state_file(p["state"])
            if st["state"] != "running":
                break
    if st["state"] != "running":
        raise ProcessError(
            "%s exited during start-up with %s (log: %s)" % (name, describe_exit(st), p["log"]),
            returncode=st.get("returncode"), signal=st.get("signal"), log_file=p["log"], log_tail=log_tail(p["log"]))
    return dict(st, supervisor_lost=False, recovered=False)


def _stop_orphan(run_dir, name, st, timeout, proc_root="/proc"):
    """Stop an engine whose supervisor is gone: SIGTERM to its process group, SIGKILL after ``timeout``."""
    if not st.get("pid"):
        return dict(st, state="lost", returncode=None)
    pgrp = int(st["pid"])
    if not group_alive(pgrp, proc_root):
        return dict(st, state="lost", returncode=None)
    stop_requested = time.time()
    sent = stop_group(pgrp, timeout, proc_root) or signal.SIGTERM
    final = {k: v for k, v in st.items() if k not in ("group", "recovered")}
    final.update(state="exited", returncode=None, signal=None, ended_at=time.time(), stop_requested=True,
                 stop_requested_at=stop_requested, stop_signal=int(sent), supervisor_lost=True)
    p = paths(run_dir, name)
    try:
        os.makedirs(p["dir"], exist_ok=True)
        write_private(p["state"], final)
    except OSError:
        pass
    return final


def stop(run_dir, name, timeout=60, proc_root="/proc"):
    """Stop the engine and return ``(final state, changed)``.

    With a live supervisor: SIGTERM to it (it sends SIGTERM to the engine's process group, SIGKILL after
    ``timeout``). Without one (killed): the same two steps, sent to the engine's process group from here.
    """
    st = locate(run_dir, name, proc_root)
    if st["state"] != "running":
        return st, False
    if not st.get("supervisor_lost"):
        try:
            os.kill(int(st["supervisor_pid"]), signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
        end = time.monotonic() + timeout + 15
        while time.monotonic() < end:
            cur = locate(run_dir, name, proc_root)
            if cur["state"] != "running":
                return cur, True
            if cur.get("supervisor_lost"):
                st = cur
                break
            time.sleep(0.1)
        else:
            try:
                os.kill(int(st["supervisor_pid"]), signal.SIGKILL)
            except (ProcessLookupError, PermissionError, TypeError, KeyError):
                pass
            return _stop_orphan(run_dir, name, dict(st, supervisor_lost=True), 0, proc_root), True
    return _stop_orphan(run_dir, name, st, timeout, proc_root), True
