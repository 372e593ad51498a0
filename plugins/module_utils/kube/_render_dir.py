# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: render Kubernetes objects into a directory (GitOps), for every renderer.

:func:`manifest_files` turns objects into ``NN-<kind>-<name>.yaml`` texts plus a ``kustomization.yaml`` (and a
module's warnings into ``NOTES.txt`` next to them);
:func:`plan` compares them with the directory without writing (files to write, files rendered before and no
longer produced, per-file before/after), so check mode reports exactly what a real run changes; :func:`write`
applies a plan; :func:`apply` does both and returns the module result keys (``changed``, ``files``,
``changed_files``, ``removed``, ``diff``).

What was rendered before is listed in the marker ``.llmops-manifests.json`` (``{"files": [...]}``). Every entry
read from it goes through :func:`_paths.contained`: an absolute entry, ``..``, a NUL or a path through a
symlink is refused with :class:`RenderDirError` before anything is written, read or deleted. A marker that is
not that JSON (another type, broken JSON, too deep, a symlink, not a regular file) is an error too, not
"absent": treating it as absent would silently leave stale objects in a directory that ``kubectl apply -f``
reads. A stale entry that is now a symlink is removed as a link (never followed, its target never read); a
directory, FIFO or device named by the marker is refused. Diff texts of files that hold a credential are
replaced by a notice (:func:`_secrets.redact_rendered_text`).
"""
from __future__ import annotations

import json
import os
import stat

from ansible_collections.llmops.serving.plugins.module_utils.common import _fsutil, _paths, _secrets
from ansible_collections.llmops.serving.plugins.module_utils.common._untrusted import (
    UntrustedInput, decode, loads_json, read_bytes)

try:
    from ansible.module_utils.common.yaml import HAS_YAML, yaml_dump
except ImportError:  # pragma: no cover - very old ansible-core
    HAS_YAML = False

MARKER = ".llmops-manifests.json"
MAX_MARKER_BYTES = 1 << 20
MAX_DIFF_BYTES = 8 << 20


class RenderDirError(ValueError):
    """The directory cannot be rendered into; ``str()`` names the field, the file and the fix."""

    def __init__(self, msg, file=None):
        super(RenderDirError, self).__init__(msg)
        self.file = file


def dump(obj):
    """One object as YAML, every sub-object written out in full.

    The objects are JSON data (what the API server takes), so a JSON round trip gives each place its own copy:
    a sub-object shared between two places (the P/D pods' downward-API ``fieldRef``) would otherwise be written
    once as an anchor and then as ``*id001`` aliases, which reads badly in a GitOps diff and which kustomize
    4.0-4.3 failed to build (kubernetes-sigs/kustomize#3675).
    """
    if not HAS_YAML:
        return json.dumps(obj, indent=2) + "\n"
    return yaml_dump(json.loads(json.dumps(obj)), default_flow_style=False, sort_keys=False)


def file_name(index, obj):
    return "%02d-%s-%s.yaml" % (index, obj["kind"].lower(), obj["metadata"]["name"])


def manifest_files(objects):
    """``{file name: text}`` in apply order, with a ``kustomization.yaml`` listing them."""
    files = {}
    for i, obj in enumerate(objects):
        files[file_name((i + 1) * 10, obj)] = "---\n" + dump(obj)
    files["kustomization.yaml"] = dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [n for n in files if n != "kustomization.yaml"]})
    return files


#: The renderer's warnings, written next to the objects: what the render could not check or wants a person to
#: read before applying (``kubectl apply -f`` and kustomize read only the YAML files).
NOTES = "NOTES.txt"


def notes_text(warnings):
    """The text of :data:`NOTES` for a render's ``warnings``."""
    lines = ["What this render could not check, or wants read before these objects are applied (the module's",
             "warnings; regenerated on every render, removed when there are none):", ""]
    for w in warnings:
        lines.append("- " + w)
    return "\n".join(lines) + "\n"


def marker_text(names):
    return json.dumps({"files": sorted(names)}, indent=2) + "\n"


class Plan(object):
    """What :func:`write` would do: ``files`` to have, ``stale`` to remove, ``changes`` ``{name: (before, after)}``."""

    def __init__(self, directory, field):
        self.directory = directory
        self.field = field
        self.root = os.path.realpath(directory)
        self.marker = os.path.join(self.root, MARKER)
        self.files = {}
        self.previous = []
        self.stale = []
        self.stale_links = set()
        self.changes = {}
        self.marker_before = None

    @property
    def changed(self):
        return bool(self.changes)


def _marker_error(plan, why, fix):
    return RenderDirError("%s: %s %s; %s. Nothing was changed." % (plan.field, plan.marker, why, fix), file=plan.marker)


def _read_marker(plan):
    """The entries of the marker (``[]`` when there is none) and its text."""
    try:
        st = os.lstat(plan.marker)
    except FileNotFoundError:
        return [], None
    rewrite = "delete it to start over (files it listed are then no longer removed when they go stale)"
    if stat.S_ISLNK(st.st_mode):
        raise _marker_error(plan, "is a symlink, not the file this module writes", "replace it with a regular file or " + rewrite)
    if not stat.S_ISREG(st.st_mode):
        raise _marker_error(plan, "is not a regular file", rewrite)
    # read through the shared reader: swapped for a FIFO or a device after the lstat, it is refused without
    # blocking; nesting, size and numbers are capped
    try:
        raw = read_bytes(plan.marker, max_bytes=MAX_MARKER_BYTES, follow=False)
        text = decode(raw, plan.marker, file=plan.marker)
        data = loads_json(text, plan.marker, file=plan.marker, max_bytes=MAX_MARKER_BYTES)
    except FileNotFoundError:
        return [], None
    except UntrustedInput as e:
        if e.limit == "size":
            raise _marker_error(plan, "is larger than %d bytes, so it is not the list this module writes"
                                % MAX_MARKER_BYTES, rewrite)
        if e.limit == "type":
            raise _marker_error(plan, "is not a regular file", rewrite)
        if e.limit == "depth":
            raise _marker_error(plan, "nests deeper than a list of file names, so it is refused", rewrite)
        if e.limit == "number":
            raise _marker_error(plan, "holds a number out of range, so it is refused", rewrite)
        raise _marker_error(plan, "is not valid JSON", rewrite)
    if not isinstance(data, dict) or not isinstance(data.get("files"), list):
        raise _marker_error(plan, 'is not {"files": [<file name>, ...]} (found a JSON %s)' % type(data).__name__, rewrite)
    return data["files"], text


def _entry(plan, rel, field):
    """``(absolute path, is_link)`` of a marker entry inside the root; a final symlink is the link itself."""
    try:
        return _paths.contained(plan.root, rel, field=field), False
    except _paths.PathEscape:
        parts = _paths.split_relative(rel, field, plan.root)
        parent = _paths.contained(plan.root, "/".join(parts[:-1]), field=field) if len(parts) > 1 else plan.root
        last = os.path.join(parent, parts[-1])
        if os.path.islink(last):
            return last, True
        raise


def _read_text(path):
    """Text of a regular file for the diff (``""`` when absent), or None when it is not a regular file."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return ""
    if not stat.S_ISREG(st.st_mode):
        return None
    if st.st_size > MAX_DIFF_BYTES:
        return "# (previous content not shown: %d bytes)\n" % st.st_size
    try:
        # swapped for a FIFO, a device or a link after the lstat: not a regular file (never waited on)
        return read_bytes(path, max_bytes=MAX_DIFF_BYTES, follow=False).decode("utf-8", "replace")
    except FileNotFoundError:
        return ""
    except UntrustedInput as e:
        if e.limit == "size":
            return "# (previous content not shown: over %d bytes)\n" % MAX_DIFF_BYTES
        return None


def plan(directory, files, field="render_dir"):
    """Compare ``files`` (``{name: text}``) with ``directory`` without writing; raises :class:`RenderDirError`."""
    p = Plan(directory, field)
    p.files = dict(files)
    if os.path.lexists(directory) and not os.path.isdir(directory):
        raise RenderDirError("%s: %s exists and is not a directory; point %s at a directory (it is created when "
                             "missing)" % (field, directory, field), file=directory)
    exists = os.path.isdir(p.root)
    if exists:
        entries, p.marker_before = _read_marker(p)
    else:
        entries = []
    for i, rel in enumerate(entries):
        where = "%s files[%d]" % (p.marker, i)
        try:
            path, is_link = _entry(p, rel, where)
        except _paths.PathEscape as e:
            raise RenderDirError("%s: %s. Nothing was changed." % (field, e), file=p.marker)
        p.previous.append(rel)
        if rel in p.files or rel == MARKER or not os.path.lexists(path):
            continue
        if is_link:
            p.stale_links.add(rel)
        elif not stat.S_ISREG(os.lstat(path).st_mode):
            raise RenderDirError("%s: %s lists %r (files[%d]), which is not a regular file, so it is not removed; "
                                 "remove the entry from the marker. Nothing was changed." % (field, p.marker, rel, i),
                                 file=p.marker)
        if rel not in p.stale:
            p.stale.append(rel)
    p.stale.sort()
    for name, text in p.files.items():
        before = ""
        if exists:
            try:
                path, is_link = _entry(p, name, "%s file" % field)
            except _paths.PathEscape as e:
                raise RenderDirError("%s: %s" % (field, e), file=p.root)
            before = "" if is_link else _read_text(path)
            if before is None:
                if os.path.isdir(path):
                    raise RenderDirError("%s: %s is a directory where the module writes a file; move it away. "
                                         "Nothing was changed." % (field, path), file=path)
            if is_link or before is None:
                # replaced by a regular file (a rename replaces the link itself); its target is never read
                p.changes[name] = ("", text)
                continue
        if before != text:
            p.changes[name] = (before, text)
    for name in p.stale:
        before = "" if name in p.stale_links else _read_text(os.path.join(p.root, name))
        p.changes[name] = (before or "", "")
    new_marker = marker_text(p.files)
    if p.marker_before != new_marker:
        p.changes[MARKER] = (p.marker_before or "", new_marker)
    return p


def _atomic_write(directory, name, text):
    _fsutil.atomic_write_text(os.path.join(directory, name), text)


def write(p):
    """Apply a :class:`Plan`: the marker first lists old and new files (a crash leaves nothing untracked), then
    changed files are replaced atomically, stale ones removed (links as links), and the marker rewritten."""
    if not p.changes:
        return
    if not os.path.isdir(p.root):
        os.makedirs(p.directory, exist_ok=True)
        p.root = os.path.realpath(p.directory)
    new = set(p.files) - set(p.previous)
    if new and p.previous:
        _atomic_write(p.root, MARKER, marker_text(set(p.previous) | set(p.files)))
    for name, (_before, text) in sorted(p.changes.items()):
        if name != MARKER and name in p.files:
            _paths.split_relative(name, "%s file" % p.field, p.root)
            _atomic_write(p.root, name, text)
    for rel in p.stale:
        path, _is_link = _entry(p, rel, "%s stale file" % p.field)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    _atomic_write(p.root, MARKER, marker_text(p.files))
    _fsutil.fsync_dir(p.root)


def apply(directory, files, check_mode=False, diff=False, field="render_dir"):
    """Plan, write unless ``check_mode``, and return ``changed``, ``files``, ``changed_files``, ``removed``
    and (with ``diff``) ``diff``.

    Raises :class:`RenderDirError` for a bad directory or marker, before anything is written.
    """
    p = plan(directory, files, field)
    result = dict(changed=p.changed, files=sorted(p.files), removed=list(p.stale),
                  changed_files=sorted(n for n in p.changes if n in p.files))
    if diff and p.changes:
        result["diff"] = [dict(before_header=name, after_header=name,
                               before=_secrets.redact_rendered_text(before), after=after)
                          for name, (before, after) in sorted(p.changes.items())]
    if p.changes and not check_mode:
        try:
            write(p)
        except (OSError, _paths.PathEscape) as e:
            raise RenderDirError("%s: cannot write %s: %s" % (field, directory, e), file=directory)
    return result


def argument_spec(**extra):
    """The spec of O(render_dir) (doc fragment ``llmops.serving.render_dir``) to ``update()`` a module's argument
    spec with; ``extra`` adds keys to the option (a module's own aliases)."""
    return {"render_dir": dict({"type": "path"}, **extra)}


def run_module(module, render, spec_error, rendered_options, result_keys=None, always_list_files=False):
    """The body of a manifest-rendering module: render ``module.params`` and exit with the objects, written into
    O(render_dir) when it is set.

    ``render(params)`` returns a dict with ``objects`` and ``warnings``; it raises ``spec_error`` (which carries
    ``secret_values``) for bad options. The result holds ``result_keys`` of the rendered dict (all but
    ``warnings`` when None) plus the keys of :func:`apply`; ``always_list_files`` returns ``files``,
    ``changed_files`` and ``removed`` (empty) without O(render_dir) too.
    """
    _secrets.unmask_rendered_options(module, rendered_options)
    # the canonical names only (module.params also holds each alias the task used)
    params = dict((k, v) for k, v in module.params.items() if k not in module.aliases)
    render_dir = params.pop("render_dir")
    try:
        rendered = render(params)
    except spec_error as e:
        module.no_log_values.update(e.secret_values)
        module.fail_json(msg=str(e))
    warnings = rendered.pop("warnings")
    for warning in warnings:
        module.warn(warning)
    if result_keys is not None:
        rendered = dict((k, rendered[k]) for k in result_keys)
    result = dict(changed=False)
    if always_list_files:
        result.update(files=[], changed_files=[], removed=[])
    result.update(rendered)
    if render_dir:
        files = manifest_files(rendered["objects"])
        if warnings:
            files[NOTES] = notes_text(warnings)
        try:
            result.update(apply(render_dir, files, check_mode=module.check_mode, diff=module._diff,
                                field="render_dir"))
        except RenderDirError as e:
            module.fail_json(msg=str(e), file=e.file)
    module.exit_json(**result)
