"""llmops.serving.rdma_counters as a playbook uses it: snapshot, load, compare, verdict."""
from __future__ import annotations

import http.server
import os
import shutil
import threading

import pytest

from ansible_collections.llmops.serving.plugins.modules import rdma_counters

FIX = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures")
METRICS_PORT = 18190


def tree(tmp_path, name):
    dst = tmp_path / name
    shutil.copytree(os.path.join(FIX, "sysfs", name), dst)
    return str(dst)


def bump(root, dev, port, name, delta):
    path = os.path.join(root, "class", "infiniband", dev, "ports", str(port), "counters", name)
    with open(path) as f:
        value = int(f.read())
    with open(path, "w") as f:
        f.write("%d\n" % (value + delta))


def prom(name):
    with open(os.path.join(FIX, "prom", name)) as f:
        return f.read()


def test_snapshot_only_in_check_mode(run_module, tmp_path):
    root = tree(tmp_path, "roce_mlx5")
    r = run_module(rdma_counters, {"sysfs_root": root}, check_mode=True)
    assert r["changed"] is False and r["present"] is True
    assert r["snapshot"]["ports"]["mlx5_1/1"]["link_layer"] == "Ethernet"
    assert "verdict" not in r and "deltas" not in r


def test_rdma_round_passes_with_per_port_deltas(run_module, tmp_path):
    root = tree(tmp_path, "roce_mlx5")
    before = run_module(rdma_counters, {"sysfs_root": root})
    bump(root, "mlx5_0", 1, "port_xmit_data", 4_772_500_000)
    bump(root, "mlx5_1", 1, "port_xmit_data", 4_772_500_000)
    r = run_module(rdma_counters, {"sysfs_root": root, "baseline": before["snapshot"], "expect": "rdma",
                                   "direction": "tx", "min_bytes": 30_000_000_000})
    assert not r.get("failed"), r["msg"]
    assert r["deltas"]["totals"]["tx_bytes"] == 38_180_000_000
    assert r["deltas"]["ports"]["mlx5_1/1"]["tx_bytes"] == 19_090_000_000
    assert r["verdict"]["status"] == "pass" and r["msg"].startswith("expect rdma: PASS")


def test_rdma_round_fails_when_counters_did_not_move(run_module, tmp_path):
    root = tree(tmp_path, "roce_mlx5")
    before = run_module(rdma_counters, {"sysfs_root": root})
    r = run_module(rdma_counters, {"sysfs_root": root, "baseline": before["snapshot"], "expect": "rdma"})
    assert r["failed"] and r["verdict"]["passed"] is False
    assert "below min_bytes 1048576" in r["msg"]
    assert r["deltas"]["totals"]["tx_bytes"] == 0  # evidence still returned on failure


def test_tcp_control_pass_and_fail(run_module, tmp_path):
    root = tree(tmp_path, "ib_hca")
    before = run_module(rdma_counters, {"sysfs_root": root})
    ok = run_module(rdma_counters, {"sysfs_root": root, "baseline": before["snapshot"], "expect": "tcp"})
    assert not ok.get("failed") and ok["verdict"]["link_layers"] == ["InfiniBand"]
    bump(root, "mlx5_ib0", 1, "port_rcv_data", 10_000_000)
    bad = run_module(rdma_counters, {"sysfs_root": root, "baseline": before["snapshot"], "expect": "tcp",
                                     "tolerance_bytes": 0})
    assert bad["failed"] and "the control run used RDMA" in bad["msg"]


def test_tcp_control_on_host_without_rdma_says_so(run_module, tmp_path):
    root = tree(tmp_path, "no_rdma")
    before = run_module(rdma_counters, {"sysfs_root": root})
    assert before["present"] is False and "no RDMA devices" in before["reason"]
    r = run_module(rdma_counters, {"sysfs_root": root, "baseline": before["snapshot"], "expect": "tcp"})
    assert not r.get("failed")
    assert "no RDMA devices" in r["msg"] and "no RDMA port could carry the transfer" in r["msg"]


def test_counter_reset_is_reported_and_control_not_confirmed(run_module, tmp_path):
    root = tree(tmp_path, "roce_mlx5")
    before = run_module(rdma_counters, {"sysfs_root": root})
    bump(root, "mlx5_0", 1, "port_rcv_data", -900_000_000)
    r = run_module(rdma_counters, {"sysfs_root": root, "baseline": before["snapshot"], "expect": "tcp"})
    assert r["failed"] and "cannot confirm RDMA stayed idle" in r["msg"]
    assert r["deltas"]["ports"]["mlx5_0/1"]["status"]["port_rcv_data"] == "reset"
    assert r["deltas"]["ports"]["mlx5_0/1"]["rx_bytes"] is None


def test_saturated_counter_cannot_prove_rdma(run_module, tmp_path):
    root = tree(tmp_path, "saturated")
    before = run_module(rdma_counters, {"sysfs_root": root})
    r = run_module(rdma_counters, {"sysfs_root": root, "baseline": before["snapshot"], "expect": "rdma",
                                   "direction": "tx"})
    assert r["failed"] and "could not be trusted" in r["msg"]
    assert any("port_xmit_data is saturated" in w for w in r["verdict"]["warnings"])


def test_missing_device_fails_before_reading(run_module, tmp_path):
    r = run_module(rdma_counters, {"sysfs_root": tree(tmp_path, "roce_mlx5"), "devices": ["mlx5_4"]})
    assert r["failed"] and r["msg"].startswith("devices: mlx5_4 not found")
    assert "present: mlx5_0, mlx5_1" in r["msg"]


def test_bad_baseline_and_bad_numbers_name_the_option(run_module, tmp_path):
    root = tree(tmp_path, "roce_mlx5")
    r = run_module(rdma_counters, {"sysfs_root": root, "baseline": {"foo": 1}})
    assert r["failed"] and r["msg"].startswith("baseline: expected the 'snapshot'")
    r = run_module(rdma_counters, {"sysfs_root": root, "min_bytes": -1})
    assert r["failed"] and r["msg"].startswith("min_bytes: must be >= 0")
    r = run_module(rdma_counters, {"sysfs_root": root, "min_nixl_ratio": 0})
    assert r["failed"] and r["msg"].startswith("min_nixl_ratio:")


def test_nixl_cross_check_from_text(run_module, tmp_path):
    root = tree(tmp_path, "roce_mlx5")
    before = run_module(rdma_counters, {"sysfs_root": root, "nixl_metrics": prom("vllm_decode_before.txt")})
    assert before["snapshot"]["kv"]["bytes"] == pytest.approx(4.77e9)
    bump(root, "mlx5_0", 1, "port_rcv_data", 4_800_000_000)
    bump(root, "mlx5_1", 1, "port_rcv_data", 4_800_000_000)
    args = {"sysfs_root": root, "baseline": before["snapshot"], "expect": "rdma", "direction": "rx"}
    r = run_module(rdma_counters, dict(args, nixl_metrics=prom("vllm_decode_after.txt")))
    assert not r.get("failed"), r["msg"]
    assert r["kv"]["bytes"] == pytest.approx(38.18e9)
    assert r["kv"]["rate_bytes_per_s"] == pytest.approx(38.18e9 / 4.1)
    assert r["kv"]["prompt_tokens_by_source"]["external_kv_transfer"] == 262080
    failed = run_module(rdma_counters, dict(args, nixl_metrics=prom("vllm_decode_failed.txt")))
    assert failed["failed"] and "2 failed KV transfers" in failed["msg"]


def test_nixl_cross_check_catches_kv_that_went_over_tcp(run_module, tmp_path):
    root = tree(tmp_path, "roce_mlx5")
    before = run_module(rdma_counters, {"sysfs_root": root, "nixl_metrics": prom("vllm_decode_before.txt")})
    bump(root, "mlx5_0", 1, "port_rcv_data", 500_000_000)   # 2 GB: passes min_bytes on its own
    r = run_module(rdma_counters, {"sysfs_root": root, "baseline": before["snapshot"], "expect": "rdma",
                                   "direction": "rx", "nixl_metrics": prom("vllm_decode_after.txt")})
    assert r["failed"] and "most likely TCP" in r["msg"]


def test_bad_metrics_text_names_the_option(run_module, tmp_path):
    r = run_module(rdma_counters, {"sysfs_root": tree(tmp_path, "no_rdma"), "nixl_metrics": "<html>oops</html>"})
    assert r["failed"] and r["msg"].startswith("nixl_metrics: not Prometheus text")


def test_missing_baseline_sample_warns(run_module, tmp_path):
    root = tree(tmp_path, "no_rdma")
    before = run_module(rdma_counters, {"sysfs_root": root})
    r = run_module(rdma_counters, {"sysfs_root": root, "baseline": before["snapshot"], "expect": "tcp",
                                   "nixl_metrics": prom("vllm_decode_after.txt")})
    assert not r.get("failed") and r["kv"]["baseline"] is False
    assert r["kv"]["bytes"] == pytest.approx(4.77e9 + 38.18e9)


class _Metrics(http.server.BaseHTTPRequestHandler):
    body = b""

    def do_GET(self):  # noqa: N802 - http.server API
        if self.path != "/metrics":
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *a):
        pass


@pytest.fixture
def metrics_server():
    srv = http.server.HTTPServer(("127.0.0.1", METRICS_PORT), _Metrics)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield _Metrics
    srv.shutdown()
    srv.server_close()


def test_nixl_metrics_url_is_fetched_at_snapshot_and_compare(run_module, tmp_path, metrics_server):
    root = tree(tmp_path, "no_rdma")
    url = "http://127.0.0.1:%d/metrics" % METRICS_PORT
    metrics_server.body = prom("vllm_decode_before.txt").encode()
    before = run_module(rdma_counters, {"sysfs_root": root, "nixl_metrics": url})
    metrics_server.body = prom("vllm_decode_after.txt").encode()
    r = run_module(rdma_counters, {"sysfs_root": root, "baseline": before["snapshot"], "expect": "tcp",
                                   "nixl_metrics": url})
    assert not r.get("failed"), r["msg"]
    assert r["kv"]["bytes"] == pytest.approx(38.18e9) and r["kv"]["failures"] == 0
    down = run_module(rdma_counters, {"sysfs_root": root, "nixl_metrics": url.replace("/metrics", "/nope")})
    assert down["failed"] and down["msg"].startswith("nixl_metrics: cannot read %s" % url.replace("/metrics", "/nope"))
