# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: which processes use a directory, whatever path they reach it by.

One /proc scan for every "is this in use?" question (a staged revision before ``state: absent`` or prune, a
kernel-cache fingerprint before ``gc`` or quarantine). A directory counts as used by a process when

* one of its open files (``/proc/PID/fd``) or mapped files (``/proc/PID/maps``) lies below it,
* its working directory or root directory lies below it,
* (``environ=True``) an absolute path in one of its environment values lies below it, or
* its mount namespace has a mount of the directory or of something below it (``/proc/PID/mountinfo``): how a
  pod sees a hostPath or bind mount, even while it has no file open yet.

"Below" is decided by device and inode, not by spelling: each candidate path is resolved in the process's own
mount namespace (``/proc/PID/root/...``, see proc(5)) and its ancestors are compared with the directory's
``(st_dev, st_ino)``. So a symlinked root, a second path to the same directory and a bind mount at another place
in a container are all seen. Where ``/proc/PID/root`` cannot be read (not root, or a fixture tree), the path is
resolved in this process's namespace.

proc(5): https://man7.org/linux/man-pages/man5/proc.5.html (``/proc/pid/mountinfo`` fields: mount ID, parent ID,
``major:minor``, root, mount point, ...).
"""
from __future__ import annotations

import os

_DELETED = " (deleted)"


class _Target(object):
    def __init__(self, path):
        self.path = path
        self.real = os.path.realpath(path)
        self.prefix = self.real.rstrip("/") + "/"
        try:
            st = os.stat(self.real)
            self.key = (st.st_dev, st.st_ino)
        except OSError:
            self.key = None
        self.fs = None  # (major:minor, path inside that filesystem) once known


def _mountinfo(path):
    """Parsed ``mountinfo``: list of (major:minor, root, mount point)."""
    rows = []
    try:
        with open(path, "r", errors="replace") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 5:
                    rows.append((parts[2], _unescape(parts[3]), _unescape(parts[4])))
    except OSError:
        pass
    return rows


def _unescape(s):
    # mountinfo escapes space, tab, newline and backslash as octal (\040 ...)
    if "\\" not in s:
        return s
    out, i = [], 0
    while i < len(s):
        if s[i] == "\\" and i + 4 <= len(s) and s[i + 1:i + 4].isdigit():
            out.append(chr(int(s[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(s[i])
            i += 1
    return "".join(out)


def _below(child, parent):
    return child == parent or child.startswith(parent.rstrip("/") + "/")


def _fs_location(target, own_mounts):
    """``(major:minor, path inside the filesystem)`` of ``target``, from this namespace's mount table."""
    if target.key is None:
        return None
    majmin = "%d:%d" % (os.major(target.key[0]), os.minor(target.key[0]))
    best = None
    for mm, root, mnt in own_mounts:
        if mm == majmin and _below(target.real, mnt) and (best is None or len(mnt) > len(best[2])):
            best = (mm, root, mnt)
    if best is None:
        return None
    rest = target.real[len(best[2].rstrip("/")):]
    return majmin, (best[1].rstrip("/") + rest) or "/"


class _Scanner(object):
    def __init__(self, targets, proc_root):
        self.targets = targets
        self.proc_root = proc_root
        self.keys = dict((t.key, t) for t in targets if t.key is not None)
        self.devs = set(k[0] for k in self.keys)
        self.cache = {}

    def _stat(self, full):
        key = self.cache.get(full)
        if key is None and full not in self.cache:
            try:
                st = os.stat(full)
                key = (st.st_dev, st.st_ino)
            except OSError:
                key = None
            self.cache[full] = key
        return key

    def match(self, pid_root, path, key=None):
        """The target that ``path`` (absolute, in the process's namespace) lies below, or None."""
        if path.endswith(_DELETED):
            path = path[:-len(_DELETED)]
        if not path.startswith("/"):
            return None
        for t in self.targets:
            if path == t.real or path.startswith(t.prefix):
                return t
        if not self.keys:
            return None
        probe = path
        if key is None:
            key = self._stat(pid_root + probe)
            while key is None:  # a path not created yet: judge by its nearest existing parent
                parent = os.path.dirname(probe)
                if parent == probe:  # "/" - or "//", which POSIX dirname keeps (a URL's "//host" from an environ)
                    break
                probe = parent
                key = self._stat(pid_root + probe)
        if key is None or key[0] not in self.devs:
            return None
        while True:
            hit = self.keys.get(key)
            if hit is not None:
                return hit
            parent = os.path.dirname(probe)
            if parent == probe:
                return None
            probe = parent
            key = self._stat(pid_root + probe)
            if key is None:
                return None


def users_of(paths, proc_root="/proc", environ=False, exclude_pids=()):
    """Processes using any directory in ``paths``: list of ``{pid, path, via, file}``, one per (pid, path).

    ``path`` is the directory as given, ``via`` one of fd, map, cwd, root, environ, mount, and ``file`` what the
    process holds there (as the process spells it).
    """
    if isinstance(paths, str):
        paths = [paths]
    targets = [_Target(p) for p in paths]
    if not targets:
        return []
    scan = _Scanner(targets, proc_root)
    skip = set(str(p) for p in exclude_pids) | {str(os.getpid())}
    try:
        pids = sorted((p for p in os.listdir(proc_root) if p.isdigit() and p not in skip), key=int)
    except OSError:
        return []

    own_mounts = _mountinfo(os.path.join(proc_root, "self", "mountinfo"))
    for t in targets:
        t.fs = _fs_location(t, own_mounts)
    seen_ns = {}
    found = []
    for pid in pids:
        hits = {}
        base = os.path.join(proc_root, pid)
        root = os.path.join(base, "root")
        pid_root = root if _readable_root(root) else ""

        def note(t, via, what):
            if t is not None and t.path not in hits:
                hits[t.path] = {"pid": int(pid), "path": t.path, "via": via, "file": what}

        fd_dir = os.path.join(base, "fd")
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            fds = []
        for fd in fds:
            link = os.path.join(fd_dir, fd)
            try:
                target = os.readlink(link)
            except OSError:
                continue
            if target.startswith("/"):
                note(scan.match(pid_root, target, key=scan._stat(link)), "fd", target)
        try:
            with open(os.path.join(base, "maps"), "r", errors="replace") as f:
                mapped = set(parts[5].strip() for parts in (ln.split(None, 5) for ln in f) if len(parts) == 6)
        except OSError:
            mapped = set()
        for m in sorted(mapped):
            note(scan.match(pid_root, m), "map", m)
        for name in ("cwd", "root"):
            link = os.path.join(base, name)
            try:
                target = os.readlink(link)
            except OSError:
                continue
            key = scan._stat(link)
            if key in scan.keys:
                note(scan.keys[key], name, target)
            elif name == "cwd" or target != "/":
                note(scan.match("" if name == "root" else pid_root, target, key=key), name, target)
        if environ:
            for value in _environ_paths(os.path.join(base, "environ")):
                note(scan.match(pid_root, value), "environ", value)
        _mount_hits(base, targets, seen_ns, note)
        found.extend(hits[p] for p in sorted(hits))
    return found


def _readable_root(root):
    try:
        return os.path.isdir(os.path.join(root, ""))
    except OSError:
        return False


def _environ_paths(path):
    try:
        with open(path, "rb") as f:
            data = f.read().decode("utf-8", "replace")
    except OSError:
        return []
    out = []
    for entry in data.split("\x00"):
        value = entry.partition("=")[2]
        out.extend(v for v in value.split(":") if v.startswith("/"))
    return out


def _mount_hits(base, targets, seen_ns, note):
    wanted = [t for t in targets if t.fs is not None]
    if not wanted:
        return
    try:
        ns = os.readlink(os.path.join(base, "ns", "mnt"))
    except OSError:
        ns = base  # fixture trees: every pid its own namespace
    if ns not in seen_ns:
        rows = _mountinfo(os.path.join(base, "mountinfo"))
        hits = []
        for mm, root, mnt in rows:
            for t in wanted:
                if mm == t.fs[0] and _below(root, t.fs[1]) and not (root == t.fs[1] and mnt == t.real):
                    hits.append((t, mnt))
        seen_ns[ns] = hits
    for t, mnt in seen_ns[ns]:
        note(t, "mount", mnt)
