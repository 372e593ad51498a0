"""RDMA sysfs snapshots, deltas and verdicts on fixture trees modelled on real HCAs."""
from __future__ import annotations

import os
import shutil

import pytest

from ansible_collections.llmops.serving.plugins.module_utils.transport import _prom, _rdma

FIX = os.path.join(os.path.dirname(os.path.dirname(__file__)), "..", "..", "fixtures")
SYSFS = os.path.join(FIX, "sysfs")
PROM = os.path.join(FIX, "prom")


def tree(tmp_path, name):
    dst = tmp_path / name
    shutil.copytree(os.path.join(SYSFS, name), dst)
    return str(dst)


def counter_path(root, dev, port, name, hw=False):
    return os.path.join(root, "class", "infiniband", dev, "ports", str(port),
                        "hw_counters" if hw else "counters", name)


def set_counter(root, dev, port, name, value, hw=False):
    with open(counter_path(root, dev, port, name, hw), "w") as f:
        f.write("%s\n" % value)


def bump(root, dev, port, name, delta, hw=False):
    with open(counter_path(root, dev, port, name, hw)) as f:
        value = int(f.read())
    set_counter(root, dev, port, name, value + delta, hw)


class Clock:
    def __init__(self, t=1000.0):
        self.t = t

    def __call__(self):
        return self.t


def prom(name):
    with open(os.path.join(PROM, name)) as f:
        return f.read()


# ---- snapshot -------------------------------------------------------------------------------------

def test_roce_snapshot_reads_link_layer_counters_times_four_and_hw_counters(tmp_path):
    root = tree(tmp_path, "roce_mlx5")
    snap = _rdma.snapshot(root)
    assert snap["present"] is True and snap["reason"] == ""
    assert sorted(snap["ports"]) == ["mlx5_0/1", "mlx5_1/1"]
    p = snap["ports"]["mlx5_0/1"]
    assert p["link_layer"] == "Ethernet" and p["transport"] == "RoCE"
    assert p["state"] == "4: ACTIVE" and p["rate"].startswith("400 Gb/sec")
    assert p["counters"]["port_xmit_data"] == 1200000000
    assert p["tx_bytes"] == 4 * 1200000000 and p["rx_bytes"] == 4 * 900000000
    assert p["hw_counters"]["rx_read_requests"] == 5000
    assert p["saturated"] == [] and p["unavailable"] == {}


def test_infiniband_hca_is_reported_as_infiniband(tmp_path):
    snap = _rdma.snapshot(tree(tmp_path, "ib_hca"))
    p = snap["ports"]["mlx5_ib0/1"]
    assert p["link_layer"] == "InfiniBand" and p["transport"] == "InfiniBand"
    assert p["tx_bytes"] == 73014444032 * 4


def test_saturated_32bit_counter_is_flagged_in_snapshot(tmp_path):
    snap = _rdma.snapshot(tree(tmp_path, "saturated"))
    assert snap["ports"]["mthca0/1"]["saturated"] == ["port_xmit_data"]


def test_no_pma_counters_are_unavailable_not_zero(tmp_path):
    p = _rdma.snapshot(tree(tmp_path, "no_pma"))["ports"]["qedr0/1"]
    assert p["unavailable"]["port_xmit_data"] == "N/A (no PMA)"
    assert "port_xmit_data" not in p["counters"] and p["tx_bytes"] is None


def test_no_class_infiniband_gives_empty_snapshot_with_reason(tmp_path):
    root = tree(tmp_path, "no_rdma")
    snap = _rdma.snapshot(root)
    assert snap["present"] is False and snap["ports"] == {}
    assert "no RDMA devices" in snap["reason"] and "class/infiniband does not exist" in snap["reason"]


def test_devices_on_a_host_without_rdma_is_an_error(tmp_path):
    with pytest.raises(_rdma.RdmaError, match=r"devices: mlx5_0 requested but .* does not exist"):
        _rdma.snapshot(tree(tmp_path, "no_rdma"), devices=["mlx5_0"])


def test_devices_and_ports_filter(tmp_path):
    root = tree(tmp_path, "roce_mlx5")
    assert list(_rdma.snapshot(root, devices=["mlx5_1"])["ports"]) == ["mlx5_1/1"]
    assert sorted(_rdma.snapshot(root, ports=[1])["ports"]) == ["mlx5_0/1", "mlx5_1/1"]


def test_missing_device_names_the_devices_present(tmp_path):
    with pytest.raises(_rdma.RdmaError) as e:
        _rdma.snapshot(tree(tmp_path, "roce_mlx5"), devices=["mlx5_0", "mlx5_7"])
    assert "devices: mlx5_7 not found" in str(e.value)
    assert "present: mlx5_0, mlx5_1" in str(e.value)


def test_missing_port_is_an_error(tmp_path):
    with pytest.raises(_rdma.RdmaError, match=r"ports: 2 not found on mlx5_0, mlx5_1 \(ports present: 1\)"):
        _rdma.snapshot(tree(tmp_path, "roce_mlx5"), ports=[2])


# ---- compare --------------------------------------------------------------------------------------

def test_compare_reports_bytes_packets_hw_deltas_and_rate(tmp_path):
    root = tree(tmp_path, "roce_mlx5")
    before = _rdma.snapshot(root, now=Clock(1000.0))
    bump(root, "mlx5_0", 1, "port_xmit_data", 2_500_000_000)   # 10 GB
    bump(root, "mlx5_0", 1, "port_xmit_packets", 2_441_406)
    bump(root, "mlx5_1", 1, "port_rcv_data", 250)
    bump(root, "mlx5_0", 1, "rx_read_requests", 1200, hw=True)
    set_counter(root, "mlx5_0", 1, "lifespan", 20, hw=True)
    after = _rdma.snapshot(root, now=Clock(1010.0))
    d = _rdma.compare(before, after)
    assert d["elapsed_s"] == 10.0
    p0 = d["ports"]["mlx5_0/1"]
    assert p0["tx_bytes"] == 10_000_000_000 and p0["tx_packets"] == 2_441_406
    assert p0["tx_bytes_per_s"] == 1e9
    assert p0["rx_bytes"] == 0
    assert p0["hw_counters"]["rx_read_requests"] == 1200
    assert "lifespan" not in p0["hw_counters"]
    assert d["totals"] == {"tx_bytes": 10_000_000_000, "rx_bytes": 1000,
                           "tx_packets": 2_441_406, "rx_packets": 0}
    assert d["untrusted"] == [] and d["missing_ports"] == []


def test_counter_that_went_down_is_a_reset_never_negative(tmp_path):
    root = tree(tmp_path, "roce_mlx5")
    before = _rdma.snapshot(root)
    set_counter(root, "mlx5_0", 1, "port_xmit_data", 10)
    set_counter(root, "mlx5_0", 1, "rx_read_requests", 1, hw=True)
    d = _rdma.compare(before, _rdma.snapshot(root))
    p0 = d["ports"]["mlx5_0/1"]
    assert p0["status"]["port_xmit_data"] == "reset" and p0["tx_bytes"] is None
    assert d["totals"]["tx_bytes"] == 0
    assert p0["hw_counters_reset"] == ["rx_read_requests"]
    assert all(v >= 0 for v in d["totals"].values())
    assert {"port": "mlx5_0/1", "counter": "port_xmit_data", "status": "reset",
            "detail": "reset"} in d["untrusted"]


def test_saturated_counter_delta_is_untrusted(tmp_path):
    root = tree(tmp_path, "saturated")
    before = _rdma.snapshot(root)
    bump(root, "mthca0", 1, "port_rcv_data", 1000)
    d = _rdma.compare(before, _rdma.snapshot(root))
    p = d["ports"]["mthca0/1"]
    assert p["status"]["port_xmit_data"] == "saturated" and p["tx_bytes"] is None
    assert p["rx_bytes"] == 4000
    assert d["untrusted"][0]["status"] == "saturated"


def test_counter_reaching_saturation_during_the_load_is_untrusted(tmp_path):
    root = tree(tmp_path, "ib_hca")
    before = _rdma.snapshot(root)
    set_counter(root, "mlx5_ib0", 1, "port_rcv_data", 2 ** 32 - 1)
    d = _rdma.compare(before, _rdma.snapshot(root))
    # 2**32-1 is below the baseline here, but saturation wins over "reset": the value is a clamp.
    assert d["ports"]["mlx5_ib0/1"]["status"]["port_rcv_data"] == "saturated"


def test_vanished_and_new_ports_are_listed(tmp_path):
    root = tree(tmp_path, "roce_mlx5")
    before = _rdma.snapshot(root)
    shutil.rmtree(os.path.join(root, "class", "infiniband", "mlx5_1"))
    d = _rdma.compare(before, _rdma.snapshot(root))
    assert d["missing_ports"] == ["mlx5_1/1"] and list(d["ports"]) == ["mlx5_0/1"]
    d2 = _rdma.compare(_rdma.snapshot(root), before)
    assert d2["new_ports"] == ["mlx5_1/1"]


# ---- verdict --------------------------------------------------------------------------------------

def _run(root, mutate, expect, direction="both", min_bytes=1 << 20, tolerance_bytes=1 << 20, kv=None):
    before = _rdma.snapshot(root)
    mutate(root)
    after = _rdma.snapshot(root)
    return _rdma.verdict(_rdma.compare(before, after), after, expect, direction=direction,
                         min_bytes=min_bytes, tolerance_bytes=tolerance_bytes, kv=kv)


def test_rdma_passes_when_direction_moved_min_bytes(tmp_path):
    v = _run(tree(tmp_path, "roce_mlx5"), lambda r: bump(r, "mlx5_0", 1, "port_xmit_data", 1 << 20),
             "rdma", direction="tx", min_bytes=4 << 20)
    assert v["passed"] and v["status"] == "pass" and v["rdma_bytes"] == 4 << 20
    assert v["link_layers"] == ["Ethernet"]


def test_rdma_fails_when_only_the_other_direction_moved(tmp_path):
    v = _run(tree(tmp_path, "roce_mlx5"), lambda r: bump(r, "mlx5_0", 1, "port_xmit_data", 1 << 20),
             "rdma", direction="rx", min_bytes=1 << 20)
    assert not v["passed"] and v["rdma_bytes"] == 0
    assert "below min_bytes 1048576" in v["summary"] and "UCX_TLS" in v["summary"]


def test_rdma_shortfall_says_how_much_moved_in_the_shared_units(tmp_path):
    # RoCE data counters count 4-byte words: 1 << 19 words = 2 MiB, written as _units writes sizes
    v = _run(tree(tmp_path, "roce_mlx5"), lambda r: bump(r, "mlx5_0", 1, "port_xmit_data", 1 << 19),
             "rdma", direction="tx", min_bytes=8 << 20)
    assert not v["passed"]
    assert "RDMA ports moved 2.0 MiB (2097152 bytes, tx) during the load, below min_bytes 8388608" in v["summary"]


def test_rdma_fails_on_a_host_without_rdma(tmp_path):
    v = _run(tree(tmp_path, "no_rdma"), lambda r: None, "rdma")
    assert not v["passed"] and "no RDMA devices" in v["summary"]


def test_tcp_control_passes_when_ports_idle_and_fails_when_rdma_moved(tmp_path):
    root = tree(tmp_path, "roce_mlx5")
    assert _run(root, lambda r: bump(r, "mlx5_1", 1, "port_rcv_data", 100), "tcp")["passed"]
    v = _run(root, lambda r: bump(r, "mlx5_1", 1, "port_rcv_data", 1 << 20), "tcp", tolerance_bytes=1 << 20)
    assert not v["passed"]
    assert "during the TCP control run, above tolerance_bytes 1048576: the control run used RDMA" in v["summary"]


def test_tcp_control_on_host_without_rdma_passes_and_says_why(tmp_path):
    v = _run(tree(tmp_path, "no_rdma"), lambda r: None, "tcp")
    assert v["passed"] and v["rdma_bytes"] == 0
    assert "no RDMA devices" in v["summary"] and "no RDMA port could carry the transfer" in v["summary"]


def test_tcp_control_cannot_pass_with_untrusted_counters(tmp_path):
    v = _run(tree(tmp_path, "saturated"), lambda r: None, "tcp")
    assert not v["passed"] and "cannot confirm RDMA stayed idle" in v["summary"]
    assert any("saturated" in w and "perfquery" in w for w in v["warnings"])
    v = _run(tree(tmp_path, "no_pma"), lambda r: None, "tcp")
    assert not v["passed"] and any("N/A (no PMA)" in w for w in v["warnings"])


@pytest.mark.parametrize("expect", ["tcp", "rdma", "any"])
def test_port_counter_that_went_backwards_is_an_error_in_every_mode(tmp_path, expect):
    # The other port moved 4 GiB, enough for expect rdma on its own: the reset must still not pass.
    def mutate(r):
        set_counter(r, "mlx5_0", 1, "port_xmit_data", 0)
        bump(r, "mlx5_1", 1, "port_xmit_data", 1 << 30)
    v = _run(tree(tmp_path, "roce_mlx5"), mutate, expect, direction="tx")
    assert not v["passed"] and v["status"] == "error" and v["rdma_bytes"] is None
    assert [m["kind"] for m in v["mismatch"]] == ["counter_reset"]
    assert v["summary"].startswith("expect %s: ERROR" % expect)
    assert "mlx5_0/1 port_xmit_data went backwards since the baseline (1200000000, now 0" in v["summary"]
    assert "take a new baseline" in v["summary"]


def test_packet_counter_that_went_backwards_is_an_error(tmp_path):
    v = _run(tree(tmp_path, "ib_hca"), lambda r: set_counter(r, "mlx5_ib0", 1, "port_rcv_packets", 0), "any")
    assert v["status"] == "error" and "mlx5_ib0/1 port_rcv_packets went backwards" in v["summary"]


def test_hw_counter_that_went_down_only_warns(tmp_path):
    # Some mlx5 hw_counters are 32-bit and wrap (notes: DPDK "net/mlx5: fix imissed counter overflow").
    v = _run(tree(tmp_path, "roce_mlx5"), lambda r: set_counter(r, "mlx5_0", 1, "rx_read_requests", 1, hw=True),
             "tcp")
    assert v["passed"] and v["mismatch"] == []
    assert any("hw_counters went down" in w and "rx_read_requests" in w for w in v["warnings"])


def test_expect_any_only_reports(tmp_path):
    v = _run(tree(tmp_path, "saturated"), lambda r: None, "any")
    assert v["passed"] and v["warnings"]


def _kv(before, after):
    return _prom.kv_delta(_prom.kv_sample(prom(before)), _prom.kv_sample(prom(after)))


def test_rdma_with_nixl_passes_when_ports_account_for_the_kv(tmp_path):
    kv = _kv("vllm_decode_before.txt", "vllm_decode_after.txt")
    v = _run(tree(tmp_path, "roce_mlx5"),
             lambda r: bump(r, "mlx5_0", 1, "port_rcv_data", int(38.2e9 / 4)), "rdma", direction="rx", kv=kv)
    assert v["passed"], v["summary"]
    assert v["kv_bytes"] == pytest.approx(38.18e9) and v["kv_failures"] == 0


def test_rdma_with_nixl_fails_when_kv_bypassed_rdma(tmp_path):
    kv = _kv("vllm_decode_before.txt", "vllm_decode_after.txt")
    # 2 GB of unrelated RDMA traffic passes min_bytes, but 38 GB of KV cannot have crossed on RDMA.
    v = _run(tree(tmp_path, "roce_mlx5"), lambda r: bump(r, "mlx5_0", 1, "port_rcv_data", int(2e9 / 4)),
             "rdma", direction="rx", kv=kv)
    assert not v["passed"]
    assert "the KV went over another transport, most likely TCP" in v["summary"]


def test_rdma_with_failed_transfers_fails(tmp_path):
    kv = _kv("vllm_decode_before.txt", "vllm_decode_failed.txt")
    v = _run(tree(tmp_path, "roce_mlx5"),
             lambda r: bump(r, "mlx5_0", 1, "port_rcv_data", int(40e9 / 4)), "rdma", direction="rx", kv=kv)
    assert not v["passed"] and "2 failed KV transfers" in v["summary"]


def test_rdma_with_no_kv_moved_fails_and_recompute_is_reported(tmp_path):
    kv = _kv("vllm_decode_before.txt", "vllm_decode_recompute.txt")
    v = _run(tree(tmp_path, "roce_mlx5"),
             lambda r: bump(r, "mlx5_0", 1, "port_rcv_data", 1 << 30), "rdma", direction="rx", kv=kv)
    assert not v["passed"] and "no KV bytes transferred (0)" in v["summary"]
    assert any("computed 8192 prompt tokens locally" in w for w in v["warnings"])


@pytest.mark.parametrize("raw", ["9" * 4000, str(2 ** 64)])
def test_a_counter_beyond_64_bits_is_unavailable_and_the_snapshot_is_a_valid_baseline(tmp_path, raw):
    """4000 digits in a sysfs counter became a snapshot value the same module refused as a baseline (a counter is
    below 2**64)."""
    root = tree(tmp_path, "roce_mlx5")
    set_counter(root, "mlx5_0", 1, "port_xmit_data", raw)
    snap = _rdma.snapshot(root)
    port = snap["ports"]["mlx5_0/1"]
    assert port["unavailable"]["port_xmit_data"] == "unparsable (beyond 64 bits)"
    assert "port_xmit_data" not in port["counters"]
    _rdma.validate_snapshot(snap, "baseline")
