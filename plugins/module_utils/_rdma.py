# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: RDMA port counters from sysfs, their deltas across a load, and the
verdict on which transport carried the KV cache.

Layout read (kernel ``Documentation/ABI/stable/sysfs-class-infiniband``)::

    <sysfs_root>/class/infiniband/<dev>/ports/<port>/{link_layer,state,rate}
    <sysfs_root>/class/infiniband/<dev>/ports/<port>/counters/port_{xmit,rcv}_{data,packets}
    <sysfs_root>/class/infiniband/<dev>/ports/<port>/hw_counters/*

``port_xmit_data``/``port_rcv_data`` count octets divided by 4, so bytes = value x 4. On mlx5 RoCE
ports they come from the vport RDMA counters: kernel TCP on the same NIC does not move them.
"""
from __future__ import annotations

import os
import time

SCHEMA = 1
DATA_COUNTERS = {"tx": "port_xmit_data", "rx": "port_rcv_data"}
PACKET_COUNTERS = {"tx": "port_xmit_packets", "rx": "port_rcv_packets"}
PORT_COUNTERS = ("port_xmit_data", "port_rcv_data", "port_xmit_packets", "port_rcv_packets")
# IBA PortCounters (32-bit) clamp at all ones instead of wrapping; 64-bit extended ones likewise.
SATURATED_VALUES = (2 ** 32 - 1, 2 ** 64 - 1)
# hw_counters entries that are settings, not counters.
HW_NOT_COUNTERS = ("lifespan",)
NO_PMA = "N/A (no PMA)"


class RdmaError(Exception):
    """Bad input or an unreadable tree; the message names the option and the fix."""


def _read(path):
    try:
        with open(path, "r") as f:
            return f.read().strip()
    except OSError:
        return None


def _port_sort_key(p):
    return (0, int(p)) if p.isdigit() else (1, p)


def _read_counter(path):
    """``(value, problem)``: an int, or None and why (``N/A (no PMA)``, missing, unparsable)."""
    raw = _read(path)
    if raw is None:
        return None, "missing"
    if raw.startswith("N/A"):
        return None, raw
    try:
        return int(raw, 0), None
    except ValueError:
        return None, "unparsable: %r" % raw[:40]


def infiniband_dir(sysfs_root):
    return os.path.join(sysfs_root, "class", "infiniband")


def _transport(link_layer):
    if link_layer == "Ethernet":
        return "RoCE"
    if link_layer == "InfiniBand":
        return "InfiniBand"
    return "unknown"


def read_port(pdir):
    """Everything one port exposes that the verdict needs."""
    link_layer = _read(os.path.join(pdir, "link_layer")) or "unknown"
    port = {
        "link_layer": link_layer,
        "transport": _transport(link_layer),
        "state": _read(os.path.join(pdir, "state")) or "unknown",
        "rate": _read(os.path.join(pdir, "rate")) or "unknown",
        "counters": {},
        "unavailable": {},
        "hw_counters": {},
    }
    for name in PORT_COUNTERS:
        value, problem = _read_counter(os.path.join(pdir, "counters", name))
        if problem is None:
            port["counters"][name] = value
        else:
            port["unavailable"][name] = problem
    hw_dir = os.path.join(pdir, "hw_counters")
    if os.path.isdir(hw_dir):
        for name in sorted(os.listdir(hw_dir)):
            value, problem = _read_counter(os.path.join(hw_dir, name))
            if problem is None:
                port["hw_counters"][name] = value
    for key, name in (("tx_bytes", "port_xmit_data"), ("rx_bytes", "port_rcv_data")):
        v = port["counters"].get(name)
        port[key] = None if v is None else v * 4
    port["saturated"] = sorted(n for n, v in port["counters"].items() if v in SATURATED_VALUES)
    return port


def snapshot(sysfs_root="/sys", devices=None, ports=None, now=time.time):
    """Read every selected port. ``devices``/``ports`` empty means all.

    With no ``class/infiniband`` directory the snapshot is valid but empty (``present: False``) and
    ``reason`` says so; naming a device that does not exist raises :class:`RdmaError`.
    """
    base = infiniband_dir(sysfs_root)
    snap = {"schema": SCHEMA, "taken_at": now(), "sysfs_root": sysfs_root, "present": False,
            "reason": "", "ports": {}}
    if not os.path.isdir(base):
        if devices:
            raise RdmaError(
                "devices: %s requested but %s does not exist: this host has no RDMA devices (no "
                "driver loaded or /sys/class/infiniband not visible); drop devices or run on an RDMA "
                "node" % (", ".join(devices), base))
        snap["reason"] = "no RDMA devices: %s does not exist" % base
        return snap
    present = sorted(os.listdir(base))
    if devices:
        missing = [d for d in devices if d not in present]
        if missing:
            raise RdmaError(
                "devices: %s not found under %s (present: %s); fix the names or omit devices to read "
                "all" % (", ".join(missing), base, ", ".join(present) or "none"))
        chosen = [d for d in present if d in devices]
    else:
        chosen = present
    if not chosen:
        snap["reason"] = "no RDMA devices: %s is empty" % base
        return snap
    want_ports = {str(p) for p in (ports or [])}
    seen_ports = set()
    for dev in chosen:
        ports_dir = os.path.join(base, dev, "ports")
        if not os.path.isdir(ports_dir):
            continue
        for port in sorted(os.listdir(ports_dir), key=_port_sort_key):
            seen_ports.add(port)
            if want_ports and port not in want_ports:
                continue
            entry = read_port(os.path.join(ports_dir, port))
            entry["device"] = dev
            entry["port"] = int(port) if port.isdigit() else port
            snap["ports"]["%s/%s" % (dev, port)] = entry
    if want_ports and not want_ports & seen_ports:
        raise RdmaError("ports: %s not found on %s (ports present: %s); fix ports or omit it"
                        % (", ".join(sorted(want_ports)), ", ".join(chosen),
                           ", ".join(sorted(seen_ports, key=_port_sort_key)) or "none"))
    snap["present"] = bool(snap["ports"])
    if not snap["ports"]:
        snap["reason"] = "no RDMA ports under %s" % base
    return snap


def validate_baseline(baseline):
    """Check that ``baseline`` is a snapshot this module returned; raise RdmaError naming the fix."""
    if not isinstance(baseline, dict) or "ports" not in baseline or "taken_at" not in baseline:
        raise RdmaError("baseline: expected the 'snapshot' of an earlier rdma_counters run (keys "
                        "taken_at, ports); pass '{{ before.snapshot }}' where before is its register")
    if not isinstance(baseline["ports"], dict):
        raise RdmaError("baseline: 'ports' must be a mapping of '<device>/<port>' to counters")
    if baseline.get("schema", SCHEMA) != SCHEMA:
        raise RdmaError("baseline: snapshot schema %s is not %s; take a new baseline with this version"
                        % (baseline.get("schema"), SCHEMA))


def _counter_delta(before, after):
    """``(delta, status)`` for one counter; the delta is None unless the status is ``ok``."""
    if before is None or after is None:
        return None, "unavailable"
    if after in SATURATED_VALUES or before in SATURATED_VALUES:
        return None, "saturated"
    if after < before:
        return None, "reset"
    return after - before, "ok"


def compare(baseline, current):
    """Per-port and total deltas between two snapshots.

    A counter that went down is reported as ``reset`` and one pinned at its maximum as ``saturated``;
    neither contributes to the totals (never a negative or made-up delta). Ports that vanished are
    listed in ``missing_ports``, new ones in ``new_ports``.
    """
    elapsed = max(0.0, float(current["taken_at"]) - float(baseline["taken_at"]))
    out = {"elapsed_s": round(elapsed, 3), "ports": {}, "missing_ports": [], "new_ports": [],
           "untrusted": [],
           "totals": {"tx_bytes": 0, "rx_bytes": 0, "tx_packets": 0, "rx_packets": 0}}
    b_ports = baseline.get("ports", {})
    c_ports = current.get("ports", {})
    out["missing_ports"] = sorted(k for k in b_ports if k not in c_ports)
    out["new_ports"] = sorted(k for k in c_ports if k not in b_ports)
    for key in sorted(k for k in c_ports if k in b_ports):
        b, c = b_ports[key], c_ports[key]
        bc, cc = b.get("counters", {}), c.get("counters", {})
        port = {"device": c.get("device"), "port": c.get("port"), "link_layer": c.get("link_layer"),
                "transport": c.get("transport"), "state": c.get("state"), "rate": c.get("rate"),
                "status": {}, "hw_counters": {}, "hw_counters_reset": []}
        for direction in ("tx", "rx"):
            for kind, names, scale in (("bytes", DATA_COUNTERS, 4), ("packets", PACKET_COUNTERS, 1)):
                name = names[direction]
                delta, status = _counter_delta(bc.get(name), cc.get(name))
                port["status"][name] = status
                field = "%s_%s" % (direction, kind)
                port[field] = None if delta is None else delta * scale
                if delta is not None:
                    out["totals"][field] += delta * scale
                elif kind == "bytes":
                    detail = c.get("unavailable", {}).get(name) or b.get("unavailable", {}).get(name)
                    out["untrusted"].append({"port": key, "counter": name, "status": status,
                                             "detail": detail or status})
        if elapsed > 0:
            for d in ("tx", "rx"):
                v = port["%s_bytes" % d]
                port["%s_bytes_per_s" % d] = None if v is None else round(v / elapsed, 1)
        bh, ch = b.get("hw_counters", {}), c.get("hw_counters", {})
        for name in sorted(ch):
            if name in HW_NOT_COUNTERS or name not in bh:
                continue
            delta, status = _counter_delta(bh[name], ch[name])
            if status == "reset":
                port["hw_counters_reset"].append(name)
            elif delta is not None:
                port["hw_counters"][name] = delta
        out["ports"][key] = port
    return out


def _fmt_bytes(n):
    n = float(n or 0)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return ("%d %s" % (n, unit)) if unit == "B" else ("%.2f %s" % (n, unit))
        n /= 1024.0
    return "%d B" % n  # pragma: no cover


def _directions(direction):
    return ("tx", "rx") if direction == "both" else (direction,)


_UNTRUSTED_FIX = {
    "saturated": "the 32-bit PortCounters clamped at their maximum; reset them (perfquery -R) or use a "
                 "kernel/HCA with 64-bit extended counters",
    "reset": "the counter went down between the snapshots (counter reset or driver reload); rerun",
    "unavailable": "the HCA did not answer the PMA query; these bytes cannot be measured",
}


def verdict(deltas, current, expect, direction="both", min_bytes=0, tolerance_bytes=0, kv=None,
            min_nixl_ratio=0.9):
    """Decide whether the load used the expected transport.

    ``expect: rdma`` passes when the chosen direction moved at least ``min_bytes`` on RDMA ports (and,
    with engine metrics, at least ``kv bytes x min_nixl_ratio`` with zero failed transfers).
    ``expect: tcp`` passes when RDMA ports moved at most ``tolerance_bytes`` and every port could be
    measured. ``expect: any`` only reports.
    """
    dirs = _directions(direction)
    moved = sum(deltas["totals"]["%s_bytes" % d] for d in dirs)
    untrusted = [u for u in deltas["untrusted"]
                 if u["counter"] in tuple(DATA_COUNTERS[d] for d in dirs)]
    reasons, warnings = [], []
    for u in untrusted:
        fix = _UNTRUSTED_FIX.get(u["status"], "")
        warnings.append("%s %s is %s (%s): %s" % (u["port"], u["counter"], u["status"], u["detail"], fix))
    for key in deltas["missing_ports"]:
        warnings.append("%s was in the baseline but is gone now (device removed or renamed)" % key)
    for key, port in sorted(deltas["ports"].items()):
        if port["hw_counters_reset"]:
            warnings.append("%s hw_counters went down (reset or 32-bit wrap): %s"
                            % (key, ", ".join(port["hw_counters_reset"])))
    dir_label = "+".join(dirs)
    present = bool(current.get("present"))
    passed = True

    kv_bytes = kv_failures = None
    if kv is not None:
        kv_bytes = kv.get("bytes")
        kv_failures = kv.get("failures")
        src = kv.get("prompt_tokens_by_source") or {}
        if src.get("local_compute"):
            warnings.append(
                "decode computed %d prompt tokens locally (vllm:prompt_tokens_by_source "
                "source=local_compute grew; external_kv_transfer grew by %d): some prompts were "
                "recomputed instead of transferred" % (src["local_compute"], src.get("external_kv_transfer") or 0))
        if kv.get("restarted"):
            warnings.append("engine counters went down between the samples (engine restarted): %s"
                            % ", ".join(kv["restarted"]))
        if kv_failures:
            if expect == "any":
                warnings.append("the engine reports %d failed KV transfers" % kv_failures)
            else:
                passed = False
                reasons.append("the engine reports %d failed KV transfers" % kv_failures)

    if expect == "rdma":
        if not present:
            passed = False
            reasons.append("%s: nothing can carry RDMA traffic on this host"
                           % (current.get("reason") or "no RDMA ports"))
        elif moved < min_bytes:
            passed = False
            msg = ("RDMA ports moved %s (%d bytes, %s) during the load, below min_bytes %d: the KV did "
                   "not go over RDMA (check UCX_TLS, UCX_NET_DEVICES and the RDMA device resource)"
                   % (_fmt_bytes(moved), moved, dir_label, min_bytes))
            if untrusted:
                msg += "; some counters could not be trusted, see warnings"
            reasons.append(msg)
        if kv is not None:
            if not kv_bytes:
                passed = False
                reasons.append("the engine reports no KV bytes transferred (%s): the load did not "
                               "exercise the P/D path" % ("metric absent" if kv_bytes is None else "0"))
            elif present and moved < kv_bytes * min_nixl_ratio:
                passed = False
                reasons.append(
                    "RDMA ports moved %s but the engine transferred %s of KV (need at least %.0f%% of "
                    "it on RDMA): the KV went over another transport, most likely TCP"
                    % (_fmt_bytes(moved), _fmt_bytes(kv_bytes), min_nixl_ratio * 100))
    elif expect == "tcp":
        if not present:
            reasons.append("%s: no RDMA port could carry the transfer" % (current.get("reason") or "no RDMA ports"))
        else:
            if moved > tolerance_bytes:
                passed = False
                reasons.append(
                    "RDMA ports moved %s (%d bytes, %s) during the TCP control run, above tolerance_bytes "
                    "%d: the control run used RDMA" % (_fmt_bytes(moved), moved, dir_label, tolerance_bytes))
            if untrusted or deltas["missing_ports"]:
                passed = False
                reasons.append("cannot confirm RDMA stayed idle: %d port counters could not be measured "
                               "(see warnings)" % (len(untrusted) + len(deltas["missing_ports"])))
        if kv is not None and not kv_bytes:
            warnings.append("the engine reports no KV bytes transferred: the control load did not "
                            "exercise the P/D path")
    status = "pass" if passed else "fail"
    if passed and not reasons:
        reasons.append("RDMA ports moved %s (%s)" % (_fmt_bytes(moved), dir_label))
    summary = "expect %s: %s; %s" % (expect, status.upper(), "; ".join(reasons))
    return {
        "expect": expect,
        "direction": direction,
        "passed": passed,
        "status": status,
        "rdma_bytes": moved,
        "kv_bytes": kv_bytes,
        "kv_failures": kv_failures,
        "min_bytes": min_bytes,
        "tolerance_bytes": tolerance_bytes,
        "link_layers": sorted({p.get("link_layer") for p in current.get("ports", {}).values()}),
        "reasons": reasons,
        "warnings": warnings,
        "summary": summary,
    }
