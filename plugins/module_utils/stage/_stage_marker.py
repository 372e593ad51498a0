# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: what model_stage records about a staged copy, and when that record is trusted.

Two files hold the record, both made of :class:`FileRecord` entries:

* ``<dest>/.llmops-staged.json``, the completion marker: ``format``, ``source`` (real path of src), ``verify``,
  ``host``, ``staged_at``, ``sequence``, ``files`` and, where files carry piece digests, ``piece_size``. Format 3
  adds the piece digests; a format 2 marker is read as before (its files simply have none). It is written into
  ``<dest>.partial`` and published with it. ``sequence`` is the revision's place in the publish order beside it
  (``_clock.next_sequence`` under ``_clock.sequence_lock`` of the parent, see ``_stage_publish``): pruning keeps
  the newest by it, never by ``staged_at`` (a wall time, for people) or an mtime. A marker without one (written
  before sequences existed) is valid and counts as older than every marker with one.
* ``<dest>.partial/.llmops-staged.journal``: one JSON line per file completed in the partial dir, so a resumed
  run (possibly from another source) knows where each file came from.

A :class:`FileRecord` identifies one copied file by content and by identity:

* ``size``; ``header_sha256`` (sha256 of the safetensors header bytes, verify ``headers``/``sha256``) and
  ``sha256`` (of all bytes, computed during the copy with verify ``sha256``);
* ``src``: the source file's ``dev``, ``ino``, ``mtime_ns`` and ``ctime_ns`` when it was read. ``ctime`` cannot be
  set by a user, so a source file rewritten in place (even with its mtime put back) or replaced by another
  revision's file with the same size and mtime does not match;
* ``copy``: the copy's ``ino``, ``size``, ``mtime_ns`` and ``ctime_ns`` once it reached its final place, so a
  re-run sees with one ``lstat`` whether the copy was removed, resized or rewritten since;
* ``verify``: the strongest check this copy passed;
* ``pieces`` (format 3, optional): the sha256 of each ``piece_size`` piece of the file, computed from the bytes
  read from the source while copying (or read back from a copy this module made and still proves intact). They
  let peers hand the file on piece by piece (``_stage_fanout``); a record without them is as valid as before,
  it only cannot seed peers until its pieces are read back.

The rules (used by every path that decides to keep a file instead of copying it):

* :meth:`FileRecord.damage` - the copy is intact iff it is a regular file, reached without symlinks, whose
  ``lstat`` equals ``copy``.
* :meth:`FileRecord.same_source` - the copy is of source file ``f`` iff the sizes are equal, the header digests
  are equal where both are known, and either ``f``'s identity equals ``src`` (``dev`` may differ when the record's
  source directory is ``f``'s, as after a remount) or both sides know a sha256 and they are equal.

Every path read back from these files or from a checksums manifest goes through ``_paths`` before it is used;
a marker that is not valid JSON of this shape means "not staged" (the revision is staged again), never a
traceback. Error messages name the file and what is wrong, never its content.
"""
from __future__ import annotations

import errno
import json
import os
import re
import socket
import stat
import threading
import time

from ansible_collections.llmops.serving.plugins.module_utils.common import _clock
from ansible_collections.llmops.serving.plugins.module_utils.common import _fsutil
from ansible_collections.llmops.serving.plugins.module_utils.common import _paths
from ansible_collections.llmops.serving.plugins.module_utils.common._untrusted import (
    UntrustedInput, load_json, loads_json, read_bytes)

MARKER = ".llmops-staged.json"
JOURNAL = ".llmops-staged.journal"
RESERVED_TOP = ".llmops-staged"   # top-level names starting with this belong to model_stage
PART_SUFFIX = ".llmops-part"      # a file being written
MARKER_FORMAT = 3
READ_FORMATS = (2, 3)             # format 2: the same, without piece digests
VERIFY_MODES = ("size", "headers", "sha256")
MAX_MARKER_BYTES = 256 * 1024 * 1024
MAX_CHECKSUMS_BYTES = 64 * 1024 * 1024
_HEX = frozenset("0123456789abcdef")
_SHA256_HEX = re.compile("[0-9a-f]{64}")
PIECE_ALIGN = 4096                # piece boundaries stay O_DIRECT-aligned


class StageError(Exception):
    """Staging refused or failed; ``str()`` names the option or file and the fix.

    ``file`` and ``reason`` (a short machine-readable cause), where set, go into the module's failed result.
    """

    def __init__(self, msg, file=None, reason=None):
        super(StageError, self).__init__(msg)
        self.file = file
        self.reason = reason


def strength(mode):
    return VERIFY_MODES.index(mode) if mode in VERIFY_MODES else -1


def min_level(records):
    """The marker's ``verify``: the weakest check any of its files passed (``sha256`` for none)."""
    return min((r.verify for r in records), key=strength, default="sha256")


def reserved(rel):
    """Why the relative source path ``rel`` collides with model_stage's own names, or None."""
    parts = rel.split("/")
    if parts[0].startswith(RESERVED_TOP):
        return "top-level names starting with %s are model_stage's marker and journal" % RESERVED_TOP
    for p in parts:
        if p.endswith(PART_SUFFIX):
            return "names ending in %s are model_stage's in-flight files" % PART_SUFFIX
    return None


def src_identity(st):
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)


def copy_stat(st):
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class RecordError(ValueError):
    """A marker or journal entry is not of the expected shape."""


def _uint(doc, key, where):
    v = doc.get(key) if isinstance(doc, dict) else None
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise RecordError("%s: %s must be a non-negative integer" % (where, key))
    return v


def _digest(doc, key, where):
    v = doc.get(key)
    if v is None:
        return None
    if not is_sha256(v):
        raise RecordError("%s: %s must be 64 lowercase hex digits" % (where, key))
    return v


def is_sha256(v):
    """``v`` is a sha256 as the collection writes it: 64 lowercase hex digits (a piece server checks every digest
    of its node's board several times a second: one regular expression, no set per digest)."""
    return isinstance(v, str) and _SHA256_HEX.fullmatch(v) is not None


def piece_count(size, piece_size):
    """Pieces of a ``size``-byte file: piece i is bytes ``[i * piece_size, min((i + 1) * piece_size, size))``."""
    return (size + piece_size - 1) // piece_size


def valid_piece_size(v):
    return isinstance(v, int) and not isinstance(v, bool) and v > 0 and v % PIECE_ALIGN == 0


def _pieces(doc, size, piece_size, where):
    v = doc.get("pieces")
    if v is None:
        return None
    if piece_size is None:
        raise RecordError("%s: pieces without a piece_size" % where)
    if not isinstance(v, list) or len(v) != piece_count(size, piece_size):
        raise RecordError("%s: pieces must list %d digests (%d bytes in %d-byte pieces)"
                          % (where, piece_count(size, piece_size), size, piece_size))
    for d in v:
        if not is_sha256(d):
            raise RecordError("%s: pieces must be 64 lowercase hex digits each" % where)
    return v


class FileRecord(object):
    """What is known about one staged file (see the module docstring)."""

    __slots__ = ("path", "size", "src", "copy", "verify", "header_sha256", "sha256", "pieces", "piece_size")

    def __init__(self, path, size, src, copy, verify, header_sha256=None, sha256=None, pieces=None,
                 piece_size=None):
        self.path = path
        self.size = size
        self.src = tuple(src)
        self.copy = tuple(copy)
        self.verify = verify
        self.header_sha256 = header_sha256
        self.sha256 = sha256
        self.pieces = list(pieces) if pieces is not None else None
        self.piece_size = piece_size if pieces is not None else None

    def has_pieces(self, piece_size):
        """The record carries the digests of every ``piece_size`` piece of the file."""
        return self.pieces is not None and self.piece_size == piece_size

    def set_pieces(self, pieces, piece_size):
        if pieces is not None and len(pieces) != piece_count(self.size, piece_size):
            raise ValueError("%s: %d piece digests for %d bytes in %d-byte pieces"
                             % (self.path, len(pieces), self.size, piece_size))
        self.pieces = list(pieces) if pieces is not None else None
        self.piece_size = piece_size if pieces is not None else None

    def to_json(self):
        d = {"path": self.path, "size": self.size, "verify": self.verify,
             "src": dict(zip(("dev", "ino", "mtime_ns", "ctime_ns"), self.src)),
             "copy": dict(zip(("ino", "size", "mtime_ns", "ctime_ns"), self.copy))}
        if self.header_sha256:
            d["header_sha256"] = self.header_sha256
        if self.sha256:
            d["sha256"] = self.sha256
        if self.pieces is not None:
            d["pieces"] = list(self.pieces)
        return d

    @classmethod
    def from_json(cls, doc, where, piece_size=None):
        if not isinstance(doc, dict):
            raise RecordError("%s: entry is not an object" % where)
        path = doc.get("path")
        try:
            _paths.split_relative(path, "path")
        except _paths.PathEscape as e:
            raise RecordError("%s: path %s" % (where, e.why))
        where = "%s %s" % (where, path)
        if doc.get("verify") not in VERIFY_MODES:
            raise RecordError("%s: verify must be one of %s" % (where, ", ".join(VERIFY_MODES)))
        src, copy = doc.get("src"), doc.get("copy")
        if not isinstance(src, dict) or not isinstance(copy, dict):
            raise RecordError("%s: src and copy must be objects" % where)
        size = _uint(doc, "size", where)
        pieces = _pieces(doc, size, piece_size, where)
        return cls(path, size,
                   tuple(_uint(src, k, where + " src") for k in ("dev", "ino", "mtime_ns", "ctime_ns")),
                   tuple(_uint(copy, k, where + " copy") for k in ("ino", "size", "mtime_ns", "ctime_ns")),
                   doc["verify"], _digest(doc, "header_sha256", where), _digest(doc, "sha256", where),
                   pieces, piece_size if pieces is not None else None)

    def damage(self, root):
        """Why the copy of this file under ``root`` is not the one recorded, or None when it is intact."""
        try:
            path = _paths.contained(root, self.path, "marker")
        except _paths.PathEscape:
            return "replaced in dest: its path goes through a symlink or a file"
        try:
            st = os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            return "removed from dest after publish"
        if not stat.S_ISREG(st.st_mode):
            return "replaced in dest by something that is not a regular file"
        if st.st_size != self.copy[1]:
            return "resized in dest after publish (%d bytes, staged %d)" % (st.st_size, self.copy[1])
        if copy_stat(st) != self.copy:
            return "rewritten in dest after publish (inode, mtime or ctime changed)"
        return None

    def same_source(self, f, src_root, record_source, header_sha256=None, manifest_sha256=None):
        """``(same, exact)``: this copy is of source file ``f``; ``exact`` when the recorded identity is f's."""
        if self.size != f["size"]:
            return False, False
        if header_sha256 and self.header_sha256 and header_sha256 != self.header_sha256:
            return False, False
        ident = (f["dev"], f["ino"], f["mtime_ns"], f["ctime_ns"])
        if self.src == ident:
            return True, True
        if record_source == src_root and self.src[1:] == ident[1:]:
            return True, False
        if manifest_sha256 and self.sha256 == manifest_sha256:
            return True, False
        return False, False


class Marker(object):
    def __init__(self, source, verify, staged_at, records, piece_size=None, sequence=None):
        self.source = source
        self.piece_size = piece_size
        self.verify = verify
        self.staged_at = staged_at
        self.sequence = sequence        # None: written before sequences existed
        self.records = records          # list, in file order
        self.files = dict((r.path, r) for r in records)


class MarkerState(object):
    """``kind``: ``none`` (no marker), ``foreign`` (something else has the marker's name), ``bad`` (a marker file
    that is not a valid one: not staged, but ours) or ``ok``."""

    def __init__(self, kind, marker=None, reason=None):
        self.kind = kind
        self.marker = marker
        self.reason = reason


def parse_marker(doc, where):
    if not isinstance(doc, dict):
        raise RecordError("%s is not a JSON object" % where)
    fmt = doc.get("format")
    if fmt not in READ_FORMATS or isinstance(fmt, bool):
        raise RecordError("%s has format %r, this version reads formats %s (content identity and copy stats)"
                          % (where, fmt if isinstance(fmt, int) else type(fmt).__name__,
                             " and ".join(str(x) for x in READ_FORMATS)))
    piece_size = doc.get("piece_size")
    if piece_size is not None and (fmt < 3 or not valid_piece_size(piece_size)):
        raise RecordError("%s: piece_size must be a positive multiple of %d" % (where, PIECE_ALIGN))
    source = doc.get("source")
    if not isinstance(source, str) or not source.startswith("/"):
        raise RecordError("%s: source must be an absolute path" % where)
    if doc.get("verify") not in VERIFY_MODES:
        raise RecordError("%s: verify must be one of %s" % (where, ", ".join(VERIFY_MODES)))
    staged_at = doc.get("staged_at")
    if not isinstance(staged_at, (int, float)) or isinstance(staged_at, bool):
        raise RecordError("%s: staged_at must be a number" % where)
    sequence = doc.get("sequence")
    if sequence is not None and not _clock.valid_sequence(sequence):
        raise RecordError("%s: sequence must be an integer of at least 1" % where)
    files = doc.get("files")
    if not isinstance(files, list):
        raise RecordError("%s: files must be a list" % where)
    records, seen = [], set()
    for i, entry in enumerate(files):
        r = FileRecord.from_json(entry, "%s files[%d]" % (where, i), piece_size)
        if r.path in seen:
            raise RecordError("%s lists %s twice" % (where, r.path))
        seen.add(r.path)
        records.append(r)
    return Marker(source, doc["verify"], float(staged_at), records, piece_size, sequence)


def _read_json_file(path, limit):
    """Parsed JSON of a regular file (not followed through a symlink) or RecordError: the shared reader refuses
    a FIFO or device without blocking, more than ``limit`` bytes, nesting and numbers out of range (a
    ``staged_at`` of ``10**400`` is an invalid marker, never an OverflowError)."""
    try:
        return load_json(path, max_bytes=limit, follow=False)
    except FileNotFoundError as e:
        raise RecordError("cannot be read (%s)" % e.strerror)
    except UntrustedInput as e:
        if e.limit in ("syntax", "encoding"):
            raise RecordError("is not valid UTF-8 JSON")
        raise RecordError(str(e))


def read_marker(directory):
    """The :class:`MarkerState` of ``directory``."""
    path = os.path.join(directory, MARKER)
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return MarkerState("none")
    if not stat.S_ISREG(st.st_mode):
        kind = "symlink" if stat.S_ISLNK(st.st_mode) else "directory" if stat.S_ISDIR(st.st_mode) else "special file"
        return MarkerState("foreign", reason="%s is a %s, not a marker file" % (path, kind))
    try:
        doc = _read_json_file(path, MAX_MARKER_BYTES)
        return MarkerState("ok", marker=parse_marker(doc, path))
    except RecordError as e:
        msg = str(e)
        return MarkerState("bad", reason=msg if msg.startswith(path) else "%s %s" % (path, msg))


def marker_piece_size(records):
    """The one piece size of the records that carry pieces (None when none does); records with another piece
    size lose their pieces in the marker (a marker has one piece size)."""
    sizes = [r.piece_size for r in records if r.pieces is not None]
    return max(set(sizes), key=sizes.count) if sizes else None


def write_marker(directory, source, verify, records, fsync=True, piece_size=None, sequence=None):
    """Write the marker into ``directory`` atomically (``_fsutil.atomic_write_json``); ``piece_size`` (default:
    the one most records carry) is the piece size whose digests it keeps; ``sequence`` its place in the publish
    order (``_stage_publish.publish_sequence``; None writes none)."""
    piece_size = piece_size or marker_piece_size(records)
    files = []
    for r in records:
        d = r.to_json()
        if r.piece_size != piece_size:
            d.pop("pieces", None)
        files.append(d)
    doc = {"format": MARKER_FORMAT, "source": source, "verify": verify, "host": socket.gethostname(),
           "staged_at": time.time(), "files": files}
    if piece_size:
        doc["piece_size"] = piece_size
    if sequence is not None:
        doc["sequence"] = sequence
    _fsutil.atomic_write_json(os.path.join(directory, MARKER), doc, mode=0o644, fsync=fsync, indent=1, sort_keys=True)


class Journal(object):
    """Append-only record of the files completed in ``<dest>.partial`` (one JSON line each, last one wins)."""

    def __init__(self, partial, source):
        self.path = os.path.join(partial, JOURNAL)
        self.source = source
        self._lock = threading.Lock()
        # O_NONBLOCK: a FIFO put in the journal's place fails the open (no reader) instead of blocking it
        refused = StageError("dest: %s is not a regular file; remove %s and run again" % (self.path, partial),
                             file=self.path, reason="not_regular")
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
        except OSError as e:
            if e.errno in (errno.ENXIO, errno.ELOOP):  # a FIFO without a reader; a symlink
                raise refused
            raise
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise refused
        self.fd = fd

    def append(self, record):
        d = record.to_json()
        d["source"] = self.source
        if record.pieces is not None:
            d["piece_size"] = record.piece_size
        line = (json.dumps(d, sort_keys=True, separators=(",", ":")) + "\n").encode("utf-8")
        with self._lock:
            os.write(self.fd, line)

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def partial_records(partial):
    """``{path: (FileRecord, source)}`` for files a previous run completed in ``partial``.

    Read from the journal, or from the marker a run wrote just before publishing. Lines that do not parse (a run
    killed mid-write) are ignored: the files they describe are copied again.
    """
    out = {}
    ms = read_marker(partial)
    if ms.kind == "ok":
        for r in ms.marker.records:
            out[r.path] = (r, ms.marker.source)
    path = os.path.join(partial, JOURNAL)
    try:
        lines = read_bytes(path, max_bytes=MAX_MARKER_BYTES, follow=False).split(b"\n")
    except (OSError, UntrustedInput):
        return out  # no journal, or not one this module wrote: the files are copied again
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            doc = loads_json(line, "%s line %d" % (path, i + 1), file=path)
            ps = doc.get("piece_size") if isinstance(doc, dict) else None
            rec = FileRecord.from_json(doc, "%s line %d" % (path, i + 1), ps if valid_piece_size(ps) else None)
            source = doc.get("source")
            if not isinstance(source, str) or not source.startswith("/"):
                continue
        except (UnicodeDecodeError, ValueError, RecursionError):
            continue
        out[rec.path] = (rec, source)
    return out


# ---- checksums manifests ---------------------------------------------------------------------------
def _unescape_name(name):
    # GNU sha256sum writes '\' before the digest and escapes '\\' and '\n' in names that contain them
    out, i = [], 0
    while i < len(name):
        c = name[i]
        if c == "\\" and i + 1 < len(name) and name[i + 1] in "\\n":
            out.append("\n" if name[i + 1] == "n" else "\\")
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def load_checksums(path):
    """Parse a ``sha256sum`` manifest: ``<64 hex> [ *]<relative path>`` per line -> ``{path: digest}``.

    Every name must be a plain relative path (``_paths.split_relative``: no ``..``, not absolute); a leading
    ``./`` is dropped. The file must be a regular UTF-8 text file.
    """
    try:
        data = read_bytes(path, "checksums", max_bytes=MAX_CHECKSUMS_BYTES)
    except OSError as e:
        raise StageError("checksums: cannot read %s: %s" % (path, e.strerror), file=path, reason="unreadable")
    except UntrustedInput as e:
        if e.limit == "type":
            raise StageError("checksums: %s is not a regular file; point checksums at a sha256sum manifest" % path,
                             file=path, reason="not_regular")
        if e.limit == "size":
            raise StageError("checksums: %s is over %d bytes, more than a manifest of a revision can be; point "
                             "checksums at the revision's sha256sum manifest" % (path, MAX_CHECKSUMS_BYTES),
                             file=path, reason="too_large")
        raise StageError("%s; point checksums at a sha256sum manifest" % e, file=path, reason="unreadable")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise StageError("checksums: %s is not UTF-8 text; point checksums at a sha256sum manifest" % path,
                         file=path, reason="not_utf8")
    sums = {}
    for lineno, line in enumerate(text.split("\n"), 1):
        if not line.strip() or line.startswith("#"):
            continue
        escaped = line.startswith("\\")
        if escaped:
            line = line[1:]
        digest, sep, name = line.partition(" ")
        if not sep or len(digest) != 64 or not set(digest.lower()) <= _HEX:
            raise StageError("checksums: %s line %d is not '<sha256>  <file>'; regenerate it with sha256sum"
                             % (path, lineno))
        if name[:1] in (" ", "*"):
            name = name[1:]
        if escaped:
            name = _unescape_name(name)
        while name.startswith("./"):
            name = name[2:]
        try:
            _paths.split_relative(name, "checksums", os.path.dirname(os.path.abspath(path)))
        except _paths.PathEscape as e:
            raise StageError("checksums: %s line %d names a file that %s; list files by their path relative to "
                             "src" % (path, lineno, e.why))
        digest = digest.lower()
        if sums.get(name, digest) != digest:
            raise StageError("checksums: %s line %d gives %s a second, different digest; regenerate the manifest"
                             % (path, lineno, name))
        sums[name] = digest
    return sums
