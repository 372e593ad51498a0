# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: where model_stage reads and writes, refused before anything changes when
those places overlap.

The rule: ``src`` is only ever read. model_stage writes or deletes ``dest``, ``<dest>.partial``,
``<dest>.lock``, ``<dest>.removing-*``, the progress file and the fleet lease directory, and none of them may be
``src``, inside it or contain it, after resolving symlinks (``_paths.overlaps`` / ``_paths.is_within``). The
checksums manifest is read and must not lie inside what a run replaces (``dest``, ``<dest>.partial``).

``dest`` itself must not be a symlink: publishing replaces a real directory, and writing through a link would
change the revision the link points to. Its parent is resolved, so two spellings of one ``dest`` (a symlinked
root) share one lock and one partial dir.

The source listing (:func:`scan_src`) copies regular files. A file symlink is followed only when its target is
inside ``src``; a symlink leaving ``src``, a directory symlink (never followed: it could leave ``src`` or loop),
a dangling link, a FIFO, socket or device, an unreadable directory and a name model_stage reserves for its own
files (``_stage_marker.reserved``) are refused with the path and the fix, so a listing is never silently
incomplete.

Names (``_names``): ``dest``'s name with the suffixes model_stage adds beside it (``.partial``, ``.lock``,
``.removing-XXXXXXXX``) and every source name with the one it adds in the build directory (``.llmops-part``) must
fit the dest filesystem's ``NAME_MAX``, every path written under ``<dest>.partial`` its ``PATH_MAX``, and every
name must be UTF-8 (the marker, the journal and the fan-out wire record names as JSON text).
:func:`check_src_names` refuses one that does not, naming the file and the limit, before the lock is taken or
anything is created; :func:`scan_src` applies the same rule to what it lists.

:func:`revisions` lists the staged revisions beside ``dest`` (real directories with a marker file) for pruning
and for the publish order (``_stage_publish``).

Deleting there goes through :func:`remove_tree`: the tree first vanishes from its name in one ``rename`` (to
``<name>.removing-<random>``, which no listing or prune counts as a revision), then the renamed tree is deleted,
so no reader ever sees a half-deleted revision under its name.
"""
from __future__ import annotations

import os
import shutil
import stat
import uuid

from ansible_collections.llmops.serving.plugins.module_utils.common import _names
from ansible_collections.llmops.serving.plugins.module_utils.common import _paths
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_marker
from ansible_collections.llmops.serving.plugins.module_utils.stage._stage_marker import StageError

PARTIAL_SUFFIX = ".partial"
LOCK_SUFFIX = ".lock"
REMOVING_INFIX = ".removing-"
#: What model_stage appends to dest's name beside it, each in its longest form (:func:`remove_tree`'s grave).
DEST_SUFFIXES = (PARTIAL_SUFFIX, LOCK_SUFFIX, REMOVING_INFIX + "x" * 8)
#: What it appends to a source file's name in the build directory (a file in flight).
FILE_SUFFIXES = (_stage_marker.PART_SUFFIX,)


def check_dest(dest):
    """The rule for ``dest`` before anything is prepared (a plain copy and the fan-out's options alike);
    ``ValueError`` names the option and the fix."""
    if not isinstance(dest, str) or not dest or "\x00" in dest:
        raise ValueError("dest: must be a path; set it to <dest root>/<name>/<revision> on node-local storage")
    if not os.path.isabs(dest):
        raise ValueError("dest: %s is relative; give an absolute path under the node-local dest root" % dest)
    if os.path.realpath(dest) == "/":  # "//", "/.", "/x/.." and a link to / are all the root
        raise ValueError("dest: must not be the root directory; use <dest root>/<name>/<revision>")


def _refuse_name(e):
    return StageError(str(e), file=e.file, reason=e.reason)


class Layout(object):
    """The paths of one staging target; ``dest`` as given, ``real`` with its parent resolved."""

    def __init__(self, dest):
        self.dest = os.path.abspath(dest)
        # the name as given and its parent resolved as the kernel resolves it: "root/link/../rev" is the
        # revision beside link's target, not "root/rev" (what a lexical normalisation would say)
        given = dest.rstrip("/") or dest
        name = os.path.basename(given)
        if not name or name in (".", ".."):
            raise StageError("dest: %s does not name a directory; use <root>/<name>/<revision>" % dest)
        self.parent = os.path.realpath(os.path.dirname(given) or ".")
        try:
            _names.check_encoding(name, "dest", dest)
            _names.check_component(name, DEST_SUFFIXES, "dest", self.parent, path=dest)
        except _names.NameRefused as e:
            raise _refuse_name(e)
        if os.path.realpath(os.path.dirname(self.dest)) != self.parent:
            self.dest = os.path.join(self.parent, name)  # never show a spelling that names another directory
        self.real = os.path.join(self.parent, name)
        self.partial = self.real + PARTIAL_SUFFIX
        self.lock = self.real + LOCK_SUFFIX
        self.name = name

    def check_not_links(self):
        """``dest`` and ``<dest>.partial`` are real directories or absent (checked again under the lock)."""
        for what, path in (("dest", self.real), ("dest", self.partial)):
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            if stat.S_ISLNK(st.st_mode):
                raise StageError(
                    "dest: %s is a symlink (to %s); model_stage publishes a real directory there and never writes "
                    "through a link, which would change the revision it points to; stage to the real revision "
                    "directory and point the link at it afterwards" % (path, os.path.realpath(path)))
            if not stat.S_ISDIR(st.st_mode):
                raise StageError("%s: %s exists and is not a directory; remove it or choose another dest"
                                 % (what, path))


def resolve(src, dest):
    """Check ``src`` and ``dest`` against each other; returns ``(src_real, Layout)``."""
    src_abs = os.path.abspath(src)
    if not os.path.isdir(src_abs):
        raise StageError("src: %s is not a directory; point src at the revision directory on the shared "
                         "filesystem" % src_abs)
    src_real = os.path.realpath(src_abs)
    lay = Layout(dest)
    shown = "" if src_real == src_abs else " (%s after resolving symlinks)" % src_real
    if _paths.overlaps(lay.real, src_real):
        raise StageError("dest: %s overlaps src %s%s; src is only read, so stage to a directory outside src and "
                         "keep src outside dest" % (lay.dest, src_abs, shown))
    for what, path in (("build directory", lay.partial), ("lock file", lay.lock)):
        if _paths.overlaps(path, src_real):
            raise StageError("src: %s%s is (or is inside) %s, the %s model_stage writes and deletes for dest %s; "
                             "move the revision or choose another dest" % (src_abs, shown, path, what, lay.dest))
    if _paths.same_path(os.path.dirname(src_real), lay.parent) and os.path.basename(src_real).startswith(lay.name + REMOVING_INFIX):
        raise StageError("src: %s is named like a revision being deleted next to dest %s; rename it or choose "
                         "another dest" % (src_abs, lay.dest))
    lay.check_not_links()
    return src_real, lay


def check_side_paths(src_real, lay, progress_file=None, checksums=None, fleet_slots_dir=None):
    """The progress file, the checksums manifest and the lease directory stay out of src and dest."""
    replaced = ((lay.real, "dest"), (lay.partial, "dest's build directory"))
    if progress_file:
        p = os.path.abspath(progress_file)
        if _paths.is_within(p, src_real):
            raise StageError("progress_file: %s is inside src %s, which is only read; put the progress file "
                             "outside the revision (e.g. /var/tmp/llmops/)" % (p, src_real))
        for root, what in replaced:
            if _paths.is_within(p, root):
                raise StageError("progress_file: %s is inside %s %s, which staging replaces; put it outside the "
                                 "revision (e.g. /var/tmp/llmops/)" % (p, what, root))
        if _paths.same_path(p, lay.lock):
            raise StageError("progress_file: %s is dest's lock file; choose another path" % p)
        if checksums and _paths.same_path(p, checksums):
            raise StageError("progress_file: %s is the checksums manifest; choose another path" % p)
    if checksums:
        c = os.path.abspath(checksums)
        for root, what in replaced:
            if _paths.is_within(c, root):
                raise StageError("checksums: %s is inside %s %s, which staging replaces; keep the manifest in src "
                                 "or next to it" % (c, what, root))
    if fleet_slots_dir:
        d = os.path.abspath(fleet_slots_dir)
        if _paths.overlaps(d, src_real):
            raise StageError("fleet_slots_dir: %s overlaps src %s, which is only read, and leases are written "
                             "there; use a directory outside the revision (e.g. <shared>/.llmops/stage-slots)"
                             % (d, src_real))
        for root, what in replaced:
            if _paths.overlaps(d, root):
                raise StageError("fleet_slots_dir: %s overlaps %s %s; use a directory outside the revision"
                                 % (d, what, root))


class _NameRule(object):
    """The name rule of one run (``_names``): every source name UTF-8; a file's name with ``.llmops-part``
    within the dest filesystem's ``NAME_MAX``; its path in the build directory within ``PATH_MAX``."""

    def __init__(self, lay):
        self.partial = lay.partial if lay else None
        where = lay.parent if lay else None
        self.name_max = _names.name_max(where) if lay else _names.NAME_MAX
        self.path_max = _names.path_max(where) if lay else _names.PATH_MAX

    def check(self, rel, full, is_file):
        try:
            _names.check_encoding(full, "src")
            _names.check_component(os.path.basename(rel), FILE_SUFFIXES if is_file else (), "src",
                                   limit=self.name_max, path=full)
            if self.partial:
                _names.check_path(os.path.join(self.partial, rel) + (FILE_SUFFIXES[0] if is_file else ""), "src",
                                  limit=self.path_max, shown_as=full)
        except _names.NameRefused as e:
            raise _refuse_name(e)


def check_src_names(src_real, lay):
    """Refuse a name under ``src_real`` that dest's filesystem cannot hold with model_stage's suffixes, or that is
    not UTF-8 (see the module docstring); reads names only, before the lock is taken."""
    rule = _NameRule(lay)
    prefix = src_real.rstrip("/") + "/"

    def walk_error(err):
        raise StageError("src: cannot list %s: %s; make the revision readable"
                         % (_names.shown(err.filename), err.strerror))

    for dirpath, dirnames, filenames in os.walk(src_real, onerror=walk_error):
        for d in dirnames:
            full = os.path.join(dirpath, d)
            rule.check(full[len(prefix):], full, False)
        for fn in filenames:
            full = os.path.join(dirpath, fn)
            rule.check(full[len(prefix):], full, True)


def scan_src(root, lay=None):
    """Regular files under ``root`` (a real path): list of dicts sorted by path (see the module docstring);
    names are checked against ``lay``'s filesystem where given (:func:`check_src_names`)."""
    files = []
    rule = _NameRule(lay)

    def walk_error(err):
        raise StageError("src: cannot list %s: %s; make the revision readable" % (err.filename, err.strerror))

    prefix = root.rstrip("/") + "/"
    for dirpath, dirnames, filenames in os.walk(root, onerror=walk_error):
        dirnames.sort()
        for d in dirnames:
            full = os.path.join(dirpath, d)
            rule.check(full[len(prefix):], full, False)
            _check_name(full[len(prefix):], full)
            if os.path.islink(full):
                raise StageError("src: %s is a symlink to a directory (%s); model_stage does not follow directory "
                                 "links (one could leave src or loop), so the revision would be incomplete; "
                                 "replace the link with the directory it names" % (full, os.path.realpath(full)))
        for fn in sorted(filenames):
            full = os.path.join(dirpath, fn)
            rel = full[len(prefix):]
            rule.check(rel, full, True)
            _check_name(rel, full)
            try:
                st = os.lstat(full)
            except FileNotFoundError:
                raise StageError("src: %s vanished while listing; src must be an immutable revision directory"
                                 % full)
            if stat.S_ISLNK(st.st_mode):
                target = os.path.realpath(full)
                if not _paths.is_within(target, root):
                    raise StageError("src: %s is a symlink that leaves src (to %s); model_stage copies only what "
                                     "is inside the revision; replace the link with the file itself" % (full, target))
                try:
                    st = os.stat(full)
                except OSError:
                    raise StageError("src: %s is a dangling symlink; fix or remove it" % full)
            if not stat.S_ISREG(st.st_mode):
                raise StageError("src: %s is %s, not a regular file; a revision holds regular files only, remove it"
                                 % (full, _kind(st.st_mode)))
            files.append({"path": rel, "size": st.st_size, "mtime_ns": st.st_mtime_ns,
                          "ctime_ns": st.st_ctime_ns, "dev": st.st_dev, "ino": st.st_ino,
                          "mode": st.st_mode & 0o777})
    return files


def _check_name(rel, full):
    why = _stage_marker.reserved(rel)
    if why:
        raise StageError("src: %s has a name model_stage reserves (%s); rename it in the revision, or stage from "
                         "the original revision rather than from a staged copy" % (full, why))


def _kind(mode):
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISDIR(mode):
        return "a directory"
    return "a special file"


def revisions(parent, skip=None):
    """``[(path, MarkerState)]`` of the staged revisions in ``parent``: real directories (never a symlink) holding a
    marker file, valid or not, other than ``skip`` (a name), a build directory, a lock or a tree being deleted;
    sorted by name."""
    out = []
    try:
        names = sorted(os.listdir(parent))
    except OSError:
        return out
    for name in names:
        if name == skip or name.endswith(PARTIAL_SUFFIX) or name.endswith(LOCK_SUFFIX) or REMOVING_INFIX in name:
            continue
        path = os.path.join(parent, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode):
            continue
        ms = _stage_marker.read_marker(path)
        if ms.kind in ("ok", "bad"):
            out.append((path, ms))
    return out


def walk_leaves(root):
    """``(full path, relative path, is_dir_link)`` of everything under ``root`` that is not a directory, in
    ``os.walk`` order; a directory symlink is listed and never entered (it could leave ``root`` or loop)."""
    prefix = root.rstrip("/") + "/"
    for dirpath, dirnames, filenames in os.walk(root):
        for d in list(dirnames):
            full = os.path.join(dirpath, d)
            if os.path.islink(full):
                dirnames.remove(d)
                yield full, full[len(prefix):], True
        for fn in filenames:
            full = os.path.join(dirpath, fn)
            yield full, full[len(prefix):], False


def try_unlink(path):
    """Unlink ``path``; best effort (absent or undeletable is left as it is)."""
    try:
        os.unlink(path)
    except OSError:
        pass


def remove_tree(path):
    """Make ``path`` vanish in one rename, then delete the renamed tree."""
    grave = "%s%s%s" % (path, REMOVING_INFIX, uuid.uuid4().hex[:8])
    os.rename(path, grave)
    shutil.rmtree(grave, ignore_errors=True)


def remove_partial(path):
    """Delete a build directory (or whatever sits at its name, never following a symlink)."""
    if os.path.islink(path) or os.path.isfile(path):
        try_unlink(path)
    elif os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
