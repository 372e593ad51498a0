# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: the rules for file names the collection compares, creates or refuses.

* **Comparing.** A name a person types (a pin) and a name read from a directory may be one text in two Unicode
  spellings: ``é`` as one code point (NFC: what keyboards, Linux tools and most programs produce) or as ``e``
  followed by a combining acute accent (NFD: what macOS HFS+ stored, and what rsync or tar carry over from there).
  Linux filesystems store the bytes they are given and never normalise (ext4 and XFS; ext4's ``casefold`` is an
  opt-in per directory), so the two spellings are two different directories there; HFS+ stored every name
  decomposed, and APFS keeps the spelling but compares names normalisation-insensitively (Apple, "Apple File System
  Guide", FAQ on Unicode normalization). :func:`normal` is NFC (Python's ``unicodedata.normalize("NFC",
  ...)``, https://docs.python.org/3/library/unicodedata.html#unicodedata.normalize; Unicode Standard Annex #15)
  and :func:`same_name` compares two names after it; :func:`find_spelling` finds the existing path a path names in
  whatever spelling its components are stored. No other file normalises or compares names on its own.
* **Creating.** A name the collection creates from a source name plus a suffix of its own (``<name>.llmops-part``,
  ``<dest>.partial``, ``<dest>.removing-XXXXXXXX``) must fit the filesystem's limit for one name
  (``NAME_MAX``: ``os.pathconf(dir, "PC_NAME_MAX")``, 255 bytes on ext4, XFS and Btrfs; bytes, not characters)
  and the kernel's limit for a whole path (``PATH_MAX``, 4096 bytes on Linux). :func:`check_component` and
  :func:`check_path` refuse one that does not, naming the file, its length and the limit, before anything is
  created: a copy never stops half-way on ``ENAMETOOLONG`` leaving a lock and a build directory behind.
* **Encoding.** The collection's records (stage marker, journal, fan-out wire, cache manifest) are JSON, so names
  are UTF-8. A name that is not (Python hands it over with lone surrogates, PEP 383 ``surrogateescape``; its bytes
  are ``os.fsencode(name)``) is refused up front by :func:`check_encoding`, shown by :func:`shown` as an ASCII
  ``repr`` of its bytes, and never passed on.
"""
from __future__ import annotations

import os
import unicodedata

#: ``NAME_MAX`` and ``PATH_MAX`` where ``os.pathconf`` cannot tell (Linux ``<linux/limits.h>``).
NAME_MAX = 255
PATH_MAX = 4096


class NameRefused(ValueError):
    """A name the collection cannot compare, create or record; ``str()`` names the field, the file and the fix.

    ``reason`` is ``name_too_long``, ``path_too_long`` or ``not_utf8``; ``file`` the offending path as
    :func:`shown` spells it.
    """

    def __init__(self, msg, field, file, reason):
        super(NameRefused, self).__init__(msg)
        self.field = field
        self.file = file
        self.reason = reason


def normal(name):
    """``name`` in Unicode normalisation form C (see the module docstring)."""
    return unicodedata.normalize("NFC", name)


def same_name(a, b):
    """``a`` and ``b`` are the same name once both are normalised (NFC), whatever their spellings."""
    return a == b or normal(a) == normal(b)


def is_utf8(name):
    """``name`` (a ``str`` from ``os.listdir`` and friends, or ``bytes``) is valid UTF-8."""
    try:
        if isinstance(name, bytes):
            name.decode("utf-8")
        else:
            name.encode("utf-8")
        return True
    except UnicodeError:
        return False


def shown(name):
    """``name`` as it is safe to print: itself when it is UTF-8 and printable, otherwise the ASCII ``repr`` of its
    bytes (``b'caf\\xe9.bin'``): never a lone surrogate or a control character in a message or a result."""
    if isinstance(name, str) and is_utf8(name) and name.isprintable():
        return name
    return ascii(os.fsencode(name))


def check_encoding(name, field, path=None):
    """Refuse ``name`` (one component or a path) unless it is UTF-8; ``path`` is what the message names."""
    if is_utf8(name):
        return
    where = shown(path if path is not None else name)
    raise NameRefused("%s: %s has a name that is not valid UTF-8; the collection records names as UTF-8 text, so "
                      "it cannot stage it faithfully; rename it (e.g. convmv -f latin1 -t utf-8) and run again"
                      % (field, where), field, where, "not_utf8")


def _limit(directory, which, default):
    """``os.pathconf`` of the nearest existing directory at or above ``directory``; ``default`` where unknown."""
    d = os.path.abspath(directory or ".")
    while d and not os.path.isdir(d):
        parent = os.path.dirname(d)
        if parent == d:
            break
        d = parent
    try:
        value = os.pathconf(d, which)
    except (OSError, ValueError):
        return default
    return value if isinstance(value, int) and value > 0 else default


def name_max(directory):
    """The longest name, in bytes, the filesystem holding ``directory`` (or its nearest existing parent) takes."""
    return _limit(directory, "PC_NAME_MAX", NAME_MAX)


def path_max(directory):
    """The longest path, in bytes, the kernel takes for ``directory``'s filesystem."""
    return _limit(directory, "PC_PATH_MAX", PATH_MAX)


def check_component(name, suffixes, field, directory=None, limit=None, path=None):
    """Refuse ``name`` when it, or it with the longest of ``suffixes`` appended, is longer than ``limit`` bytes
    (default: :func:`name_max` of ``directory``). A suffix with a variable part is given in its longest form
    (``.removing-XXXXXXXX``). ``path`` is what the message names (default ``name``)."""
    limit = limit or name_max(directory)
    size = len(os.fsencode(name))
    longest, suffix = size, ""
    for s in suffixes:
        if size + len(os.fsencode(s)) > longest:
            longest, suffix = size + len(os.fsencode(s)), s
    if longest <= limit:
        return
    where = shown(path if path is not None else name)
    added = " (%d with the suffix %s the collection adds to it)" % (longest, suffix) if suffix else ""
    raise NameRefused("%s: %s has a %d-byte name%s, over the %d-byte limit for one name on the filesystem of %s "
                      "(NAME_MAX); shorten the name by %d bytes and run again"
                      % (field, where, size, added, limit, directory or "dest", longest - limit),
                      field, where, "name_too_long")


def check_path(path, field, directory=None, limit=None, shown_as=None):
    """Refuse ``path`` (one the collection will create) when it is ``limit`` bytes or longer (PATH_MAX counts the
    terminating NUL). ``shown_as`` is what the message names (default ``path``)."""
    limit = limit or path_max(directory or os.path.dirname(path))
    size = len(os.fsencode(path))
    if size < limit:
        return
    where = shown(shown_as if shown_as is not None else path)
    raise NameRefused("%s: %s would be written as a %d-byte path, over the %d-byte limit of a path (PATH_MAX); "
                      "use a shorter dest or shorter directory names in the revision"
                      % (field, where, size, limit), field, where, "path_too_long")


def find_spelling(path):
    """The existing path that ``path`` names when its components are compared with :func:`same_name` (the path
    itself when it exists; None when no entry matches, or when two entries of one directory do)."""
    if os.path.lexists(path):
        return path
    if not os.path.isabs(path):
        path = os.path.join(os.getcwd(), path)
    here = "/"
    for part in [p for p in path.split("/") if p]:  # ".." stays: the kernel resolves it after a symlink
        candidate = os.path.join(here, part)
        if not os.path.lexists(candidate):
            try:
                entries = os.listdir(here)
            except OSError:
                return None
            found = [e for e in entries if same_name(e, part)]
            if len(found) != 1:
                return None
            candidate = os.path.join(here, found[0])
        here = candidate
    return here
