# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: the one rule for paths read from files, and for overlapping directories.

Every relative path that comes out of a file this collection reads back (a cache ``manifest.json``, a render
directory's ``.llmops-manifests.json``, a stage marker, a checksum file) goes through :func:`contained` before it
is opened, written, listed in a diff or deleted. The rule:

* the entry is a non-empty ``str`` without NUL, relative (no leading ``/``), with no ``..`` component and no
  empty / ``.`` component (a path is spelt one way only, so two entries cannot name the same file);
* every existing component below ``root`` is a real directory, and the last one a file or absent: a symlink
  anywhere in the entry is refused (a link inside the root may point anywhere later, so it is not followed);
* the result is the absolute path under ``realpath(root)``.

Refusal raises :class:`PathEscape` (a ``ValueError``) that names the field, the root and the fix, never the
content of the file the entry came from.

A path given by a user (``dest``, ``pinned``, ``in_use``, a root) has one identity however it is spelt: a symlinked
root, a trailing slash, ``..`` (resolved after the symlink before it, as the kernel does), ``//``, a relative
spelling or a bind mount of the same directory. :func:`identity` is that identity (``realpath`` and
``(st_dev, st_ino)``); :func:`same_path`, :func:`is_within` and :func:`overlaps` compare identities, never strings,
and every retention, pin and in-use decision goes through them.
"""
from __future__ import annotations

import os
import stat


class PathEscape(ValueError):
    """A path read from a file would leave its root."""

    def __init__(self, field, rel, root, why):
        self.field = field
        self.rel = rel
        self.root = root
        self.why = why
        shown = rel if isinstance(rel, str) and len(rel) <= 200 and "\x00" not in rel else type(rel).__name__
        super(PathEscape, self).__init__(
            "%s: %r %s, so it is refused (it must name a file inside %s); remove the entry or regenerate the "
            "file that lists it" % (field, shown, why, root))


def split_relative(rel, field="path", root=""):
    """The components of a relative path entry, or :class:`PathEscape`."""
    if not isinstance(rel, str) or not rel:
        raise PathEscape(field, rel, root, "is not a non-empty string")
    if "\x00" in rel:
        raise PathEscape(field, rel, root, "contains a NUL byte")
    if rel.startswith("/"):
        raise PathEscape(field, rel, root, "is absolute")
    parts = rel.split("/")
    for p in parts:
        if p == "..":
            raise PathEscape(field, rel, root, "climbs out with '..'")
        if p in ("", "."):
            raise PathEscape(field, rel, root, "has an empty or '.' component")
    return parts


def contained(root, rel, field="path"):
    """Absolute path of ``rel`` inside ``root``; raises :class:`PathEscape` when it would leave it."""
    real_root = os.path.realpath(root)
    parts = split_relative(rel, field, real_root)
    cur = real_root
    for i, p in enumerate(parts):
        cur = os.path.join(cur, p)
        try:
            st = os.lstat(cur)
        except FileNotFoundError:
            break
        except NotADirectoryError:
            raise PathEscape(field, rel, real_root, "goes through a file")
        if stat.S_ISLNK(st.st_mode):
            raise PathEscape(field, rel, real_root, "goes through a symlink (%s)" % "/".join(parts[:i + 1]))
        if i < len(parts) - 1 and not stat.S_ISDIR(st.st_mode):
            raise PathEscape(field, rel, real_root, "goes through a file")
    return os.path.join(real_root, *parts)


def identity(path):
    """``(realpath, (st_dev, st_ino))`` of ``path``; the key is None when nothing exists there (yet).

    The realpath resolves every symlink and every ``..`` after the component before it; the key is the
    directory or file itself, so a bind mount of it at another place has the same key.
    """
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except (OSError, ValueError):
        return real, None
    return real, (st.st_dev, st.st_ino)


def _key(path):
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino


def same_path(a, b):
    """``a`` and ``b`` name the same file or directory: same device and inode when both exist, else the same
    realpath."""
    ra, ka = identity(a)
    rb, kb = identity(b)
    if ka is not None and kb is not None:
        return ka == kb
    return ra == rb


def is_within(path, root):
    """``path`` is ``root`` or below it, however either is spelt.

    Decided on the realpaths first, then by walking up from ``path`` (from its nearest existing ancestor when it
    does not exist yet) and comparing each directory's device and inode with ``root``'s, so a bind mount of
    ``root`` (or of a directory above it) at another place is seen too.
    """
    p = os.path.realpath(path)
    r = os.path.realpath(root)
    if p == r or p.startswith(r.rstrip("/") + "/"):
        return True
    rkey = _key(r)
    if rkey is None:
        return False
    probe = p
    key = _key(probe)
    while key is None and probe != "/":
        probe = os.path.dirname(probe)
        key = _key(probe)
    while key is not None:
        if key == rkey:
            return True
        parent = os.path.dirname(probe)
        if parent == probe:
            return False
        probe = parent
        key = _key(probe)
    return False


def overlaps(a, b):
    """One of the two paths contains the other (or they are the same), however either is spelt."""
    return is_within(a, b) or is_within(b, a)
