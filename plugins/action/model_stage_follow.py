# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Follow a background (async) job with a flat loop, printing its progress file once per poll.

Each poll is one shell command on the target that reads the async job file (as ``async_status``
does) and the progress file; the controller prints one line (bytes, rate, ETA) from it. Once the job
file no longer says "running", ``async_status`` itself returns the job's result, which this action
returns (failed when the job failed). The loop keeps no per-poll state, so a copy may run for days at
any poll interval: nothing grows with the number of polls (a task file that includes itself once per
poll hits Python's recursion limit after a few hundred polls). A poll costs one remote command, not a
module run, so many hosts can be followed at a short interval.
"""
from __future__ import annotations

import math
import re
import time
import uuid

from ansible.errors import AnsibleError
from ansible.module_utils.common.text.converters import to_text
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.llmops.serving.plugins.module_utils.common import _units
from ansible_collections.llmops.serving.plugins.module_utils.common._untrusted import MAX_ABS_NUMBER, UntrustedInput, loads_json

display = Display()

# States the progress file ends in; seen while the job still runs, the file is from an earlier run.
TERMINAL_STATES = ("done", "failed")
# Connection errors during a poll are retried (the job runs on regardless) for at most this long.
POLL_ERROR_SECONDS = 300.0
_JID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_STATE = re.compile(r"^[a-z][a-z_-]{0,23}$")  # a state word (copying, publishing, ...), nothing else is shown
# Keys async_status adds to the job's own result.
_STATUS_KEYS = ("started", "finished", "results_file", "stdout_lines", "stderr_lines")
# What one poll reads of each file on the target (only regular files are read, never more than this): a job
# file holds the module's result, a progress file one small record.
JOB_MAX_BYTES = 16 * 1024 * 1024
PROGRESS_MAX_BYTES = 1024 * 1024


def _number(value):
    """A finite non-negative number within the shared reader's range from a progress field, else None (bools are
    not numbers)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None  # (math.isnan of an int like 10**400 would raise OverflowError: ints are always finite)
    if value < 0 or value > MAX_ABS_NUMBER:
        return None
    return value


def progress_line(record):
    """One line (state, bytes, percent, files, rate, ETA) from a progress record; None if it has none.

    Built from the numeric fields only, so whatever else the file holds never reaches the output.
    """
    if not isinstance(record, dict):
        return None
    done, total = _number(record.get("bytes_done")), _number(record.get("bytes_total"))
    if done is None or total is None:
        return None
    state = record.get("state")
    state = state if isinstance(state, str) and _STATE.match(state) else "running"
    parts = ["%s: %s / %s" % (state, _units.human_bytes(done), _units.human_bytes(total))]
    parts[0] += " (%.1f%%)" % (100.0 * done / total if total else 100.0)
    files_done, files_total = _number(record.get("files_done")), _number(record.get("files_total"))
    if files_done is not None and files_total is not None:
        parts.append("%d/%d files" % (files_done, files_total))
    from_source, from_peers = _number(record.get("bytes_from_source")), _number(record.get("bytes_from_peers"))
    if from_source is not None and from_peers is not None:
        parts.append("%s from the shared filesystem, %s from peers"
                     % (_units.human_bytes(from_source), _units.human_bytes(from_peers)))
    rate = _number(record.get("rate_bytes_per_second"))
    parts.append("%s/s" % _units.human_bytes(rate) if rate is not None else "rate unknown")
    eta = _number(record.get("eta_seconds"))
    parts.append("ETA %s" % (_units.human_seconds(eta) if eta is not None else "unknown"))
    return ", ".join(parts)


def _load(text, field="progress_file", max_bytes=JOB_MAX_BYTES):
    """JSON from text read off the target through the shared reader, or None (empty, being replaced, cut at the
    size cap, not JSON, too deep, numbers out of range: a ``bytes_done`` of ``10**400`` is no progress, never a
    traceback)."""
    text = text.strip()
    if not text:
        return None
    try:
        return loads_json(text, field, max_bytes=max_bytes)
    except UntrustedInput:
        return None


def _job_running(text):
    """What the async job file says, read the way async_status reads it.

    An empty or unparsable file is a job whose wrapper has not written it yet (None: ask again);
    ``{"started": 1, "finished": 0}`` is running; anything else is a result.
    """
    data = _load(text, "async job file")
    if data is None:
        return None if not text.strip() else False
    if isinstance(data, dict) and data.get("started") and not data.get("finished"):
        return True
    return False


class _NotAJobFile(Exception):
    """The async job file is a FIFO, a device or a directory: neither this action nor async_status reads it."""

    def __init__(self, path):
        super(_NotAJobFile, self).__init__(path)
        self.path = path


class ActionModule(ActionBase):
    """Poll an async job until it ends; return its result (failed when the job failed)."""

    TRANSFERS_FILES = False
    _requires_connection = True
    _supports_check_mode = True
    _supports_async = False

    ARGUMENT_SPEC = {
        "jid": {"type": "str", "required": True},
        "progress_file": {"type": "str"},
        "poll_interval": {"type": "float", "default": 10.0},
        "timeout": {"type": "float", "default": 0.0},
        "label": {"type": "str", "default": ""},
        "cleanup": {"type": "bool", "default": True},
    }

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        del tmp
        dummy, args = self.validate_argument_spec(argument_spec=self.ARGUMENT_SPEC)
        if args["poll_interval"] <= 0:
            return dict(result, failed=True, msg="poll_interval: must be greater than 0 (got %s)" % args["poll_interval"])
        if args["timeout"] < 0:
            return dict(result, failed=True, msg="timeout: must not be negative (got %s); 0 follows the job until it ends"
                        % args["timeout"])
        self._task_vars = task_vars
        self._host_name = (task_vars or {}).get("inventory_hostname", "?")  # many hosts print side by side
        self._async_dir = self._remote_expand_user(self.get_shell_option("async_dir", default="~/.ansible_async"))
        if not _JID.match(args["jid"]):
            return dict(result, failed=True, msg="jid: not an async job id; pass the ansible_job_id registered from the "
                        "task started with async and poll: 0")
        label = args["label"] or args["jid"]
        try:
            final = self._follow(args, label)
        finally:
            self._remove_tmp_path(self._connection._shell.tmpdir)
        if final.get("finished") and args["cleanup"]:
            self._status(args["jid"], mode="cleanup")
        for key in _STATUS_KEYS:
            final.pop(key, None)
        result.update(final)
        return result

    # ---- one poll ------------------------------------------------------------------------------
    def _status(self, jid, mode="status"):
        return self._execute_module(module_name="ansible.legacy.async_status", task_vars=self._task_vars,
                                    module_args={"jid": jid, "mode": mode, "_async_dir": self._async_dir})

    def _peek(self, jid, progress_file):
        """(running, progress record) from one shell command on the target, without running a module.

        ``running`` is True while the job file says started and not finished, None while it is still
        empty, and False once it is missing or holds anything else (async_status then gives the result).
        Only regular files are read, and at most a cap of each: a FIFO in the progress file's place would
        block ``cat`` for ever and ``/dev/zero`` would stream without end (it is shown as no progress).
        Raises :class:`_NotAJobFile` when the job file exists but is not a regular file.
        """
        shell = self._connection._shell
        sep = "--llmops-follow-%s--" % uuid.uuid4().hex
        job = shell.quote(shell.join_path(self._async_dir, jid))
        cmd = ("if [ -f %s ]; then echo 1; head -c %d -- %s 2>/dev/null; elif [ -e %s ]; then echo 2; else echo 0; "
               "fi; echo; echo %s" % (job, JOB_MAX_BYTES + 1, job, job, sep))
        if progress_file:
            prog = shell.quote(progress_file)
            cmd += "; if [ -f %s ]; then head -c %d -- %s 2>/dev/null; fi" % (prog, PROGRESS_MAX_BYTES + 1, prog)
        got = self._low_level_execute_command(cmd + "; exit 0", sudoable=True)
        out = to_text(got.get("stdout", ""))
        if got.get("rc") != 0 or sep not in out or out[:1] not in ("0", "1", "2"):
            raise AnsibleError("reading the job status on the target failed (rc %s)" % got.get("rc"))
        if out[:1] == "2":
            raise _NotAJobFile(shell.join_path(self._async_dir, jid))
        job_text, dummy, progress_text = out[1:].partition(sep)
        running = _job_running(job_text) if out[:1] == "1" else False
        return running, _load(progress_text, "progress_file", PROGRESS_MAX_BYTES)

    # ---- the loop ------------------------------------------------------------------------------
    def _follow(self, args, label):
        jid, interval, timeout = args["jid"], args["poll_interval"], args["timeout"]
        t0 = time.monotonic()
        polls = 0
        errors_since = None
        while True:
            polls += 1
            try:
                try:
                    running, record = self._peek(jid, args["progress_file"])
                except _NotAJobFile as e:
                    return dict(failed=True, ansible_job_id=jid, polls=polls, finished=False, file=e.path,
                                reason="not_regular",
                                msg="%s: the async job file %s on the target is not a regular file, so it is not "
                                    "read (it would block, or never end); remove it and start the job again"
                                    % (label, e.path))
                if running is False:
                    status = self._status(jid)
                    if status.get("finished") or status.get("failed"):
                        # the job's own result, or async_status's failure (no such job, unreadable job file)
                        status["polls"] = polls
                        return status
            except (AnsibleError, OSError) as e:
                # The job runs on while the connection bounces: retry, for a bounded time.
                now = time.monotonic()
                errors_since = errors_since or now
                display.vvvv("%s: poll %d failed, retrying: %s" % (label, polls, to_text(e)))
                if now - errors_since > POLL_ERROR_SECONDS:
                    return dict(failed=True, ansible_job_id=jid, polls=polls, finished=False,
                                msg="%s: cannot reach the target to follow async job %s for %d s: %s; the job may "
                                    "still be running there" % (label, jid, POLL_ERROR_SECONDS, to_text(e)))
                try:
                    self._connection.reset()
                except AttributeError:
                    pass
                time.sleep(interval)
                continue
            errors_since = None
            elapsed = time.monotonic() - t0
            display.display("[%s] %s: %s" % (self._host_name, label, self._line(record, elapsed)))
            if timeout and elapsed + interval > timeout:
                return dict(failed=True, ansible_job_id=jid, polls=polls, finished=False,
                            msg="%s: async job %s did not finish within timeout (%d s); it may still be running "
                                "on the target; raise the timeout or check the job" % (label, jid, timeout))
            time.sleep(interval)

    @staticmethod
    def _line(record, elapsed):
        waiting = "waiting for the job to report progress (%s so far)" % _units.human_seconds(elapsed)
        if isinstance(record, dict) and record.get("state") in TERMINAL_STATES:
            return waiting  # a finished earlier run's file; this run has not written one yet
        return progress_line(record) or waiting
