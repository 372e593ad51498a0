# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""One line about a job that ``ansible-runner process`` wrote: status, rc, event count, failed events, artifacts.

    python awx/ee/job_summary.py <process dir>/artifacts

Artifacts are the ``artifact_data`` of the ``playbook_on_stats`` event (``set_stats``), where AWX's callback
receiver reads them. A failed task with ``ignore_errors`` does not count as failed.
"""
from __future__ import annotations

import glob
import json
import os
import sys


def summary(artifacts_dir):
    def read(name):
        try:
            with open(os.path.join(artifacts_dir, name), encoding="utf-8") as f:
                return f.read().strip() or "missing"
        except OSError:
            return "missing"

    events = []
    for path in glob.glob(os.path.join(artifacts_dir, "job_events", "*.json")):
        with open(path, encoding="utf-8") as f:
            events.append(json.load(f))
    failed = sum(1 for e in events if e.get("event") == "runner_on_failed" and not (e.get("event_data") or {}).get("ignore_errors"))
    stats = [e for e in events if e.get("event") == "playbook_on_stats"]
    data = ((stats[0].get("event_data") or {}).get("artifact_data") or {}) if stats else {}
    return "%s %s %d %d %s" % (read("status"), read("rc"), len(events), failed, json.dumps(data, sort_keys=True, separators=(",", ":")))


if __name__ == "__main__":
    print(summary(sys.argv[1]))
