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


def is_within(path, root):
    """``path`` is ``root`` or below it, after resolving symlinks on both."""
    p = os.path.realpath(path)
    r = os.path.realpath(root)
    return p == r or p.startswith(r.rstrip("/") + "/")


def overlaps(a, b):
    """One of the two directories contains the other (or they are the same), after resolving symlinks."""
    return is_within(a, b) or is_within(b, a)
