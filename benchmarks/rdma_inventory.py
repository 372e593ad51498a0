# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Inventory a host's RDMA hardware as the collection sees it, for docs/rdma-hardware.md.

Prints one JSON document: every HCA and port under /sys/class/infiniband (link_layer, state, rate, the counter
files present in counters/ and hw_counters/), /dev/infiniband, `nvidia-smi topo -m`, preflight_facts' RDMA and
GPU sections, and an rdma_counters snapshot (the same code the modules run, with no fixture root).

    python3 benchmarks/rdma_inventory.py --pycoll DIR > inventory.json

DIR holds ansible_collections/llmops/serving (this checkout); ansible-core's module_utils must be importable
(preflight uses its get_bin_path).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys


def _ls(path):
    try:
        return sorted(os.listdir(path))
    except OSError as e:
        return "unreadable: %s" % e.strerror


def _read(path):
    try:
        with open(path, "r", errors="replace") as f:
            return f.read(4096).strip()
    except OSError as e:
        return "unreadable: %s" % e.strerror


def sysfs_inventory(sysfs_root="/sys"):
    base = os.path.join(sysfs_root, "class", "infiniband")
    out = {"path": base, "exists": os.path.isdir(base), "devices": {}}
    if not out["exists"]:
        return out
    for dev in _ls(base):
        ddir = os.path.join(base, dev)
        entry = {"node_guid": _read(os.path.join(ddir, "node_guid")), "ports": {}}
        for port in _ls(os.path.join(ddir, "ports")) if os.path.isdir(os.path.join(ddir, "ports")) else []:
            pdir = os.path.join(ddir, "ports", port)
            entry["ports"][port] = {
                "link_layer": _read(os.path.join(pdir, "link_layer")),
                "state": _read(os.path.join(pdir, "state")),
                "rate": _read(os.path.join(pdir, "rate")),
                "counters": _ls(os.path.join(pdir, "counters")),
                "hw_counters": _ls(os.path.join(pdir, "hw_counters")),
            }
        out["devices"][dev] = entry
    return out


def run(cmd):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"cmd": cmd, "error": str(e)}
    return {"cmd": cmd, "rc": p.returncode, "stdout": p.stdout[-8000:], "stderr": p.stderr[-2000:]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    ap.add_argument("--pycoll", required=True, help="directory holding ansible_collections/llmops/serving")
    ap.add_argument("--sysfs-root", default="/sys")
    a = ap.parse_args()
    sys.path.insert(0, a.pycoll)
    doc = {"host": _read("/proc/sys/kernel/hostname"), "kernel": _read("/proc/sys/kernel/osrelease"),
           "sysfs": sysfs_inventory(a.sysfs_root), "dev_infiniband": _ls("/dev/infiniband"),
           "nvidia_smi_topo": run(["nvidia-smi", "topo", "-m"]),
           "nvidia_smi_nics": run(["nvidia-smi", "topo", "-mp"])}
    from ansible_collections.llmops.serving.plugins.module_utils.engine import _preflight
    from ansible_collections.llmops.serving.plugins.module_utils.transport import _rdma
    facts = _preflight.node_facts("nvidia-smi", a.sysfs_root, ["/"])
    doc["preflight"] = {"rdma": facts["rdma"], "gpu": facts["gpu"]}
    try:
        doc["rdma_counters_snapshot"] = _rdma.snapshot(sysfs_root=a.sysfs_root)
    except Exception as e:  # pylint: disable=broad-except  # an inventory reports what it could not read
        doc["rdma_counters_snapshot"] = {"error": "%s: %s" % (type(e).__name__, e)}
    json.dump(doc, sys.stdout, indent=1, sort_keys=True, default=str)
    print()


if __name__ == "__main__":
    main()
