"""A baseline is only compared with a snapshot of the same host, boot, selection and ports.

Fixture trees follow the kernel's sysfs layout (``Documentation/ABI/stable/sysfs-class-infiniband``:
``<dev>/node_guid``, ``<dev>/ports/<n>/gids/<idx>``) and procfs (``Documentation/admin-guide/sysctl/kernel.rst``:
``random/boot_id`` is a UUID drawn once per boot, ``hostname`` the UTS host name).
"""
from __future__ import annotations

import copy
import os
import shutil
import threading

import pytest

from ansible_collections.llmops.serving.plugins.module_utils.transport import _prom, _rdma

FIX = os.path.join(os.path.dirname(os.path.dirname(__file__)), "..", "..", "fixtures")
SYSFS = os.path.join(FIX, "sysfs")
PROM = os.path.join(FIX, "prom")

BOOT_A = "f8b03bce-ed06-4c61-826b-7ea3da125e3e"
BOOT_B = "0c1d2e3f-4a5b-4c6d-8e7f-901234567890"
SECRET = "hunter2-SECRET-TOKEN"


def tree(tmp_path, name):
    dst = tmp_path / name
    shutil.copytree(os.path.join(SYSFS, name), dst)
    return str(dst)


def proc(tmp_path, boot_id, hostname, name="proc"):
    root = tmp_path / name
    (root / "sys" / "kernel" / "random").mkdir(parents=True, exist_ok=True)
    if boot_id is not None:
        (root / "sys" / "kernel" / "random" / "boot_id").write_text(boot_id + "\n")
    (root / "sys" / "kernel" / "hostname").write_text(hostname + "\n")
    return str(root)


def ib(root, *parts):
    return os.path.join(root, "class", "infiniband", *parts)


def bump(root, dev, port, name, delta):
    path = ib(root, dev, "ports", str(port), "counters", name)
    with open(path) as f:
        value = int(f.read())
    with open(path, "w") as f:
        f.write("%d\n" % (value + delta))


def write(path, text):
    with open(path, "w") as f:
        f.write(text + "\n")


def decide(before, after, expect="rdma", **kw):
    kw.setdefault("direction", "tx")
    kw.setdefault("min_bytes", 1 << 20)
    kw.setdefault("tolerance_bytes", 1 << 20)
    return _rdma.verdict(_rdma.compare(before, after), after, expect, **kw)


# ---- what a snapshot records -----------------------------------------------------------------------

def test_snapshot_records_host_selection_and_port_identity(tmp_path):
    snap = _rdma.snapshot(tree(tmp_path, "roce_mlx5"), devices=["mlx5_0"], ports=[1],
                          proc_root=proc(tmp_path, BOOT_A, "gpu-node-a"))
    assert snap["schema"] == 2
    assert snap["host"] == {"boot_id": BOOT_A, "hostname": "gpu-node-a"}
    assert snap["selection"] == {"devices": ["mlx5_0"], "ports": ["1"]}
    assert snap["ports"]["mlx5_0/1"]["identity"] == {
        "node_guid": "b83f:d203:00a1:0f3c", "gid0": "fe80:0000:0000:0000:ba3f:d2ff:fea1:0f3c"}
    _rdma.validate_snapshot(copy.deepcopy(snap))  # what the module returns is a valid baseline


def test_unparsable_sysfs_counter_is_not_echoed(tmp_path):
    root = tree(tmp_path, "roce_mlx5")
    write(ib(root, "mlx5_0", "ports", "1", "counters", "port_xmit_data"), SECRET)
    p = _rdma.snapshot(root)["ports"]["mlx5_0/1"]
    assert p["unavailable"]["port_xmit_data"] == "unparsable (not an integer)"
    assert SECRET not in repr(p)


def test_a_fifo_in_the_sysfs_tree_does_not_hang_the_snapshot(tmp_path):
    root = tree(tmp_path, "roce_mlx5")
    path = ib(root, "mlx5_0", "ports", "1", "counters", "port_rcv_data")
    os.unlink(path)
    os.mkfifo(path)
    out = {}
    t = threading.Thread(target=lambda: out.update(snap=_rdma.snapshot(root)), daemon=True)
    t.start()
    t.join(3)
    assert not t.is_alive(), "snapshot blocked on a FIFO"
    assert "port_rcv_data" in out["snap"]["ports"]["mlx5_0/1"]["unavailable"]


# ---- host identity ---------------------------------------------------------------------------------

def test_baseline_of_another_host_is_an_error_even_when_counters_grew(tmp_path):
    root = tree(tmp_path, "roce_mlx5")
    before = _rdma.snapshot(root, proc_root=proc(tmp_path, BOOT_A, "gpu-node-a", "pa"))
    bump(root, "mlx5_0", 1, "port_xmit_data", 1 << 30)  # 4 GiB: would pass expect rdma
    after = _rdma.snapshot(root, proc_root=proc(tmp_path, BOOT_B, "gpu-node-b", "pb"))
    d = _rdma.compare(before, after)
    assert d["totals"] is None and d["ports"] == {}
    v = _rdma.verdict(d, after, "rdma", direction="tx", min_bytes=1 << 20)
    assert not v["passed"] and v["status"] == "error" and v["rdma_bytes"] is None
    assert [m["kind"] for m in v["mismatch"]] == ["host_changed"]
    assert ("the baseline was taken on host gpu-node-a (boot id %s), this is host gpu-node-b (boot id %s)"
            % (BOOT_A, BOOT_B)) in v["summary"]
    assert "take a new baseline here" in v["summary"]


@pytest.mark.parametrize("expect", ["tcp", "any"])
def test_reboot_since_the_baseline_is_an_error_not_a_pass(tmp_path, expect):
    root = tree(tmp_path, "roce_mlx5")
    before = _rdma.snapshot(root, proc_root=proc(tmp_path, BOOT_A, "gpu-node-a", "pa"))
    after = _rdma.snapshot(root, proc_root=proc(tmp_path, BOOT_B, "gpu-node-a", "pb"))
    v = decide(before, after, expect)
    assert v["status"] == "error" and not v["passed"]
    assert [m["kind"] for m in v["mismatch"]] == ["host_rebooted"]
    assert "host gpu-node-a rebooted since the baseline" in v["summary"]
    assert "take a new baseline after the reboot" in v["summary"]


def test_same_kernel_under_a_new_host_name_only_warns(tmp_path):
    # boot_id is per kernel: another pod name on the same node reads the same (node-wide) counters.
    root = tree(tmp_path, "roce_mlx5")
    before = _rdma.snapshot(root, proc_root=proc(tmp_path, BOOT_A, "decode-0", "pa"))
    after = _rdma.snapshot(root, proc_root=proc(tmp_path, BOOT_A, "decode-1", "pb"))
    v = decide(before, after, "tcp")
    assert v["passed"] and v["mismatch"] == []
    assert any("host name changed since the baseline (decode-0, now decode-1)" in w for w in v["warnings"])


def test_unreadable_boot_id_cannot_be_compared(tmp_path):
    root = tree(tmp_path, "roce_mlx5")
    before = _rdma.snapshot(root, proc_root=proc(tmp_path, BOOT_A, "gpu-node-a", "pa"))
    after = _rdma.snapshot(root, proc_root=proc(tmp_path, None, "gpu-node-a", "pb"))
    assert after["host"]["boot_id"] is None
    v = decide(before, after, "tcp")
    assert v["status"] == "error" and v["mismatch"][0]["kind"] == "host_unknown"
    assert "cannot tell whether the baseline was taken on this host" in v["summary"]


# ---- device/port set -------------------------------------------------------------------------------

def test_baseline_with_another_device_selection_is_an_error(tmp_path):
    root = tree(tmp_path, "roce_mlx5")
    before = _rdma.snapshot(root, devices=["mlx5_0"])
    after = _rdma.snapshot(root)
    v = decide(before, after, "tcp")
    assert v["status"] == "error" and v["mismatch"][0]["kind"] == "selection_changed"
    assert ("the baseline covered devices mlx5_0, ports all, this run reads devices all, ports all: pass the "
            "same devices and ports as the baseline run") in v["summary"]


@pytest.mark.parametrize("expect", ["rdma", "tcp", "any"])
def test_port_that_disappeared_is_an_error_in_every_mode(tmp_path, expect):
    root = tree(tmp_path, "roce_mlx5")
    before = _rdma.snapshot(root)
    bump(root, "mlx5_0", 1, "port_xmit_data", 1 << 30)
    shutil.rmtree(ib(root, "mlx5_1"))
    v = decide(before, _rdma.snapshot(root), expect)
    assert v["status"] == "error" and not v["passed"]
    assert [(m["kind"], m["port"]) for m in v["mismatch"]] == [("port_disappeared", "mlx5_1/1")]
    assert "mlx5_1/1 was in the baseline but is gone now" in v["summary"] and "take a new baseline" in v["summary"]


def test_port_that_appeared_is_an_error_and_never_counted_from_zero(tmp_path):
    root = tree(tmp_path, "roce_mlx5")
    before = _rdma.snapshot(root)
    shutil.copytree(ib(root, "mlx5_1"), ib(root, "mlx5_2"))  # a new VF with a lifetime of counters
    after = _rdma.snapshot(root)
    for expect in ("rdma", "tcp"):
        v = decide(before, after, expect)
        assert v["status"] == "error" and v["rdma_bytes"] is None
        assert [(m["kind"], m["port"]) for m in v["mismatch"]] == [("port_appeared", "mlx5_2/1")]
        assert "mlx5_2/1 appeared since the baseline" in v["summary"]


def test_port_whose_hca_was_replaced_is_an_error(tmp_path):
    root = tree(tmp_path, "roce_mlx5")
    before = _rdma.snapshot(root)
    write(ib(root, "mlx5_0", "node_guid"), "0c42:a103:00f1:2b30")
    v = decide(before, _rdma.snapshot(root), "tcp")
    assert v["status"] == "error" and v["mismatch"][0]["kind"] == "port_replaced"
    assert "mlx5_0/1 is not the port of the baseline (node_guid b83f:d203:00a1:0f3c, now 0c42:a103:00f1:2b30)" \
        in v["summary"]


def test_port_whose_gid_changed_is_an_error_but_a_zero_gid_is_unknown(tmp_path):
    root = tree(tmp_path, "roce_mlx5")
    before = _rdma.snapshot(root)
    gid = ib(root, "mlx5_1", "ports", "1", "gids", "0")
    write(gid, "0000:0000:0000:0000:0000:0000:0000:0000")  # netdev gone for a moment: unknown, not another port
    assert decide(before, _rdma.snapshot(root), "tcp")["passed"]
    write(gid, "fe80:0000:0000:0000:0e42:a1ff:fe03:2b31")
    v = decide(before, _rdma.snapshot(root), "tcp")
    assert v["status"] == "error"
    assert [(m["kind"], m["port"]) for m in v["mismatch"]] == [("port_replaced", "mlx5_1/1")]
    assert "GID 0 fe80:0000:0000:0000:ba3f:d2ff:fea1:0f3c, now fe80:0000:0000:0000:0e42:a1ff:fe03:2b31" \
        in v["summary"]


def test_same_host_same_ports_still_passes(tmp_path):
    root = tree(tmp_path, "roce_mlx5")
    pr = proc(tmp_path, BOOT_A, "gpu-node-a")
    before = _rdma.snapshot(root, proc_root=pr)
    bump(root, "mlx5_0", 1, "port_xmit_data", 1 << 20)
    v = decide(before, _rdma.snapshot(root, proc_root=pr), "rdma", min_bytes=4 << 20)
    assert v["passed"] and v["status"] == "pass" and v["mismatch"] == [] and v["rdma_bytes"] == 4 << 20


# ---- NIXL expired / failed transfers under expect tcp ----------------------------------------------

def _prom_text(name, **replace):
    with open(os.path.join(PROM, name)) as f:
        text = f.read()
    for metric, value in replace.items():
        lines = []
        for line in text.splitlines():
            if line.startswith("vllm:%s{" % metric):
                line = line.rsplit(" ", 1)[0] + " %s" % value
            lines.append(line)
        text = "\n".join(lines) + "\n"
    return text


def _kv(before, after):
    return _prom.kv_delta(_prom.kv_sample(before), _prom.kv_sample(after))


def test_tcp_control_with_expired_kv_requests_on_prefill_warns(tmp_path):
    # vLLM counts nixl_num_kv_expired_reqs on the P instance (NixlPromMetrics; see the notes' metrics table).
    root = tree(tmp_path, "roce_mlx5")
    before = _rdma.snapshot(root)
    after = _rdma.snapshot(root)
    prefill = _kv(_prom_text("vllm_decode_before.txt"),
                  _prom_text("vllm_decode_before.txt", nixl_num_kv_expired_reqs_total="3.0"))
    decode = _kv(_prom_text("vllm_decode_before.txt"), _prom_text("vllm_decode_after.txt"))
    v = _rdma.verdict(_rdma.compare(before, after), after, "tcp", kv=decode, kv_prefill=prefill)
    assert v["kv_expired_reqs"] == 3
    warn = [w for w in v["warnings"] if "expired" in w]
    assert warn and "the prefill engine reports 3 KV requests that expired" in warn[0]
    assert "idle RDMA ports may only mean that the KV never moved" in warn[0]


def test_tcp_control_with_expired_kv_requests_on_decode_warns(tmp_path):
    root = tree(tmp_path, "roce_mlx5")
    before = _rdma.snapshot(root)
    after = _rdma.snapshot(root)
    decode = _kv(_prom_text("vllm_decode_before.txt"),
                 _prom_text("vllm_decode_after.txt", nixl_num_kv_expired_reqs_total="2.0"))
    v = _rdma.verdict(_rdma.compare(before, after), after, "tcp", kv=decode)
    assert any("the decode engine reports 2 KV requests that expired" in w for w in v["warnings"])


def test_tcp_control_with_failed_transfers_warns_and_fails(tmp_path):
    root = tree(tmp_path, "roce_mlx5")
    before = _rdma.snapshot(root)
    after = _rdma.snapshot(root)
    decode = _kv(_prom_text("vllm_decode_before.txt"), _prom_text("vllm_decode_failed.txt"))
    v = _rdma.verdict(_rdma.compare(before, after), after, "tcp", kv=decode)
    assert not v["passed"] and "the engine reports 2 failed KV transfers" in v["summary"]
    assert any("the decode engine reports 2 failed KV transfers" in w and "KV never moved" in w
               for w in v["warnings"])


# ---- a malformed baseline is a clean error naming the field ----------------------------------------

def _valid(tmp_path):
    root = tree(tmp_path, "roce_mlx5")
    snap = _rdma.snapshot(root, proc_root=proc(tmp_path, BOOT_A, "gpu-node-a"))
    snap["kv"] = _prom.kv_sample(_prom_text("vllm_decode_before.txt"))
    return snap


def _deep_list(depth):
    top = leaf = []
    for dummy in range(depth - 1):
        leaf.append([])
        leaf = leaf[0]
    return top


def _set(path, value):
    def mutate(doc):
        *parents, last = path
        for p in parents:
            doc = doc[p]
        if value is KeyError:
            del doc[last]
        else:
            doc[last] = value
    return mutate


P0 = ("ports", "mlx5_0/1")
MALFORMED = [
    ("missing ports", _set(("ports",), KeyError), "baseline: ports is missing"),
    ("missing host", _set(("host",), KeyError), "baseline: host is missing"),
    ("old schema", _set(("schema",), 1), "baseline: schema is 1, this version reads 2"),
    ("schema string", _set(("schema",), SECRET), "baseline: schema must be an integer (got a string)"),
    ("taken_at string", _set(("taken_at",), SECRET), "baseline: taken_at must be a time in seconds (got a string)"),
    ("boot_id junk", _set(("host", "boot_id"), SECRET), "baseline: host.boot_id must be null or a boot id"),
    ("ports list", _set(("ports",), [SECRET]), "baseline: ports must be a mapping (got a list)"),
    ("port entry list", _set(P0, [SECRET]), "baseline: ports.mlx5_0/1 must be a mapping (got a list)"),
    ("counter string", _set(P0 + ("counters", "port_xmit_data"), SECRET),
     "baseline: ports.mlx5_0/1.counters.port_xmit_data must be a non-negative integer below 2**64 (got a string)"),
    ("counter float", _set(P0 + ("counters", "port_xmit_data"), 1.5),
     "baseline: ports.mlx5_0/1.counters.port_xmit_data must be a non-negative integer"),
    ("counter bool", _set(P0 + ("counters", "port_rcv_data"), True),
     "baseline: ports.mlx5_0/1.counters.port_rcv_data must be a non-negative integer below 2**64 (got a boolean)"),
    ("counter negative", _set(P0 + ("counters", "port_rcv_data"), -5),
     "baseline: ports.mlx5_0/1.counters.port_rcv_data must be a non-negative integer"),
    ("counters list", _set(P0 + ("counters",), []), "baseline: ports.mlx5_0/1.counters must be a mapping (got a list)"),
    ("hw counter string", _set(P0 + ("hw_counters", "rx_read_requests"), SECRET),
     "baseline: ports.mlx5_0/1.hw_counters.rx_read_requests must be a non-negative integer"),
    ("identity missing", _set(P0 + ("identity",), KeyError), "baseline: ports.mlx5_0/1.identity is missing"),
    ("guid junk", _set(P0 + ("identity", "node_guid"), SECRET),
     "baseline: ports.mlx5_0/1.identity.node_guid must be null or a node GUID"),
    ("unavailable junk", _set(P0 + ("unavailable",), {"port_xmit_data": SECRET}),
     "baseline: ports.mlx5_0/1.unavailable.port_xmit_data must be one of the reasons"),
    ("device mismatch", _set(P0 + ("device",), "mlx5_9"),
     "baseline: ports.mlx5_0/1 names another port in its device/port fields than its key"),
    ("bad port key", _set(("ports", SECRET), {}), "baseline: ports[<a key that is not '<device>/<port>'>]"),
    ("bad counter name", _set(P0 + ("counters", SECRET + " x"), 1),
     "baseline: ports.mlx5_0/1.counters[<a key that is not a counter name>] must be a sysfs counter name"),
    ("kv bytes string", _set(("kv", "bytes"), SECRET), "baseline: kv.bytes must be null or a number (got a string)"),
    ("kv sources list", _set(("kv", "prompt_tokens_by_source"), [SECRET]),
     "baseline: kv.prompt_tokens_by_source must be a mapping (got a list)"),
    ("selection string", _set(("selection", "devices"), SECRET), "baseline: selection.devices must be a list"),
    # before: math.isfinite(10**400) raised OverflowError out of the module
    ("taken_at 10**400", _set(("taken_at",), 10 ** 400), "baseline holds a number beyond +/-2**64, so it is refused"),
    ("taken_at inf", _set(("taken_at",), float("inf")), "baseline holds a number that is not finite"),
    ("kv bytes 10**400", _set(("kv", "bytes"), -10 ** 400), "baseline holds a number beyond +/-2**64"),
    ("kv nested", _set(("kv", "engine"), _deep_list(70)),
     "baseline nests deeper than 64 levels"),
]


@pytest.mark.parametrize("name,mutate,msg", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_baseline_names_the_field_never_the_value(tmp_path, name, mutate, msg):
    doc = _valid(tmp_path)
    mutate(doc)
    with pytest.raises(_rdma.RdmaError) as e:
        _rdma.validate_snapshot(doc)
    assert str(e.value).startswith(msg), str(e.value)
    assert str(e.value).endswith("take a new baseline with this module and pass its 'snapshot' unchanged")
    assert SECRET not in str(e.value)


@pytest.mark.parametrize("doc,msg", [
    ([1, 2], "baseline: must be a mapping (the 'snapshot' of an earlier rdma_counters run), not a list"),
    (SECRET, "baseline: must be a mapping (the 'snapshot' of an earlier rdma_counters run), not a string"),
    ({"changed": False, "snapshot": {"ports": {}}}, "baseline: is a whole registered result, not its snapshot"),
])
def test_baseline_of_the_wrong_top_level_type(doc, msg):
    with pytest.raises(_rdma.RdmaError) as e:
        _rdma.validate_snapshot(doc)
    assert str(e.value).startswith(msg) and SECRET not in str(e.value)


def test_validated_baseline_still_compares(tmp_path):
    doc = _valid(tmp_path)
    _rdma.validate_snapshot(doc)
    assert _rdma.compare(doc, doc)["mismatch"] == []
