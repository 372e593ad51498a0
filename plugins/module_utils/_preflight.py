# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: what the later roles depend on, gathered from injectable paths."""
from __future__ import annotations

import os
import subprocess

from ansible.module_utils.common.process import get_bin_path

from ansible_collections.llmops.serving.plugins.module_utils import _fsutil, _process

GPU_QUERY = "name,count,compute_cap,driver_version,memory.total,pci.bus_id"
# The name of the host fact preflight_facts publishes (``ansible_facts.preflight_node``); the preflight role
# publishes the same dictionary as the variable ``preflight_node``.
FACT_NAME = "preflight_node"


def parse_nvidia_smi_csv(text):
    """Parse ``nvidia-smi --query-gpu=<GPU_QUERY> --format=csv,noheader,nounits`` output."""
    devices = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        cols = [c.strip() for c in line.split(",")]
        if len(cols) < 6:
            raise ValueError("unexpected nvidia-smi line (want %d columns): %r" % (6, line))
        name, _count, cc, driver, mem, bus = cols[:6]
        devices.append(
            {
                "name": name,
                "compute_capability": cc,
                "driver_version": driver,
                "memory_mib": int(float(mem)) if mem not in ("", "[N/A]") else None,
                "pci_bus_id": bus,
            }
        )
    return devices


def find_bin(cmd):
    """The executable ``cmd`` names, found as ``AnsibleModule.get_bin_path`` finds it (``PATH``, then
    ``/sbin``, ``/usr/sbin``, ``/usr/local/sbin``; an absolute path as given); None when there is none."""
    try:
        return get_bin_path(cmd)
    except ValueError:
        return None


def gpu_inventory(nvidia_smi, run=subprocess.run, which=find_bin):
    """GPU facts, or ``mode: cpu-only`` when there is no nvidia-smi or it finds no device.

    ``run`` is ``subprocess.run`` (``AnsibleModule.run_command`` has no timeout, and a GPU whose driver is
    wedged hangs nvidia-smi); ``which`` finds the executable (a module passes its ``get_bin_path``).
    """
    path = which(nvidia_smi)
    if path is None:
        return {"mode": "cpu-only", "count": 0, "devices": [], "reason": "%s not found" % nvidia_smi}
    proc = run(
        [path, "--query-gpu=" + GPU_QUERY, "--format=csv,noheader,nounits"],
        capture_output=True, text=True, check=False, timeout=60,
    )
    if proc.returncode != 0:
        return {
            "mode": "cpu-only", "count": 0, "devices": [],
            "reason": "nvidia-smi exited %d: %s" % (proc.returncode, (proc.stderr or proc.stdout).strip()[:300]),
        }
    devices = parse_nvidia_smi_csv(proc.stdout)
    if not devices:
        return {"mode": "cpu-only", "count": 0, "devices": [], "reason": "nvidia-smi listed no GPU"}
    names = sorted({d["name"] for d in devices})
    return {
        "mode": "gpu",
        "count": len(devices),
        "devices": devices,
        "names": names,
        "compute_capability": devices[0]["compute_capability"],
        "driver_version": devices[0]["driver_version"],
        "homogeneous": len(names) == 1,
        "reason": "",
    }


def _read(path, default=None):
    try:
        with open(path, "r") as f:
            return f.read().strip()
    except OSError:
        return default


def rdma_devices(sysfs_root):
    """RDMA HCAs under ``<sysfs_root>/class/infiniband`` with per-port link layer and state."""
    base = os.path.join(sysfs_root, "class", "infiniband")
    if not os.path.isdir(base):
        return {"present": False, "devices": [], "reason": "%s does not exist (no RDMA devices)" % base}
    devices = []
    for dev in sorted(os.listdir(base)):
        ports_dir = os.path.join(base, dev, "ports")
        ports = []
        if os.path.isdir(ports_dir):
            for port in sorted(os.listdir(ports_dir), key=lambda p: int(p) if p.isdigit() else p):
                pdir = os.path.join(ports_dir, port)
                ports.append(
                    {
                        "port": int(port) if port.isdigit() else port,
                        "link_layer": _read(os.path.join(pdir, "link_layer"), "unknown"),
                        "state": _read(os.path.join(pdir, "state"), "unknown"),
                        "rate": _read(os.path.join(pdir, "rate"), "unknown"),
                    }
                )
        devices.append({"name": dev, "ports": ports})
    return {"present": bool(devices), "devices": devices,
            "reason": "" if devices else "%s is empty" % base}


def disk_space(path):
    """Free/total bytes of the filesystem that holds ``path`` (or its nearest existing parent)."""
    probe = _fsutil.nearest_existing(path)
    st = os.statvfs(probe)
    return {
        "path": path,
        "measured_at": probe,
        "free_bytes": st.f_bavail * st.f_frsize,
        "total_bytes": st.f_blocks * st.f_frsize,
    }


def engine_runtime(python, modules, run=subprocess.run, which=find_bin):
    """Check that ``modules`` import in the engine's Python and report their versions."""
    code = (
        "import importlib, json, sys\n"
        "out = {}\n"
        "for m in sys.argv[1:]:\n"
        "    try:\n"
        "        mod = importlib.import_module(m)\n"
        "        out[m] = {'importable': True, 'version': str(getattr(mod, '__version__', ''))}\n"
        "    except Exception as e:\n"
        "        out[m] = {'importable': False, 'error': '%s: %s' % (type(e).__name__, e)}\n"
        "print(json.dumps(out))\n"
    )
    if which(python) is None:
        return {"python": python, "importable": False, "modules": {},
                "reason": "engine python %s not found" % python}
    try:
        mods = _process.python_json(python, code, modules, timeout=600, run=run)
    except _process.PythonFailed as e:
        return {"python": python, "importable": False, "modules": {},
                "reason": "engine python failed: %s" % e.stderr[-500:]}
    bad = sorted(m for m, r in mods.items() if not r["importable"])
    return {
        "python": python,
        "importable": not bad,
        "modules": mods,
        "reason": "" if not bad else "; ".join("%s: %s" % (m, mods[m]["error"]) for m in bad),
    }


def node_facts(nvidia_smi, sysfs_root, paths, engine_python=None, engine_modules=(), run=subprocess.run,
               which=find_bin):
    """Everything preflight_facts reports: ``{gpu, rdma, disk, engine_runtime}``.

    ``engine_runtime`` is empty when ``engine_python`` is not set. Raises ``ValueError`` when nvidia-smi's
    output cannot be parsed.
    """
    facts = {
        "gpu": gpu_inventory(nvidia_smi, run=run, which=which),
        "rdma": rdma_devices(sysfs_root),
        "disk": [disk_space(path) for path in paths],
        "engine_runtime": {},
    }
    if engine_python:
        facts["engine_runtime"] = engine_runtime(engine_python, engine_modules, run=run, which=which)
    return facts
