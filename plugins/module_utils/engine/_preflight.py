# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: what the later roles depend on, gathered from injectable paths."""
from __future__ import annotations

import os
import subprocess

from ansible.module_utils.common.process import get_bin_path

from ansible_collections.llmops.serving.plugins.module_utils.common import _fsutil, _image_cuda, _process_run
from ansible_collections.llmops.serving.plugins.module_utils.common._untrusted import UntrustedInput, read_text

GPU_QUERY = "name,count,compute_cap,driver_version,memory.total,pci.bus_id"
# The name of the host fact preflight_facts publishes (``ansible_facts.preflight_node``); the preflight role
# publishes the same dictionary as the variable ``preflight_node``.
FACT_NAME = "preflight_node"
# How long nvidia-smi may take to list the GPUs (a wedged driver hangs it) and the engine's Python to import
# the engine modules (a cold import of vLLM and torch from a network filesystem takes minutes).
NVIDIA_SMI_TIMEOUT = 60
ENGINE_PYTHON_TIMEOUT = 600
# A sysfs attribute is at most one page (Documentation/filesystems/sysfs.rst: "a buffer of PAGE_SIZE").
MAX_SYSFS_BYTES = 64 * 1024


class PreflightError(ValueError):
    """A fact could not be gathered because of what an option points at; ``option`` names it.

    A ValueError, so that callers that also catch bad values (kernel_fingerprint's gather) report it cleanly."""

    def __init__(self, option, msg, reason=None):
        super(PreflightError, self).__init__("%s: %s" % (option, msg))
        self.option = option
        self.reason = reason


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


def gpu_inventory(nvidia_smi, run=_process_run.run, which=find_bin, timeout=None):
    """GPU facts, or ``mode: cpu-only`` when there is no nvidia-smi or it finds no device.

    ``run`` is ``_process_run.run`` (``AnsibleModule.run_command`` has no timeout, and a GPU whose driver is
    wedged hangs nvidia-smi); ``which`` finds the executable (a module passes its ``get_bin_path``).
    Raises :class:`PreflightError` (option ``nvidia_smi``) when it does not answer within ``timeout`` seconds
    (default :data:`NVIDIA_SMI_TIMEOUT`) or its output cannot be parsed.
    """
    timeout = NVIDIA_SMI_TIMEOUT if timeout is None else timeout
    path = which(nvidia_smi)
    if path is None:
        return {"mode": "cpu-only", "count": 0, "devices": [], "reason": "%s not found" % nvidia_smi}
    try:
        proc = run(
            [path, "--query-gpu=" + GPU_QUERY, "--format=csv,noheader,nounits"],
            capture_output=True, text=True, check=False, timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        raise PreflightError("nvidia_smi", "%s did not list the GPUs within %s s (a hung GPU driver or a GPU that "
                             "fell off the bus does this); check the node (dmesg for Xid errors, nvidia-smi -q) "
                             "and drain it, or point nvidia_smi at a working binary" % (path, timeout))
    if proc.returncode != 0:
        return {
            "mode": "cpu-only", "count": 0, "devices": [],
            "reason": "nvidia-smi exited %d: %s" % (proc.returncode, (proc.stderr or proc.stdout).strip()[:300]),
        }
    try:
        devices = parse_nvidia_smi_csv(proc.stdout)
    except ValueError as e:
        raise PreflightError("nvidia_smi", "cannot parse its output: %s" % e)
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
    """A sysfs attribute through the shared reader: a FIFO or a device in its place (sysfs_root points at a
    copy of the tree) is ``default``, never a hang; more than a page is not an attribute either."""
    try:
        return read_text(path, max_bytes=MAX_SYSFS_BYTES, errors="replace").strip()
    except (OSError, UntrustedInput):
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


def _runtime_report(doc, modules):
    """The import check's JSON if it has the shape the check prints (one entry per module), else None."""
    if not isinstance(doc, dict) or sorted(doc) != sorted(set(modules)):
        return None
    for entry in doc.values():
        if not isinstance(entry, dict) or not isinstance(entry.get("importable"), bool):
            return None
        if not entry["importable"] and not isinstance(entry.get("error"), str):
            return None
    return doc


def engine_runtime(python, modules, run=_process_run.run, which=find_bin, timeout=None):
    """Check that ``modules`` import in the engine's Python and report their versions.

    Raises :class:`PreflightError` (option ``engine_python``) when the interpreter cannot be started, does
    not finish within ``timeout`` seconds (default :data:`ENGINE_PYTHON_TIMEOUT`) or prints no import report.
    """
    timeout = ENGINE_PYTHON_TIMEOUT if timeout is None else timeout
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
    modules = list(modules)
    try:
        mods = _process_run.python_json(python, code, modules, timeout=timeout, run=run)
    except _process_run.PythonFailed as e:
        return {"python": python, "importable": False, "modules": {},
                "reason": "engine python failed: %s" % e.stderr[-500:]}
    except subprocess.TimeoutExpired:
        raise PreflightError("engine_python", "%s did not finish importing %s within %s s; check that the engine "
                             "environment's filesystem is mounted and responsive (a hung NFS mount does this)"
                             % (python, ", ".join(modules) or "nothing", timeout))
    except OSError as e:
        raise PreflightError("engine_python", "cannot run %s: %s; point engine_python at the Python interpreter of "
                             "the engine environment (e.g. /opt/vllm/bin/python)" % (python, e.strerror or e))
    except ValueError:
        mods = None
    mods = _runtime_report(mods, modules)
    if mods is None:
        raise PreflightError("engine_python", "%s printed no import report (its last output line is not the JSON "
                             "object the check prints): it is not a Python interpreter, or something in it "
                             "writes to stdout at exit; point engine_python at the Python interpreter of the "
                             "engine environment (e.g. /opt/vllm/bin/python)" % python)
    bad = sorted(m for m, r in mods.items() if not r["importable"])
    return {
        "python": python,
        "importable": not bad,
        "modules": mods,
        "reason": "" if not bad else "; ".join("%s: %s" % (m, mods[m]["error"]) for m in bad),
    }


# The oldest driver that runs a CUDA major release's images (minor version compatibility): NVIDIA's CUDA
# Compatibility guide, "Minor Version Compatibility", Table 1 (docs.nvidia.com/deploy/cuda-compatibility), and the
# CUDA Toolkit Release Notes' driver table: CUDA 13.x >= 580, CUDA 12.x >= 525, CUDA 11.x >= 450.80.02.
CUDA_MIN_DRIVER = {11: (450, 80, 2), 12: (525,), 13: (580,)}


def _numbers(text):
    parts = []
    for part in str(text or "").strip().split("."):
        if not part.isdigit():
            return None
        parts.append(int(part))
    return tuple(parts) or None


def driver_fits_cuda(driver_version, cuda_version):
    """Whether the node's driver runs an image built for ``cuda_version``: ``{cuda, driver, min_driver, ok, reason}``.

    ``ok`` is None where it cannot be told (no GPU driver seen, a CUDA major the table does not know)."""
    cuda = _numbers(cuda_version)
    if cuda is None:
        raise PreflightError("image_cuda_version", "%r is not a CUDA version such as 12.9 or 13.0" % (cuda_version,))
    need = CUDA_MIN_DRIVER.get(cuda[0])
    out = {"cuda": str(cuda_version), "driver": driver_version or "", "ok": None,
           "min_driver": ".".join(str(n) for n in need) if need else "", "reason": ""}
    driver = _numbers(driver_version)
    if need is None:
        out["reason"] = "CUDA %d is not in the driver table (CUDA 11-13); check NVIDIA's release notes" % cuda[0]
    elif driver is None:
        out["reason"] = "no NVIDIA driver version was read on this node"
    elif driver < need:
        out.update(ok=False, reason=(
            "driver %s is older than CUDA %d images need (R%s or newer, NVIDIA's CUDA Toolkit Release Notes); the "
            "engine fails at its first CUDA call. Upgrade the node's driver, or use an image built for an older "
            "CUDA" % (driver_version, cuda[0], out["min_driver"])))
    else:
        out["ok"] = True
    return out


def image_cuda_of(image, image_cuda_version):
    """The declared ``image_cuda_version`` checked against the CUDA ``image``'s tag names
    (``_image_cuda.check_declared``): the tag's reading (``{image, tag, cuda, exact, reason}``; ``cuda`` None where
    the tag cannot say, a digest-only pin for one), or :class:`PreflightError` (reason ``image_cuda_mismatch``)
    naming both when they contradict, so that the driver check never runs on a version the image does not have."""
    try:
        return _image_cuda.check_declared(image, image_cuda_version)
    except _image_cuda.ImageCudaError as e:
        raise PreflightError("image_cuda_version", str(e).split(": ", 1)[1], reason=e.reason)


def node_facts(nvidia_smi, sysfs_root, paths, engine_python=None, engine_modules=(), run=_process_run.run,
               which=find_bin, image_cuda_version=None, image=None):
    """Everything preflight_facts reports: ``{gpu, rdma, disk, engine_runtime}``, and ``image_cuda`` with
    ``image_cuda_version``.

    ``engine_runtime`` is empty when ``engine_python`` is not set. Raises :class:`PreflightError` naming the
    option (``nvidia_smi``, ``engine_python``) whose program hung or answered something unreadable, and, before
    anything is read, ``image_cuda_version`` when it contradicts the CUDA of ``image``'s tag (:func:`image_cuda_of`).
    """
    tag = image_cuda_of(image, image_cuda_version) if image and image_cuda_version else None
    facts = {
        "gpu": gpu_inventory(nvidia_smi, run=run, which=which),
        "rdma": rdma_devices(sysfs_root),
        "disk": [disk_space(path) for path in paths],
        "engine_runtime": {},
    }
    if engine_python:
        facts["engine_runtime"] = engine_runtime(engine_python, engine_modules, run=run, which=which)
    if image_cuda_version:
        facts["image_cuda"] = driver_fits_cuda(facts["gpu"].get("driver_version"), image_cuda_version)
        if tag is not None:
            facts["image_cuda"]["image_tag"] = tag
    return facts
