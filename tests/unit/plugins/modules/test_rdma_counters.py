"""llmops.serving.rdma_counters as a playbook uses it: snapshot, load, compare, verdict."""
from __future__ import annotations

import http.server
import json
import os
import shutil
import threading
import time

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


def test_counter_reset_is_an_error_with_the_fix(run_module, tmp_path):
    root = tree(tmp_path, "roce_mlx5")
    before = run_module(rdma_counters, {"sysfs_root": root})
    bump(root, "mlx5_0", 1, "port_rcv_data", -900_000_000)
    r = run_module(rdma_counters, {"sysfs_root": root, "baseline": before["snapshot"], "expect": "any"})
    assert r["failed"] and r["msg"].startswith("expect any: ERROR")
    assert "mlx5_0/1 port_rcv_data went backwards since the baseline" in r["msg"]
    assert "take a new baseline" in r["msg"]
    assert r["verdict"]["status"] == "error" and r["mismatch"][0]["kind"] == "counter_reset"
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
    assert r["failed"] and r["msg"].startswith("baseline: schema is missing: this is not the 'snapshot'")
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


# ---- like with like: host, ports, baseline files ----------------------------------------------------

BOOT_A = "f8b03bce-ed06-4c61-826b-7ea3da125e3e"
BOOT_B = "0c1d2e3f-4a5b-4c6d-8e7f-901234567890"
SECRET = "hunter2-SECRET-TOKEN"


def fake_proc(tmp_path, name, boot_id, hostname):
    root = tmp_path / name
    (root / "sys" / "kernel" / "random").mkdir(parents=True)
    (root / "sys" / "kernel" / "random" / "boot_id").write_text(boot_id + "\n")
    (root / "sys" / "kernel" / "hostname").write_text(hostname + "\n")
    return str(root)


def test_snapshot_of_another_host_fails_naming_both_hosts(run_module, tmp_path):
    root = tree(tmp_path, "roce_mlx5")
    a = run_module(rdma_counters, {"sysfs_root": root, "proc_root": fake_proc(tmp_path, "pa", BOOT_A, "node-a")})
    assert a["snapshot"]["host"] == {"boot_id": BOOT_A, "hostname": "node-a"}
    bump(root, "mlx5_0", 1, "port_xmit_data", 1 << 30)
    r = run_module(rdma_counters, {"sysfs_root": root, "proc_root": fake_proc(tmp_path, "pb", BOOT_B, "node-b"),
                                   "baseline": a["snapshot"], "expect": "rdma", "direction": "tx"})
    assert r["failed"] and r["msg"].startswith("expect rdma: ERROR")
    assert "taken on host node-a" in r["msg"] and "this is host node-b" in r["msg"]
    assert r["mismatch"][0]["kind"] == "host_changed" and r["verdict"]["status"] == "error"
    assert r["deltas"]["totals"] is None
    assert r["snapshot"]["host"]["boot_id"] == BOOT_B  # the fresh snapshot is there to retake the baseline


def test_port_that_disappeared_fails_even_for_expect_any(run_module, tmp_path):
    root = tree(tmp_path, "roce_mlx5")
    before = run_module(rdma_counters, {"sysfs_root": root})
    shutil.rmtree(os.path.join(root, "class", "infiniband", "mlx5_1"))
    r = run_module(rdma_counters, {"sysfs_root": root, "baseline": before["snapshot"]})
    assert r["failed"] and "mlx5_1/1 was in the baseline but is gone now" in r["msg"]
    assert [m["kind"] for m in r["mismatch"]] == ["port_disappeared"]


def test_other_devices_than_the_baseline_fail(run_module, tmp_path):
    root = tree(tmp_path, "roce_mlx5")
    before = run_module(rdma_counters, {"sysfs_root": root, "devices": ["mlx5_1"]})
    r = run_module(rdma_counters, {"sysfs_root": root, "baseline": before["snapshot"], "expect": "tcp"})
    assert r["failed"] and "the baseline covered devices mlx5_1, ports all, this run reads devices all" in r["msg"]


def test_prefill_metrics_expired_requests_warn_under_tcp(run_module, tmp_path):
    root = tree(tmp_path, "roce_mlx5")
    expired = prom("vllm_decode_before.txt").replace(
        'vllm:nixl_num_kv_expired_reqs_total{engine="0",model_name="glm-5.2-fp8"} 0.0',
        'vllm:nixl_num_kv_expired_reqs_total{engine="0",model_name="glm-5.2-fp8"} 4.0')
    assert expired != prom("vllm_decode_before.txt")
    before = run_module(rdma_counters, {"sysfs_root": root, "nixl_metrics": prom("vllm_decode_before.txt"),
                                        "prefill_metrics": prom("vllm_decode_before.txt")})
    r = run_module(rdma_counters, {"sysfs_root": root, "baseline": before["snapshot"], "expect": "tcp",
                                   "nixl_metrics": prom("vllm_decode_after.txt"), "prefill_metrics": expired})
    assert not r.get("failed"), r["msg"]
    assert r["kv_prefill"]["kv_expired_reqs"] == 4 and r["verdict"]["kv_expired_reqs"] == 4
    assert any("the prefill engine reports 4 KV requests that expired" in w for w in r["verdict"]["warnings"])


def test_bad_prefill_metrics_names_the_option(run_module, tmp_path):
    r = run_module(rdma_counters, {"sysfs_root": tree(tmp_path, "no_rdma"), "prefill_metrics": "<html>oops</html>"})
    assert r["failed"] and r["msg"].startswith("prefill_metrics: not Prometheus text")


def test_baseline_file_round_trip_compares(run_module, tmp_path):
    root = tree(tmp_path, "roce_mlx5")
    before = run_module(rdma_counters, {"sysfs_root": root})
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps(before["snapshot"]))
    bump(root, "mlx5_0", 1, "port_xmit_data", 1 << 20)
    r = run_module(rdma_counters, {"sysfs_root": root, "baseline_file": str(path), "expect": "rdma",
                                   "direction": "tx", "min_bytes": 4 << 20})
    assert not r.get("failed"), r["msg"]
    assert r["verdict"]["rdma_bytes"] == 4 << 20 and r["file"] == str(path)


def _write(path, data):
    with open(path, "wb") as f:
        f.write(data)
    return str(path)


@pytest.mark.parametrize("content,msg", [
    (SECRET.encode(), "is not JSON (Expecting value at line 1 column 1)"),
    (b'{"schema": 2, "ports": {"a/1": "' + SECRET.encode(), "is not JSON (Unterminated string"),
    (b"", "is not JSON (Expecting value at line 1 column 1)"),
    (b"\xff\xfe" + SECRET.encode(), "is not UTF-8 text"),
    (b"[" * 200000 + b"]" * 200000, "nests deeper than 64 levels"),
    (b'{"schema": NaN}', "holds NaN, not a finite JSON number, so it is refused"),
    (json.dumps([SECRET]).encode(), ": must be a mapping (the 'snapshot' of an earlier rdma_counters run), not a list"),
    (json.dumps(SECRET).encode(), ": must be a mapping (the 'snapshot' of an earlier rdma_counters run), not a string"),
    (json.dumps({"schema": 2, "taken_at": 1, "host": {"boot_id": None, "hostname": None},
                 "selection": {"devices": [], "ports": []},
                 "ports": {"mlx5_0/1": {"device": "mlx5_0", "port": 1, "identity": {"node_guid": None, "gid0": None},
                                        "hw_counters": {}, "counters": {"port_xmit_data": SECRET}}}}).encode(),
     ": ports.mlx5_0/1.counters.port_xmit_data must be a non-negative integer below 2**64 (got a string)"),
], ids=["text", "truncated", "empty", "not-utf8", "nesting-bomb", "nan", "list", "string", "counter-string"])
def test_malformed_baseline_file_names_file_and_field(run_module, tmp_path, content, msg):
    path = _write(tmp_path / "baseline.json", content)
    r = run_module(rdma_counters, {"sysfs_root": tree(tmp_path, "roce_mlx5"), "baseline_file": path})
    assert r["failed"] and r["msg"].startswith("baseline_file: %s" % path), r["msg"]
    assert msg in r["msg"], r["msg"]
    assert SECRET not in r["msg"] and r["file"] == path
    assert "verdict" not in r and "snapshot" not in r  # nothing was read before the baseline was refused


def test_baseline_file_that_is_missing_or_a_directory(run_module, tmp_path):
    root = tree(tmp_path, "roce_mlx5")
    missing = str(tmp_path / "nope.json")
    r = run_module(rdma_counters, {"sysfs_root": root, "baseline_file": missing})
    assert r["failed"] and r["msg"].startswith("baseline_file: %s cannot be opened (No such file or directory)"
                                               % missing)
    fifo = str(tmp_path / "fifo.json")
    os.mkfifo(fifo)
    r = run_module(rdma_counters, {"sysfs_root": root, "baseline_file": fifo})
    assert r["failed"] and r["msg"] == ("baseline_file: %s is not a regular file; point baseline_file at the JSON "
                                        "file the baseline run wrote" % fifo)


def test_baseline_and_baseline_file_are_exclusive(run_module, tmp_path):
    root = tree(tmp_path, "roce_mlx5")
    before = run_module(rdma_counters, {"sysfs_root": root})
    r = run_module(rdma_counters, {"sysfs_root": root, "baseline": before["snapshot"],
                                   "baseline_file": str(tmp_path / "b.json")})
    assert r["failed"] and "mutually exclusive" in r["msg"]


@pytest.mark.parametrize("mutate,field", [
    (lambda s: s["ports"]["mlx5_0/1"]["counters"].update(port_rcv_data=SECRET), "ports.mlx5_0/1.counters.port_rcv_data"),
    (lambda s: s.update(kv={"bytes": SECRET}), "kv.bytes"),
    (lambda s: s["ports"]["mlx5_0/1"].pop("counters"), "ports.mlx5_0/1.counters is missing"),
    (lambda s: s.update(host=[SECRET]), "host must be a mapping (got a list)"),
])
def test_malformed_baseline_option_is_a_clean_error(run_module, tmp_path, mutate, field):
    root = tree(tmp_path, "roce_mlx5")
    snap = run_module(rdma_counters, {"sysfs_root": root})["snapshot"]
    mutate(snap)
    r = run_module(rdma_counters, {"sysfs_root": root, "baseline": snap, "expect": "tcp",
                                   "nixl_metrics": prom("vllm_decode_after.txt")})
    assert r["failed"] and r["msg"].startswith("baseline: " + field), r["msg"]
    assert SECRET not in r["msg"]


def test_unreachable_metrics_url_does_not_echo_credentials(run_module, tmp_path, metrics_server):
    # a query string is never shown, whatever it holds
    url = "http://127.0.0.1:%d/nope?shard=%s" % (METRICS_PORT, SECRET)
    sysfs = tree(tmp_path, "no_rdma")
    r = run_module(rdma_counters, {"sysfs_root": sysfs, "nixl_metrics": url})
    assert r["failed"] and r["msg"].startswith("nixl_metrics: cannot read http://127.0.0.1:%d/nope?***:"
                                               % METRICS_PORT), r["msg"]
    assert SECRET not in r["msg"]
    # a credential in the query string is refused before anything is read, as userinfo is (one credential rule)
    r = run_module(rdma_counters, {"sysfs_root": sysfs,
                                   "nixl_metrics": "http://127.0.0.1:%d/metrics?token=%s" % (METRICS_PORT, SECRET)})
    assert r["failed"] and r["reason"] == "credentials_in_url" and SECRET not in r["msg"], r
    # credentials in the URL are refused before anything is read (test_url_credentials.py runs the real module)
    r = run_module(rdma_counters, {"sysfs_root": sysfs,
                                   "nixl_metrics": "http://scrape:%s@127.0.0.1:%d/metrics" % (SECRET, METRICS_PORT)})
    assert r["failed"] and r["reason"] == "credentials_in_url" and SECRET not in r["msg"], r


@pytest.mark.parametrize("taken_at", ["1" + "0" * 400, "1e400", "-1e400"])
def test_baseline_taken_at_out_of_range_fails_cleanly(run_module, tmp_path, taken_at):
    """Before: taken_at 10**400 raised OverflowError (math.isfinite) and the module died with a traceback."""
    root = tree(tmp_path, "roce_mlx5")
    snap = run_module(rdma_counters, {"sysfs_root": root})["snapshot"]
    text = json.dumps(snap).replace('"taken_at": %s' % json.dumps(snap["taken_at"]), '"taken_at": %s' % taken_at)
    path = _write(tmp_path / "baseline.json", text.encode())
    r = run_module(rdma_counters, {"sysfs_root": root, "baseline_file": path})
    assert r["failed"] and r["msg"].startswith("baseline_file: %s" % path) and r["file"] == path, r
    assert "holds a number" in r["msg"] and "take a new baseline" in r["msg"]
    r = run_module(rdma_counters, {"sysfs_root": root, "baseline": dict(snap, taken_at=10 ** 400)})
    assert r["failed"] and r["msg"].startswith("baseline holds a number beyond +/-2**64"), r


def test_baseline_file_linked_to_dev_zero_is_refused_before_reading(run_module, tmp_path):
    link = tmp_path / "baseline.json"
    link.symlink_to("/dev/zero")
    r = run_module(rdma_counters, {"sysfs_root": tree(tmp_path, "roce_mlx5"), "baseline_file": str(link)})
    assert r["failed"] and r["msg"].startswith("baseline_file: %s is not a regular file" % link)


# ---- a metrics URL that trickles or never ends: bounded, and named --------------------------------------- #

class _Hostile(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_GET(self):  # noqa: N802 - http.server API
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        if self.path == "/trickle":
            self.send_header("Content-Length", "100")
        self.end_headers()
        try:
            if self.path == "/trickle":
                for i in range(100):
                    self.wfile.write(b"#")
                    self.wfile.flush()
                    time.sleep(1.0)
            else:
                while True:
                    self.wfile.write(b"vllm:nixl_bytes_transferred_count 1\n" * 4096)
        except (BrokenPipeError, ConnectionResetError):
            pass


@pytest.fixture
def hostile_metrics():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hostile)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield "http://127.0.0.1:%d" % srv.server_address[1]
    srv.shutdown()
    srv.server_close()


def test_a_trickled_metrics_answer_fails_at_the_fetch_deadline(run_module, tmp_path, hostile_metrics, monkeypatch):
    """A byte a second never trips a per-read timeout: the old module waited for all 100 bytes (over 30 s with the
    baseline's second read). Now the whole answer has FETCH_TIMEOUT seconds (2 here)."""
    from ansible_collections.llmops.serving.plugins.module_utils.transport import _prom
    from ansible_collections.llmops.serving.tests.lib.no_hang import no_hang

    monkeypatch.setattr(_prom, "FETCH_TIMEOUT", 2.0)
    sysfs = tree(tmp_path, "no_rdma")
    t0 = time.monotonic()
    box = no_hang(lambda: run_module(rdma_counters, {"sysfs_root": sysfs, "nixl_metrics": hostile_metrics + "/trickle"}),
                  timeout=12)
    r = box["value"]
    assert time.monotonic() - t0 < 2.0 + 1.0
    assert r["failed"] and r["msg"].startswith("nixl_metrics: cannot read %s/trickle" % hostile_metrics), r["msg"]
    assert "did not end within 2s (timed out" in r["msg"]


def test_an_endless_metrics_answer_is_refused_at_the_cap(run_module, tmp_path, hostile_metrics):
    from ansible_collections.llmops.serving.plugins.module_utils.common import _http
    from ansible_collections.llmops.serving.tests.lib.no_hang import no_hang

    sysfs = tree(tmp_path, "no_rdma")
    box = no_hang(lambda: run_module(rdma_counters, {"sysfs_root": sysfs, "nixl_metrics": hostile_metrics + "/endless"}),
                  timeout=20)
    r = box["value"]
    assert r["failed"] and r["msg"].startswith("nixl_metrics: cannot read %s/endless" % hostile_metrics), r["msg"]
    assert "over the %d-byte limit for it (max_bytes)" % _http.MAX_METRICS_BYTES in r["msg"]


@pytest.mark.parametrize("line,what", [
    ("vllm:nixl_bytes_transferred_sum +Inf", "not a finite number"),
    ("vllm:nixl_bytes_transferred_count -3", "cannot be negative"),
    ("vllm:nixl_num_failed_transfers_total NaN", "not a finite number"),
])
def test_a_counter_that_cannot_be_fails_naming_the_option_and_sample(run_module, tmp_path, line, what):
    r = run_module(rdma_counters, {"sysfs_root": tree(tmp_path, "no_rdma"), "nixl_metrics": line + "\n"})
    assert r["failed"] and r["msg"].startswith("nixl_metrics: the decode engine's metrics hold a figure that cannot be")
    assert what in r["msg"] and line.split()[0] in r["msg"]


def test_a_huge_malformed_metrics_line_is_quoted_only_in_part(run_module, tmp_path):
    line = "vllm:x{a=" + "z" * (5 * 1024 * 1024) + "} 1\n"
    r = run_module(rdma_counters, {"sysfs_root": tree(tmp_path, "no_rdma"), "nixl_metrics": line})
    assert r["failed"] and r["msg"].startswith("nixl_metrics: not Prometheus text") and len(r["msg"]) < 800
