# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: what a local engine serves, recorded once it answered correctly.

An upgrade moves the serving revision from A to B and, when B fails, puts back *exactly* A. "Exactly" needs a
record written while A was proven, not a guess made later: ``<run_dir>/<name>.serving.json`` holds the model
directory the engine loads (``model_path``: ``<dest_root>/<model>/<revision>``), the model name and revision read
from that path, and the engine's ``spec_hash`` (engine_process: a hash of command, environment and working
directory, values never stored). The engine role writes it after a correct answer; the upgrade reads it and
trusts it only while the running engine has that same ``spec_hash``: an engine restarted by hand with other
arguments is not A, and the upgrade then refuses instead of restoring something else.

The file is written atomically (temporary name, fsync, rename) and read back through the shared reader
(``_untrusted``: regular file, size, JSON, types).
"""
from __future__ import annotations

import os

from ansible_collections.llmops.serving.plugins.module_utils.common import _fsutil, _untrusted

#: A record is a few hundred bytes; anything larger is not one.
MAX_BYTES = 64 * 1024
SUFFIX = ".serving.json"
FIELDS = ("model_path", "model", "revision", "spec_hash")


class ServingError(ValueError):
    """A record that cannot be trusted or written; ``field`` names the option or record field, ``reason`` a code."""

    def __init__(self, msg, field, reason):
        super(ServingError, self).__init__(msg)
        self.field = field
        self.reason = reason


def record_path(run_dir, name):
    """``<run_dir>/<name>.serving.json``, beside the engine's own directory ``<run_dir>/<name>/``."""
    return os.path.join(run_dir, name + SUFFIX)


def describe(model_path, spec_hash):
    """The record of an engine loading ``model_path`` whose process has ``spec_hash``."""
    path = os.path.normpath(model_path)
    if not os.path.isabs(path) or path == os.sep:
        raise ServingError("model_path: %r is not an absolute revision directory; pass the staged revision "
                           "(<dest_root>/<model>/<revision>)" % model_path, "model_path", "bad_model_path")
    if not isinstance(spec_hash, str) or not spec_hash:
        raise ServingError("spec_hash: empty; pass engine_process's spec_hash of the running engine",
                           "spec_hash", "bad_spec_hash")
    return {"model_path": path, "model": os.path.basename(os.path.dirname(path)),
            "revision": os.path.basename(path), "spec_hash": spec_hash}


def write(run_dir, name, record, check_mode=False):
    """Write ``record`` (from :func:`describe`); True when the file changed (or would change)."""
    path = record_path(run_dir, name)
    try:
        current = read(run_dir, name)
    except ServingError:
        current = None
    if current == record:
        return False
    if not check_mode:
        _fsutil.atomic_write_json(path, record, mode=0o644, sort_keys=True, newline=True)
    return True


def read(run_dir, name):
    """The record of ``name`` under ``run_dir``, or None when there is none; ServingError when it is malformed."""
    path = record_path(run_dir, name)
    if not os.path.lexists(path):
        return None
    try:
        doc = _untrusted.load_json(path, "the serving record", max_bytes=MAX_BYTES, follow=False)
    except _untrusted.UntrustedInput as e:
        raise ServingError("%s: %s; remove it and deploy the serving revision again (site.yml), which writes it "
                           "anew" % (path, e), "record", "bad_record")
    if not isinstance(doc, dict) or any(not isinstance(doc.get(k), str) or not doc.get(k) for k in FIELDS):
        raise ServingError("%s: not a serving record (fields %s, each a non-empty string); remove it and deploy the "
                           "serving revision again (site.yml)" % (path, ", ".join(FIELDS)), "record", "bad_record")
    return dict((k, doc[k]) for k in FIELDS)


def current(run_dir, name, spec_hash):
    """The record of the engine that runs now with ``spec_hash``.

    ServingError (``reason``) when there is no record (``no_record``) or it belongs to another start of the engine
    (``record_mismatch``): then what serves is not known well enough to be restored.
    """
    record = read(run_dir, name)
    path = record_path(run_dir, name)
    if record is None:
        raise ServingError("%s: no serving record, so what %s serves cannot be restored after a failure; deploy it "
                           "with site.yml first (the engine role records what it proved)" % (path, name),
                           "record", "no_record")
    if record["spec_hash"] != spec_hash:
        raise ServingError("%s records the engine started as %s, but %s runs as %s (restarted by other means): "
                           "what serves is not what was proven; deploy it with site.yml first"
                           % (path, record["spec_hash"], name, spec_hash), "record", "record_mismatch")
    return record
