# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: RDMA port counters from sysfs, their deltas across a load, and the
verdict on which transport carried the KV cache.

Layout read (kernel ``Documentation/ABI/stable/sysfs-class-infiniband``)::

    <sysfs_root>/class/infiniband/<dev>/node_guid
    <sysfs_root>/class/infiniband/<dev>/ports/<port>/{link_layer,state,rate,gids/0}
    <sysfs_root>/class/infiniband/<dev>/ports/<port>/counters/port_{xmit,rcv}_{data,packets}
    <sysfs_root>/class/infiniband/<dev>/ports/<port>/hw_counters/*
    <proc_root>/sys/kernel/random/boot_id, <proc_root>/sys/kernel/hostname

``port_xmit_data``/``port_rcv_data`` count octets divided by 4, so bytes = value x 4. On mlx5 RoCE
ports they come from the vport RDMA counters: kernel TCP on the same NIC does not move them.

The rule for a comparison: a delta is only taken between two snapshots of the same kernel (``boot_id``)
that cover the same device/port selection, the same set of ports, and for each port the same HCA
(``node_guid``) and port (GID 0). Anything else, and any port counter that went backwards, is a
*mismatch*: the verdict is ``error`` and names what differs and the fix (take a new baseline). A
baseline read back from a file or an option is validated field by field first (:func:`validate_snapshot`);
errors name the field, never a value read from the file.
"""
from __future__ import annotations

import math
import os
import re
import time

from ansible_collections.llmops.serving.plugins.module_utils.common import _units
from ansible_collections.llmops.serving.plugins.module_utils.common._untrusted import (
    UntrustedInput, check_value, load_json, read_text)

SCHEMA = 2
DATA_COUNTERS = {"tx": "port_xmit_data", "rx": "port_rcv_data"}
PACKET_COUNTERS = {"tx": "port_xmit_packets", "rx": "port_rcv_packets"}
PORT_COUNTERS = ("port_xmit_data", "port_rcv_data", "port_xmit_packets", "port_rcv_packets")
# IBA PortCounters (32-bit) clamp at all ones instead of wrapping; 64-bit extended ones likewise.
SATURATED_VALUES = (2 ** 32 - 1, 2 ** 64 - 1)
# hw_counters entries that are settings, not counters.
HW_NOT_COUNTERS = ("lifespan",)
NO_PMA = "N/A (no PMA)"
# Why a counter has no value (the only strings a snapshot records for one).
UNAVAILABLE_REASONS = (NO_PMA, "N/A", "missing", "unparsable (not an integer)", "unparsable (negative)",
                       "unparsable (beyond 64 bits)")
# Engine sample fields that are counters (kept in step with _prom.COUNTER_FIELDS).
KV_COUNTER_FIELDS = (
    "bytes", "transfers", "xfer_time_s", "xfer_count", "failed_transfers", "failed_notifications",
    "kv_expired_reqs", "sglang_failed_reqs", "sglang_bootstrap_failed_reqs",
)
BOOT_ID = ("sys", "kernel", "random", "boot_id")
HOSTNAME = ("sys", "kernel", "hostname")
# sysfs attributes are at most a page; anything longer is not a sysfs attribute.
READ_LIMIT = 4096
# A snapshot of 64 ports with every hw_counter is ~200 KiB; refuse files far beyond that.
MAX_SNAPSHOT_FILE_BYTES = 16 << 20

_UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_HOST_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")
_GUID_RE = re.compile(r"^[0-9a-f]{4}(:[0-9a-f]{4}){3}$")
_GID_RE = re.compile(r"^[0-9a-f]{4}(:[0-9a-f]{4}){7}$")
_ZERO_GID = ":".join(["0000"] * 8)
_DEV_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
_PORT_RE = re.compile(r"^[A-Za-z0-9_]{1,16}$")
_NAME_RE = re.compile(r"^[A-Za-z0-9_:.-]{1,128}$")


class RdmaError(Exception):
    """Bad input or an unreadable tree; the message names the option and the fix.

    ``file`` is the file the problem is in, when there is one.
    """

    def __init__(self, msg, file=None):
        super(RdmaError, self).__init__(msg)
        self.file = file


def _read(path, limit=READ_LIMIT):
    """Text of a sysfs/procfs attribute, or None, through the shared reader: a FIFO, a device or a socket in an
    attribute's place is None without blocking, and more than a page is not an attribute."""
    try:
        return read_text(path, max_bytes=limit, errors="replace").strip()
    except (OSError, UntrustedInput):
        return None


def _port_sort_key(p):
    return (0, int(p)) if p.isdigit() else (1, p)


def _read_counter(path):
    """``(value, problem)``: an int, or None and why (``N/A (no PMA)``, missing, unparsable)."""
    raw = _read(path)
    if raw is None:
        return None, "missing"
    if raw.startswith("N/A"):
        return None, NO_PMA if raw == NO_PMA else "N/A"
    try:
        value = int(raw, 0)
    except ValueError:
        return None, "unparsable (not an integer)"
    if value < 0:
        return None, "unparsable (negative)"
    if value >= 2 ** 64:  # no hardware counter is wider; a baseline holding it would be refused
        return None, "unparsable (beyond 64 bits)"
    return value, None


def host_identity(proc_root="/proc"):
    """``{boot_id, hostname}`` of the running kernel; a field is None when unreadable or malformed.

    ``boot_id`` is a random UUID the kernel draws at every boot: two hosts, or one host before and after
    a reboot, never share it, and it is the same in every container of the host (the RDMA counters are
    not namespaced either). ``hostname`` is only there to tell "another host" from "rebooted".
    """
    boot_id = _read(os.path.join(proc_root, *BOOT_ID))
    hostname = _read(os.path.join(proc_root, *HOSTNAME))
    return {"boot_id": boot_id if boot_id and _UUID_RE.match(boot_id) else None,
            "hostname": hostname if hostname and _HOST_RE.match(hostname) else None}


def infiniband_dir(sysfs_root):
    return os.path.join(sysfs_root, "class", "infiniband")


def _transport(link_layer):
    if link_layer == "Ethernet":
        return "RoCE"
    if link_layer == "InfiniBand":
        return "InfiniBand"
    return "unknown"


def _identity_value(raw, pattern, zero=None):
    """A GUID/GID as sysfs prints it, lower-cased; None when absent, malformed or all zeros."""
    if not raw:
        return None
    raw = raw.lower()
    if not pattern.match(raw) or raw == zero:
        return None
    return raw


def read_port(pdir, node_guid=None):
    """Everything one port exposes that the verdict needs.

    ``identity`` is what changes when the port is another one under the same name: the HCA's
    ``node_guid`` and the port's GID 0 (IB: subnet prefix + port GUID; RoCE: derived from the MAC).
    """
    link_layer = _read(os.path.join(pdir, "link_layer")) or "unknown"
    port = {
        "link_layer": link_layer,
        "transport": _transport(link_layer),
        "state": _read(os.path.join(pdir, "state")) or "unknown",
        "rate": _read(os.path.join(pdir, "rate")) or "unknown",
        "identity": {"node_guid": node_guid,
                     "gid0": _identity_value(_read(os.path.join(pdir, "gids", "0")), _GID_RE, _ZERO_GID)},
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
            if not _NAME_RE.match(name):
                continue
            value, problem = _read_counter(os.path.join(hw_dir, name))
            if problem is None:
                port["hw_counters"][name] = value
    for key, name in (("tx_bytes", "port_xmit_data"), ("rx_bytes", "port_rcv_data")):
        v = port["counters"].get(name)
        port[key] = None if v is None else v * 4
    port["saturated"] = sorted(n for n, v in port["counters"].items() if v in SATURATED_VALUES)
    return port


def snapshot_argument_spec(prefix=""):
    """The spec of the options a module selects the counters of a snapshot and its verdict with (doc fragment
    ``llmops.serving.rdma``): ``<prefix>devices`` and ``<prefix>ports`` (empty = all, as :func:`snapshot` takes
    them) and ``direction`` (as :func:`verdict` takes it), to ``update()`` a module's argument spec with."""
    return {
        prefix + "devices": {"type": "list", "elements": "str", "default": []},
        prefix + "ports": {"type": "list", "elements": "int", "default": []},
        "direction": {"type": "str", "choices": ["tx", "rx", "both"], "default": "both"},
    }


def _selection(devices, ports):
    return {"devices": sorted({str(d) for d in (devices or [])}),
            "ports": sorted({str(p) for p in (ports or [])}, key=_port_sort_key)}


def snapshot(sysfs_root="/sys", devices=None, ports=None, now=time.time, proc_root="/proc"):
    """Read every selected port. ``devices``/``ports`` empty means all.

    The snapshot records the host (:func:`host_identity`), the selection it was taken with and, per
    port, its identity, so :func:`compare` can refuse to subtract counters of something else.
    With no ``class/infiniband`` directory the snapshot is valid but empty (``present: False``) and
    ``reason`` says so; naming a device that does not exist raises :class:`RdmaError`.
    """
    base = infiniband_dir(sysfs_root)
    snap = {"schema": SCHEMA, "taken_at": now(), "sysfs_root": sysfs_root, "host": host_identity(proc_root),
            "selection": _selection(devices, ports), "present": False, "reason": "", "ports": {}}
    if not os.path.isdir(base):
        if devices:
            raise RdmaError(
                "devices: %s requested but %s does not exist: this host has no RDMA devices (no "
                "driver loaded or /sys/class/infiniband not visible); drop devices or run on an RDMA "
                "node" % (", ".join(devices), base))
        snap["reason"] = "no RDMA devices: %s does not exist" % base
        return snap
    present = sorted(d for d in os.listdir(base) if _DEV_RE.match(d))
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
        node_guid = _identity_value(_read(os.path.join(base, dev, "node_guid")), _GUID_RE)
        for port in sorted((p for p in os.listdir(ports_dir) if _PORT_RE.match(p)), key=_port_sort_key):
            seen_ports.add(port)
            if want_ports and port not in want_ports:
                continue
            entry = read_port(os.path.join(ports_dir, port), node_guid=node_guid)
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


# ---- reading a baseline back ---------------------------------------------------------------------

_RETAKE = "take a new baseline with this module and pass its 'snapshot' unchanged"


class _Bad(Exception):
    """One malformed field: ``where`` is a safe dotted path, ``what`` what it must be."""

    def __init__(self, where, what):
        super(_Bad, self).__init__(where)
        self.where = where
        self.what = what


def _type_name(value):
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return "a %s" % type(value).__name__


def _need(cond, where, what, value):
    if not cond:
        raise _Bad(where, "must be %s (got %s)" % (what, _type_name(value)))


def _key(where, key, pattern):
    """The dotted path to ``where[key]``; the key itself only when it is safe to show."""
    if isinstance(key, str) and pattern.match(key):
        return "%s.%s" % (where, key) if where else key
    return "%s[<a key that is not a %s>]" % (where, "counter name" if pattern is _NAME_RE else "name")


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and not (isinstance(v, float) and math.isnan(v))


def _check_mapping(doc, where):
    _need(isinstance(doc, dict), where, "a mapping", doc)


def _check_counters(doc, where, value_ok, what):
    _check_mapping(doc, where)
    for name, value in doc.items():
        w = _key(where, name, _NAME_RE)
        _need(isinstance(name, str) and _NAME_RE.match(name), w, "a sysfs counter name", name)
        _need(value_ok(value), w, what, value)


def _check_port(key, entry, where):
    _check_mapping(entry, where)
    for field in ("device", "port", "counters", "hw_counters", "identity"):
        if field not in entry:
            raise _Bad("%s.%s" % (where, field), "is missing")
    dev, port = entry["device"], entry["port"]
    _need(isinstance(dev, str) and _DEV_RE.match(dev), where + ".device", "an RDMA device name", dev)
    _need((_is_int(port) and port >= 0) or (isinstance(port, str) and _PORT_RE.match(port)),
          where + ".port", "a port number", port)
    if "%s/%s" % (dev, port) != key:
        raise _Bad(where, "names another port in its device/port fields than its key")
    _check_counters(entry["counters"], where + ".counters",
                    lambda v: _is_int(v) and 0 <= v < 2 ** 64, "a non-negative integer below 2**64")
    _check_counters(entry["hw_counters"], where + ".hw_counters",
                    lambda v: _is_int(v) and 0 <= v < 2 ** 64, "a non-negative integer below 2**64")
    _check_counters(entry.get("unavailable", {}), where + ".unavailable", lambda v: v in UNAVAILABLE_REASONS,
                    "one of the reasons this module records (%s)" % ", ".join(UNAVAILABLE_REASONS))
    ident = entry["identity"]
    _check_mapping(ident, where + ".identity")
    for field, pattern, what in (("node_guid", _GUID_RE, "null or a node GUID (xxxx:xxxx:xxxx:xxxx)"),
                                 ("gid0", _GID_RE, "null or a GID (8 groups of 4 hex digits)")):
        if field not in ident:
            raise _Bad("%s.identity.%s" % (where, field), "is missing")
        v = ident[field]
        _need(v is None or (isinstance(v, str) and pattern.match(v)), "%s.identity.%s" % (where, field), what, v)


def _check_kv(kv, where):
    if kv is None:
        return
    _check_mapping(kv, where)
    for field in KV_COUNTER_FIELDS:
        v = kv.get(field)
        _need(v is None or _is_num(v), "%s.%s" % (where, field), "null or a number", v)
    by_source = kv.get("prompt_tokens_by_source")
    if by_source is not None:
        _check_counters(by_source, where + ".prompt_tokens_by_source", _is_num, "a number")
    sgl = kv.get("sglang_kv_transfer")
    if sgl is not None:
        _check_counters(sgl, where + ".sglang_kv_transfer", _is_num, "a number")
    engine = kv.get("engine")
    _need(engine is None or isinstance(engine, str), where + ".engine", "null or a string", engine)


def _check_snapshot(doc):
    if not isinstance(doc, dict):
        raise _Bad("", "must be a mapping (the 'snapshot' of an earlier rdma_counters run), not %s"
                   % _type_name(doc))
    if "ports" not in doc and isinstance(doc.get("snapshot"), dict):
        raise _Bad("", "is a whole registered result, not its snapshot: pass '{{ before.snapshot }}' "
                       "(or write '{{ before.snapshot | to_json }}' to the file)")
    for field in ("schema", "taken_at", "host", "selection", "ports"):
        if field not in doc:
            raise _Bad(field, "is missing: this is not the 'snapshot' of an rdma_counters run")
    schema = doc["schema"]
    _need(_is_int(schema), "schema", "an integer", schema)
    if schema != SCHEMA:
        raise _Bad("schema", "is %d, this version reads %d (older snapshots do not record the host and the "
                             "port identities)" % (schema, SCHEMA))
    taken = doc["taken_at"]
    _need(_is_num(taken) and math.isfinite(taken) and taken >= 0, "taken_at", "a time in seconds", taken)
    host = doc["host"]
    _check_mapping(host, "host")
    for field, pattern, what in (("boot_id", _UUID_RE, "null or a boot id (UUID)"),
                                 ("hostname", _HOST_RE, "null or a host name")):
        if field not in host:
            raise _Bad("host." + field, "is missing")
        v = host[field]
        _need(v is None or (isinstance(v, str) and pattern.match(v)), "host." + field, what, v)
    sel = doc["selection"]
    _check_mapping(sel, "selection")
    for field, pattern in (("devices", _DEV_RE), ("ports", _PORT_RE)):
        items = sel.get(field)
        _need(isinstance(items, list), "selection." + field, "a list", items)
        for i, item in enumerate(items):
            _need((isinstance(item, str) and pattern.match(item)) or (_is_int(item) and item >= 0),
                  "selection.%s[%d]" % (field, i), "a device name" if field == "devices" else "a port", item)
    if "present" in doc:
        _need(isinstance(doc["present"], bool), "present", "a boolean", doc["present"])
    ports = doc["ports"]
    _check_mapping(ports, "ports")
    for key, entry in ports.items():
        ok = isinstance(key, str) and key.count("/") == 1
        if ok:
            dev, port = key.split("/")
            ok = bool(_DEV_RE.match(dev) and _PORT_RE.match(port))
        if not ok:
            raise _Bad("ports[<a key that is not '<device>/<port>'>]", "must be keyed '<device>/<port>'")
        _check_port(key, entry, "ports." + key)
    for field in ("kv", "kv_prefill"):
        _check_kv(doc.get(field), field)


def validate_snapshot(doc, label="baseline", file=None):
    """Check that ``doc`` is a snapshot this module returned; raise :class:`RdmaError` naming the field.

    ``label`` starts the message (the option, or ``baseline_file: <path>``). The message names the field
    and what it must be, never the value found there.
    """
    try:
        # depth and number range first (without recursion): taken_at 10**400 would overflow math.isfinite
        check_value(doc, label, file=file)
    except UntrustedInput as e:
        raise RdmaError("%s; %s" % (e, _RETAKE), file=file)
    try:
        _check_snapshot(doc)
    except _Bad as e:
        where = (" " + e.where) if e.where else ""
        raise RdmaError("%s:%s %s; %s" % (label, where, e.what, _RETAKE), file=file)


def validate_baseline(baseline):
    """Backwards-compatible name for :func:`validate_snapshot` on the ``baseline`` option."""
    validate_snapshot(baseline, "baseline")


def load_snapshot_file(path, label="baseline_file"):
    """Read and validate a snapshot written as JSON (``{{ before.snapshot | to_json }}``) through the shared
    reader (regular file only, without blocking; size, nesting and numbers capped).

    Errors name the file, the field and the fix; they never quote the file.
    """
    head = "%s: %s" % (label, path)
    fix = "point %s at the JSON file the baseline run wrote" % label
    try:
        doc = load_json(path, label, max_bytes=MAX_SNAPSHOT_FILE_BYTES)
    except OSError as e:  # missing
        raise RdmaError("%s cannot be opened (%s); %s" % (head, e.strerror or e.__class__.__name__, fix), file=path)
    except UntrustedInput as e:
        if e.limit == "type":
            raise RdmaError("%s is not a regular file; %s" % (head, fix), file=path)
        if e.limit == "size":
            raise RdmaError("%s is over %d bytes, more than a snapshot can be; %s"
                            % (head, MAX_SNAPSHOT_FILE_BYTES, fix), file=path)
        if e.limit == "encoding":
            raise RdmaError("%s is not UTF-8 text, so not a JSON snapshot; %s" % (head, _RETAKE), file=path)
        if e.limit == "syntax":
            raise RdmaError("%s; write it with '{{ before.snapshot | to_json }}'" % e, file=path)
        raise RdmaError("%s; %s" % (e, _RETAKE if e.limit in ("depth", "number") else fix), file=path)
    validate_snapshot(doc, head, file=path)
    return doc


# ---- comparing ------------------------------------------------------------------------------------

def _counter_delta(before, after):
    """``(delta, status)`` for one counter; the delta is None unless the status is ``ok``."""
    if before is None or after is None:
        return None, "unavailable"
    if after in SATURATED_VALUES or before in SATURATED_VALUES:
        return None, "saturated"
    if after < before:
        return None, "reset"
    return after - before, "ok"


def _fmt_sel(sel):
    return "devices %s, ports %s" % (", ".join(sel.get("devices") or []) or "all",
                                     ", ".join(str(p) for p in sel.get("ports") or []) or "all")


def _mismatch(kind, message, port=None):
    return {"kind": kind, "port": port, "message": message}


def _host_mismatch(b_host, c_host, proc_hint):
    """Mismatches between the hosts of two snapshots, and warnings (hostname alone changed)."""
    b_host = b_host or {}
    b_id, c_id = b_host.get("boot_id"), c_host.get("boot_id")
    b_name, c_name = b_host.get("hostname"), c_host.get("hostname")
    if b_id is None or c_id is None:
        which = ("the baseline records no boot id" if b_id is None
                 else "%s is unreadable here" % proc_hint)
        return [_mismatch("host_unknown", "cannot tell whether the baseline was taken on this host (%s): "
                          "counters of another host or of an earlier boot would give a wrong delta; take the "
                          "baseline and the comparison where /proc/sys/kernel/random/boot_id is readable "
                          "(set proc_root)" % which)], []
    if b_id == c_id:
        warns = []
        if b_name != c_name:
            warns.append("the host name changed since the baseline (%s, now %s) but the kernel is the same "
                         "(same boot id), so its counters are comparable" % (b_name or "unknown", c_name or "unknown"))
        return [], warns
    if b_name is not None and b_name == c_name:
        return [_mismatch("host_rebooted", "host %s rebooted since the baseline (boot id %s, now %s): every "
                          "counter restarted from zero; take a new baseline after the reboot and rerun the load"
                          % (c_name, b_id, c_id))], []
    return [_mismatch("host_changed", "the baseline was taken on host %s (boot id %s), this is host %s (boot id "
                      "%s): its counters are another machine's; pass the snapshot this host registered "
                      "(hostvars[inventory_hostname]) or take a new baseline here"
                      % (b_name or "unknown", b_id, c_name or "unknown", c_id))], []


def _identity_mismatch(key, b, c):
    b_id, c_id = b.get("identity") or {}, c.get("identity") or {}
    diffs = []
    bg, cg = b_id.get("node_guid"), c_id.get("node_guid")
    if bg is not None and bg != cg:
        diffs.append("node_guid %s, now %s" % (bg, cg or "unreadable"))
    elif bg is None and cg is not None:
        diffs.append("node_guid unreadable, now %s" % cg)
    b0, c0 = b_id.get("gid0"), c_id.get("gid0")
    if b0 is not None and c0 is not None and b0 != c0:
        # An all-zero or unreadable GID (netdev gone for a moment) is unknown, not different.
        diffs.append("GID 0 %s, now %s" % (b0, c0))
    if not diffs:
        return None
    return _mismatch("port_replaced", "%s is not the port of the baseline (%s): the HCA was replaced or the name "
                     "now points at another device; take a new baseline" % (key, "; ".join(diffs)), key)


def compare(baseline, current, proc_hint="/proc/sys/kernel/random/boot_id"):
    """Per-port and total deltas between two snapshots, or the mismatches that forbid them.

    ``mismatch`` lists everything that makes the two snapshots incomparable: another host or boot, another
    device/port selection, a port that disappeared or appeared, a port whose identity changed, and a port
    counter that went backwards (counter reset, driver reload). With another host or selection no per-port
    delta is taken (``totals`` is None). A counter pinned at its maximum is ``saturated`` and one the HCA
    could not read ``unavailable`` (``untrusted``); neither contributes to the totals, and no delta is ever
    negative or made up.
    """
    elapsed = max(0.0, float(current["taken_at"]) - float(baseline["taken_at"]))
    out = {"elapsed_s": round(elapsed, 3), "ports": {}, "missing_ports": [], "new_ports": [],
           "untrusted": [], "mismatch": [], "warnings": [],
           "totals": {"tx_bytes": 0, "rx_bytes": 0, "tx_packets": 0, "rx_packets": 0}}
    mismatch, warns = _host_mismatch(baseline.get("host"), current.get("host") or {}, proc_hint)
    out["warnings"].extend(warns)
    b_sel = baseline.get("selection") or {}
    b_sel = _selection(b_sel.get("devices"), b_sel.get("ports"))
    c_sel = current.get("selection") or _selection(None, None)
    if not mismatch and b_sel != c_sel:
        mismatch.append(_mismatch(
            "selection_changed", "the baseline covered %s, this run reads %s: pass the same devices and ports "
            "as the baseline run, or take a new baseline with these" % (_fmt_sel(b_sel), _fmt_sel(c_sel))))
    if mismatch:
        out["mismatch"] = mismatch
        out["totals"] = None
        return out
    b_ports = baseline.get("ports", {})
    c_ports = current.get("ports", {})
    out["missing_ports"] = sorted(k for k in b_ports if k not in c_ports)
    out["new_ports"] = sorted(k for k in c_ports if k not in b_ports)
    for key in out["missing_ports"]:
        mismatch.append(_mismatch(
            "port_disappeared", "%s was in the baseline but is gone now (HCA removed, driver unloaded or device "
            "renamed): what it moved during the load cannot be measured; take a new baseline" % key, key))
    for key in out["new_ports"]:
        mismatch.append(_mismatch(
            "port_appeared", "%s appeared since the baseline (hotplug, new virtual function or renamed device): "
            "it has no baseline to subtract; take a new baseline" % key, key))
    for key in sorted(k for k in c_ports if k in b_ports):
        b, c = b_ports[key], c_ports[key]
        replaced = _identity_mismatch(key, b, c)
        if replaced:
            mismatch.append(replaced)
            continue
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
                elif status == "reset":
                    mismatch.append(_mismatch(
                        "counter_reset", "%s %s went backwards since the baseline (%d, now %d: counters reset, "
                        "driver reload or HCA reset): what the load moved is unknown; take a new baseline and "
                        "rerun the load" % (key, name, bc[name], cc[name]), key))
                if delta is None and kind == "bytes":
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
    out["mismatch"] = mismatch
    return out


def _directions(direction):
    return ("tx", "rx") if direction == "both" else (direction,)


_UNTRUSTED_FIX = {
    "saturated": "the 32-bit PortCounters clamped at their maximum; reset them (perfquery -R) or use a "
                 "kernel/HCA with 64-bit extended counters",
    "reset": "the counter went down between the snapshots (counter reset or driver reload); rerun",
    "unavailable": "the HCA did not answer the PMA query; these bytes cannot be measured",
}


def _kv_warnings(kv, side, expect):
    """Warnings for KV requests that expired or whose notification failed (``side``: decode/prefill)."""
    out = []
    if kv is None:
        return out
    tail = ""
    if expect == "tcp":
        tail = ("; the control load did not complete every KV transfer, so idle RDMA ports may only mean that "
                "the KV never moved, not that TCP carried it")
    if kv.get("kv_expired_reqs"):
        out.append("the %s engine reports %d KV requests that expired before decode read them "
                   "(vllm:nixl_num_kv_expired_reqs; prefill freed their blocks after VLLM_NIXL_ABORT_REQUEST_TIMEOUT): "
                   "those prompts were recomputed or failed%s" % (side, kv["kv_expired_reqs"], tail))
    if kv.get("failed_notifications"):
        out.append("the %s engine reports %d failed KV notifications (vllm:nixl_num_failed_notifications)%s"
                   % (side, kv["failed_notifications"], tail))
    if kv.get("failures"):
        out.append("the %s engine reports %d failed KV transfers (vllm:nixl_num_failed_transfers, "
                   "sglang:num_transfer_failed_reqs, sglang:num_bootstrap_failed_reqs)%s"
                   % (side, kv["failures"], tail))
    if kv.get("restarted"):
        out.append("%s engine counters went down between the samples (engine restarted): %s"
                   % (side, ", ".join(kv["restarted"])))
    return out


def verdict(deltas, current, expect, direction="both", min_bytes=0, tolerance_bytes=0, kv=None,
            min_nixl_ratio=0.9, kv_prefill=None):
    """Decide whether the load used the expected transport.

    With any ``deltas["mismatch"]`` (another host or boot, another port set, a replaced port, a counter
    that went backwards) the status is ``error``: there is nothing comparable to decide on.
    ``expect: rdma`` passes when the chosen direction moved at least ``min_bytes`` on RDMA ports (and,
    with engine metrics, at least ``kv bytes x min_nixl_ratio`` with zero failed transfers).
    ``expect: tcp`` passes when RDMA ports moved at most ``tolerance_bytes`` and every port could be
    measured; expired or failed KV transfers warn that the control load may not have moved the KV.
    ``expect: any`` only reports. ``kv_prefill`` (the prefill engine's delta) adds its failures and
    expired requests (vLLM counts expiry on the prefill side).
    """
    dirs = _directions(direction)
    dir_label = "+".join(dirs)
    reasons, warnings = [], list(deltas.get("warnings") or [])
    kv_bytes = kv.get("bytes") if kv is not None else None
    failures = [k["failures"] for k in (kv, kv_prefill) if k is not None and k.get("failures") is not None]
    kv_failures = sum(failures) if failures else None
    mismatch = deltas.get("mismatch") or []
    result = {
        "expect": expect,
        "direction": direction,
        "kv_bytes": kv_bytes,
        "kv_failures": kv_failures,
        "kv_expired_reqs": None,
        "min_bytes": min_bytes,
        "tolerance_bytes": tolerance_bytes,
        "link_layers": sorted({p.get("link_layer") for p in current.get("ports", {}).values()}),
        "mismatch": mismatch,
    }
    expired = [k["kv_expired_reqs"] for k in (kv, kv_prefill) if k is not None and k.get("kv_expired_reqs") is not None]
    result["kv_expired_reqs"] = sum(expired) if expired else None
    if mismatch:
        reasons = [m["message"] for m in mismatch]
        result.update(passed=False, status="error", rdma_bytes=None, reasons=reasons, warnings=warnings,
                      summary="expect %s: ERROR; the baseline does not describe what was read now: %s"
                      % (expect, "; ".join(reasons)))
        return result

    moved = sum(deltas["totals"]["%s_bytes" % d] for d in dirs)
    untrusted = [u for u in deltas["untrusted"]
                 if u["counter"] in tuple(DATA_COUNTERS[d] for d in dirs)]
    for u in untrusted:
        fix = _UNTRUSTED_FIX.get(u["status"], "")
        warnings.append("%s %s is %s (%s): %s" % (u["port"], u["counter"], u["status"], u["detail"], fix))
    for key, port in sorted(deltas["ports"].items()):
        if port["hw_counters_reset"]:
            warnings.append("%s hw_counters went down (reset or 32-bit wrap): %s"
                            % (key, ", ".join(port["hw_counters_reset"])))
    present = bool(current.get("present"))
    passed = True

    for side, k in (("decode", kv), ("prefill", kv_prefill)):
        warnings.extend(_kv_warnings(k, side, expect))
    if kv is not None:
        src = kv.get("prompt_tokens_by_source") or {}
        if src.get("local_compute"):
            warnings.append(
                "decode computed %d prompt tokens locally (vllm:prompt_tokens_by_source "
                "source=local_compute grew; external_kv_transfer grew by %d): some prompts were "
                "recomputed instead of transferred" % (src["local_compute"], src.get("external_kv_transfer") or 0))
    if kv_failures and expect != "any":
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
                   % (_units.human_bytes(moved), moved, dir_label, min_bytes))
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
                    % (_units.human_bytes(moved), _units.human_bytes(kv_bytes), min_nixl_ratio * 100))
    elif expect == "tcp":
        if not present:
            reasons.append("%s: no RDMA port could carry the transfer" % (current.get("reason") or "no RDMA ports"))
        else:
            if moved > tolerance_bytes:
                passed = False
                reasons.append(
                    "RDMA ports moved %s (%d bytes, %s) during the TCP control run, above tolerance_bytes "
                    "%d: the control run used RDMA" % (_units.human_bytes(moved), moved, dir_label, tolerance_bytes))
            if untrusted:
                passed = False
                reasons.append("cannot confirm RDMA stayed idle: %d port counters could not be measured "
                               "(see warnings)" % len(untrusted))
        if kv is not None and not kv_bytes:
            warnings.append("the engine reports no KV bytes transferred: the control load did not "
                            "exercise the P/D path")
    status = "pass" if passed else "fail"
    if passed and not reasons:
        reasons.append("RDMA ports moved %s (%s)" % (_units.human_bytes(moved), dir_label))
    result.update(passed=passed, status=status, rdma_bytes=moved, reasons=reasons, warnings=warnings,
                  summary="expect %s: %s; %s" % (expect, status.upper(), "; ".join(reasons)))
    return result
