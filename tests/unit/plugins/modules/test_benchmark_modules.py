"""benchmark_plan / benchmark_round / benchmark_report / benchmark_job / benchmark_coldstart against a stand-in
OpenAI server (port chosen by the kernel) and a stand-in client interpreter that speaks vllm bench serve's
command line and writes its --save-detailed result."""
from __future__ import annotations

import hashlib
import http.server
import json
import os
import re
import stat
import subprocess
import sys
import threading
import time

import pytest

from ansible_collections.llmops.serving.plugins.module_utils.bench import (
    _bench_assemble, _bench_client, _bench_coldstart, _bench_inputs, _bench_outdir, _bench_plan, _bench_render,
    _bench_report,
)
from ansible_collections.llmops.serving.plugins.modules import (
    benchmark_coldstart, benchmark_job, benchmark_plan, benchmark_report, benchmark_round,
)

# The stand-in client: argv is "-c CODE <vllm bench serve flags>"; it sends each prompt to the server (so a dead
# server fails it) and writes the result file the real client writes with --save-result --save-detailed.
FAKE_CLIENT = r'''
import json, os, sys, time, urllib.request
args = sys.argv[3:] if sys.argv[1] == "-c" else sys.argv[1:]
opt = {}
i = 0
while i < len(args):
    if args[i].startswith("--") and i + 1 < len(args) and not args[i + 1].startswith("--"):
        opt[args[i]] = args[i + 1]; i += 2
    else:
        opt[args[i]] = True; i += 1
n, out_len, seed = int(opt["--num-prompts"]), int(opt["--random-output-len"]), int(opt["--seed"])
doc = {"ttfts": [], "itls": [], "latencies": [], "input_lens": [], "output_lens": [], "errors": []}
rate = float(opt["--request-rate"])
t0 = time.time()
for k in range(n):
    if rate != float("inf"):  # open loop, one request at a time: behind the schedule it sends at once
        time.sleep(max(0.0, t0 + k / rate - time.time()))
    try:
        urllib.request.urlopen(urllib.request.Request(opt["--base-url"] + "/v1/completions", data=b"{}",
                               headers={"Content-Type": "application/json"}), timeout=5).read()
    except Exception as e:
        sys.stderr.write("request failed: %s\n" % e)
        sys.exit(1)
    ttft = 0.010 * (1 + seed) + 0.001 * k
    doc["ttfts"].append(ttft); doc["itls"].append([0.002] * (out_len - 1))
    doc["latencies"].append(ttft + 0.002 * (out_len - 1))
    doc["input_lens"].append(int(opt["--random-input-len"])); doc["output_lens"].append(out_len)
    doc["errors"].append("")
doc.update(duration=time.time() - t0, completed=n, failed=0, output_throughput=n * out_len / 1.0,
           p95_ttft_ms=10.0, p95_tpot_ms=2.0, p95_e2el_ms=50.0, request_throughput=n / (time.time() - t0))
# the prompts' digest the real client's wrapper adds: the same for the same seed and lengths, unless the test
# gives this target other prompts (FAKE_PROMPT_SALT)
import hashlib
doc["llmops_prompt_digest"] = {"sha256": hashlib.sha256(("%s/%s/%s%s" % (seed, opt["--random-input-len"], n,
                               os.environ.get("FAKE_PROMPT_SALT", ""))).encode()).hexdigest(), "prompts": n,
                               "kind": "token_ids"}
if "--goodput" in opt:  # one SLO, ttft:<ms>
    slo = float(opt["--goodput"].split(":")[1]) / 1000.0
    doc["request_goodput"] = sum(1 for t in doc["ttfts"] if t <= slo) / doc["duration"]
with open(os.path.join(opt["--result-dir"], opt["--result-filename"]), "w") as f:
    json.dump(doc, f)
'''


class _Server(http.server.BaseHTTPRequestHandler):
    models = ["tiny-llama"]
    nixl_bytes = [0.0]
    completions = [0]
    metrics_texts = []
    delay = 0.0
    nixl_per_post = []
    nixl_totals = [0.0, 0, 0.0]

    def log_message(self, *a):
        pass

    def _send(self, status, body, ctype="application/json"):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path.rstrip("/") == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": m} for m in self.models]})
        elif self.path == "/metrics" and self.nixl_per_post:
            b, n, t = self.nixl_totals
            text = ("vllm:nixl_bytes_transferred_sum %s\nvllm:nixl_bytes_transferred_count %s\n"
                    "vllm:nixl_xfer_time_seconds_sum %s\nvllm:nixl_xfer_time_seconds_count %s\n" % (b, n, t, n))
            self._send(200, text.encode(), "text/plain")
        elif self.path == "/metrics" and self.metrics_texts:
            # recorded engine texts, one per read (the last one stays)
            text = self.metrics_texts.pop(0) if len(self.metrics_texts) > 1 else self.metrics_texts[0]
            self._send(200, text.encode(), "text/plain")
        elif self.path == "/metrics":
            self.nixl_bytes[0] += 65536.0
            text = ("vllm:nixl_bytes_transferred_sum %s\nvllm:nixl_bytes_transferred_count 4\n"
                    "vllm:nixl_xfer_time_seconds_sum 0.004\nvllm:nixl_xfer_time_seconds_count 4\n"
                    "vllm:nixl_num_failed_transfers_total 0\n" % self.nixl_bytes[0])
            self._send(200, text.encode(), "text/plain")
        else:
            self._send(404, {"error": "no"})

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.delay:
            time.sleep(self.delay)
        if self.nixl_per_post:
            # one KV transfer per completion: (bytes, seconds), the last pair repeating
            b, t = self.nixl_per_post.pop(0) if len(self.nixl_per_post) > 1 else self.nixl_per_post[0]
            tot = self.nixl_totals
            tot[0], tot[1], tot[2] = tot[0] + b, tot[1] + 1, tot[2] + t
        self.completions[0] += 1
        self._send(200, {"choices": [{"text": "x"}]})


@pytest.fixture
def server():
    handler = type("H", (_Server,), {"models": ["tiny-llama"], "nixl_bytes": [0.0], "completions": [0],
                                     "metrics_texts": [], "nixl_per_post": [], "nixl_totals": [0.0, 0, 0.0]})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield {"url": "http://127.0.0.1:%d" % srv.server_address[1], "srv": srv, "handler": handler}
    srv.shutdown()
    srv.server_close()


@pytest.fixture
def fake_python(tmp_path):
    path = tmp_path / "fake-python"
    path.write_text("#!%s\n%s" % (sys.executable, FAKE_CLIENT))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.fixture
def tokenizer(tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    (d / "tokenizer.json").write_text("{}")
    return str(d)


def _plan_args(server, tokenizer, out_dir, **over):
    args = {"targets": [{"name": "colocated", "url": server["url"], "model": "tiny-llama"}],
            "concurrency": [1, 2], "seeds": [1, 2], "lengths": [[16, 4]], "requests_per_round": 3,
            "warmup_rounds": 1, "tokenizer": tokenizer, "out_dir": str(out_dir)}
    args.update(over)
    return args


def test_plan_warms_up_first_and_interleaves_a_and_b():
    proto = _bench_inputs.check_inputs({
        "targets": [{"name": "a", "url": "http://h:1", "model": "m"}, {"name": "b", "url": "http://h:2", "model": "m"}],
        "concurrency": [1, 4], "seeds": [1, 2], "lengths": [[128, 64]], "requests_per_round": 8,
        "requests_per_concurrency": 4, "warmup_rounds": 1, "repetitions": 1})
    plan = _bench_plan.make_plan(proto)
    c1 = [(r["kind"], r["target"], r["seed"]) for r in plan if r["concurrency"] == 1]
    assert c1[:2] == [("warmup", "a", _bench_plan.WARMUP_SEED_BASE), ("warmup", "b", _bench_plan.WARMUP_SEED_BASE)]
    assert c1[2:] == [("measure", "a", 1), ("measure", "b", 1), ("measure", "a", 2), ("measure", "b", 2)]
    assert [r["num_prompts"] for r in plan if r["kind"] == "measure" and r["concurrency"] == 4] == [16] * 4
    assert [r["index"] for r in plan] == list(range(1, len(plan) + 1))
    proto["interleave"] = False
    seq = [r["target"] for r in _bench_plan.make_plan(proto) if r["kind"] == "measure" and r["concurrency"] == 1]
    assert seq == ["a", "a", "b", "b"]


@pytest.mark.parametrize("case,expect", [
    ("unreachable", "benchmark_targets[0].url: http://127.0.0.1:9 does not answer"),
    ("wrong_model", "benchmark_targets[0].model: 'tiny-lama' is not served by"),
    ("tokenizer", "does not exist; point benchmark_tokenizer at the model revision directory"),
    ("budget", "benchmark_time_budget: the ladder cannot finish"),
    ("lengths", "benchmark_lengths[0][1]: 1 is below 2"),
    ("targets", "benchmark_targets: must list one or two targets (got 3)"),
])
def test_plan_refuses_bad_input_before_any_load(run_module, server, tokenizer, tmp_path, case, expect):
    out = tmp_path / "out"
    over = {}
    if case == "unreachable":
        over["targets"] = [{"name": "gone", "url": "http://127.0.0.1:9", "model": "tiny-llama"}]
    elif case == "wrong_model":
        over["targets"] = [{"name": "a", "url": server["url"], "model": "tiny-lama"}]
    elif case == "tokenizer":
        over["tokenizer"] = str(tmp_path / "missing")
    elif case == "budget":
        over.update(time_budget=1e-4, requests_per_round=50)
    elif case == "lengths":
        over["lengths"] = [[16, 1]]
    else:
        over["targets"] = [{"name": n, "url": server["url"], "model": "tiny-llama"} for n in "abc"]
    args = _plan_args(server, tokenizer, out)
    args.update(over)
    res = run_module(benchmark_plan, args)
    assert res.get("failed"), res
    assert expect in res["msg"], res["msg"]
    assert not (out / "plan.json").exists()
    # only the probe of the budget case reached the server; nothing of a round
    assert server["handler"].completions[0] <= (1 if case == "budget" else 0)


def test_samples_keep_failed_requests_and_use_the_clients_tpot():
    doc = {"ttfts": [0.1, 0.0], "itls": [[0.01, 0.03], []], "latencies": [0.14, 0.0], "input_lens": [16, 16],
           "output_lens": [3, 0], "errors": ["", "Bad Request"]}
    ok, bad = _bench_client.samples_from_result(doc, seed=7)
    assert ok["ok"] and ok["seed"] == 7 and ok["ttft_ms"] == 100.0 and ok["e2el_ms"] == 140.0
    assert ok["tpot_ms"] == pytest.approx(20.0) and ok["itl_ms"] == [10.0, 30.0]
    assert not bad["ok"] and bad["error"] == "Bad Request" and bad["e2el_ms"] is None


def _run_all(run_module, out, fake_python, n, **round_args):
    results = []
    for k in range(1, n + 1):
        res = run_module(benchmark_round, dict({"out_dir": str(out), "index": k, "python": fake_python}, **round_args))
        assert not res.get("failed"), res
        results.append(res)
        if res["stopped"]:
            break
    return results


def test_rounds_and_report_follow_the_contract(run_module, server, tokenizer, fake_python, tmp_path):
    out = tmp_path / "out"
    plan = run_module(benchmark_plan, _plan_args(server, tokenizer, out))
    assert plan["rounds"] == 6 and plan["measured_rounds"] == 4, plan
    results = _run_all(run_module, out, fake_python, plan["rounds"])
    assert "round 6 of 6" in results[-1]["msg"] and "ETA" in results[0]["msg"]
    rep = run_module(benchmark_report, {"out_dir": str(out), "n_boot": 200})
    assert not rep.get("failed"), rep
    with open(out / "report.json") as f:
        report = json.load(f)
    _bench_report.validate(report)
    cells = sorted(report["cells"], key=lambda c: c["concurrency"])
    assert [(c["concurrency"], c["requests"], c["failed"]) for c in cells] == [(1, 6, 0), (2, 6, 0)]
    c = cells[0]
    # seed 2's stand-in TTFTs are 30-32 ms, seed 1's 20-22 ms: pooled p95 and mean of per-round p95 differ
    assert c["p95_ttft_ms_pooled"] == pytest.approx(31.75, abs=0.01)  # rank 4.75 of 20,21,22,30,31,32
    assert c["p95_ttft_ms_mean_of_seeds"] == pytest.approx((21.9 + 31.9) / 2, abs=0.01)
    assert c["unstable"] is True  # 21.9 vs 31.9 ms is more than 20 % of their mean
    assert {s["seed"] for s in c["samples"]} == {1, 2}
    assert "What this does not prove" in (out / "report.md").read_text()
    assert (out / "latency_p95.png").exists()


def test_a_target_that_dies_stops_the_run_and_the_report_says_where(run_module, server, tokenizer, fake_python, tmp_path):
    out = tmp_path / "out"
    plan = run_module(benchmark_plan, _plan_args(server, tokenizer, out))
    first = _run_all(run_module, out, fake_python, 2)
    assert all(r["stopped"] is None for r in first)
    server["srv"].shutdown()
    server["srv"].server_close()
    res = run_module(benchmark_round, {"out_dir": str(out), "index": 3, "python": fake_python})
    assert res["stopped"]["reason"] == "target_down" and res["stopped"]["index"] == 3, res
    assert "stopped answering" in res["msg"]
    rep = run_module(benchmark_report, {"out_dir": str(out), "n_boot": 100})
    assert rep["stopped"]["after_round"] == 2 and rep["stopped"]["of_rounds"] == plan["rounds"]
    with open(out / "report.json") as f:
        report = json.load(f)
    assert [c["requests"] for c in report["cells"]] == [3]  # round 2 (C=1, seed 1) was kept
    assert any(cv["code"] == "stopped_early" for cv in report["caveats"])


def test_pd_round_carries_nixl_and_rdma_evidence(run_module, server, tokenizer, fake_python, tmp_path):
    out = tmp_path / "out"
    sysfs = tmp_path / "sys"
    sysfs.mkdir()  # a host without RDMA devices: every KV byte went over another transport
    target = {"name": "pd", "url": server["url"], "model": "tiny-llama",
              "decode_metrics_url": server["url"] + "/metrics", "transport": "tcp"}
    run_module(benchmark_plan, _plan_args(server, tokenizer, out, targets=[target], concurrency=[1], seeds=[1],
                                          warmup_rounds=0, transport_warmup_requests=0))
    res = run_module(benchmark_round, {"out_dir": str(out), "index": 1, "python": fake_python,
                                       "sysfs_root": str(sysfs)})
    ev = res["record"]["evidence"]
    assert ev["kv_bytes"] == 65536.0 and ev["rdma_bytes"] == 0 and ev["tcp_bytes"] == 65536.0
    assert ev["verdict"]["status"] == "pass" and ev["rdma_present"] is False
    with open(out / "plan.json") as f:
        doc = json.load(f)
    doc["targets"][0]["transport"] = "rdma"
    with open(out / "plan.json", "w") as f:
        json.dump(doc, f)
    res = run_module(benchmark_round, {"out_dir": str(out), "index": 1, "python": fake_python,
                                       "sysfs_root": str(sysfs)})
    assert res["record"]["evidence"]["verdict"]["status"] == "fail"


def test_rounds_render_as_jobs_and_a_job_log_is_a_round(run_module, server, tokenizer, tmp_path):
    out = tmp_path / "out"
    run_module(benchmark_plan, _plan_args(server, tokenizer, out, check_targets=False))
    # the plan's tokenizer is the node's directory (under tokenizer_host_path); the client reads it in the pod
    res = run_module(benchmark_job, {"out_dir": str(out), "namespace": "llm", "image": "vllm/vllm-openai:v0.10.1",
                                     "tokenizer_host_path": str(tmp_path), "render_dir": str(tmp_path / "jobs")})
    assert not res.get("failed"), res
    assert res["names"][0] == "bench-001-colocated" and len(res["objects"]) == 6
    job = res["objects"][1]  # warm-up C=1, then C=1 seed 1
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--tokenizer") + 1] == "/models/model"
    assert args[args.index("--max-concurrency") + 1] == "1" and args[args.index("--seed") + 1] == "1"
    assert "--save-result" not in args  # the Job's own code adds them with its result directory
    assert (tmp_path / "jobs" / "kustomization.yaml").exists()
    log = "bench output\n" + _bench_client.RESULT_MARKER + json.dumps({
        "ttfts": [0.02], "itls": [[0.001] * 3], "latencies": [0.03], "input_lens": [16], "output_lens": [4],
        "errors": [""], "duration": 0.05})
    rec = run_module(benchmark_round, {"out_dir": str(out), "index": 3, "python": "unused", "client_output": log})
    assert rec["record"]["failed"] == 0 and rec["record"]["duration_s"] == 0.05


LOG = """==== 2026-12-01T10:00:00Z starting: vllm serve
(Worker pid=1) INFO [default_loader.py:501] Loading weights took 9.99 seconds
==== 2026-12-01T10:05:00Z starting: vllm serve
(Worker pid=2) INFO [default_loader.py:501] Loading weights took 4.50 seconds
(EngineCore pid=3) INFO [core.py:402] init engine (profile, create kv cache, warmup model) took 30.00 s (compilation: 12.00 s)
"""


def test_coldstart_phases_add_up_to_the_first_correct_answer(run_module, tmp_path):
    model = tmp_path / "rev"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"\0" * 4096)
    prep = run_module(benchmark_coldstart, {"action": "prepare", "state": "nvme", "model_path": str(model),
                                            "work_dir": str(tmp_path / "work")})
    assert prep["evicted_bytes"] == 4096 and prep["env"]["VLLM_CACHE_ROOT"].startswith(prep["cache_dir"])
    assert os.path.isdir(prep["env"]["TORCHINDUCTOR_CACHE_DIR"]) and not os.listdir(prep["env"]["VLLM_CACHE_ROOT"])
    warm = run_module(benchmark_coldstart, {"action": "prepare", "state": "nvme_kernel_cache",
                                            "model_path": str(model), "work_dir": str(tmp_path / "work")})
    assert warm["env"] == {} and warm["cache_dir"] is None
    log = tmp_path / "engine.log"
    log.write_text(LOG)
    timeline = {"port_open": 60.0, "health": 61.0, "models": 61.5, "first_correct": 62.0}
    res = run_module(benchmark_coldstart, {"action": "record", "state": "nvme", "rep": 1, "timeline": timeline,
                                           "log_file": str(log), "coldstart_file": str(tmp_path / "cs.json")})
    ph = res["entry"]["phases"]
    assert ph["weights_load"] == 4.5 and ph["compile"] == 12.0 and ph["engine_init"] == 18.0  # the last start only
    assert ph["process_other"] == 25.5 and ph["first_correct"] == 0.5
    assert sum(ph.values()) == pytest.approx(62.0)
    with open(tmp_path / "cs.json") as f:
        doc = json.load(f)
    assert doc["states"][0]["state"] == "nvme" and doc["states"][0]["reps"][0]["total_s"] == 62.0
    report = _bench_assemble.build_report(str(tmp_path / "none"),
                                          {"targets": [{"name": "engine", "url": "", "model": ""}]},
                                          coldstart_file=str(tmp_path / "cs.json"))
    assert report["coldstart"]["states"][0]["reps"][0]["phases"]["compile"] == 12.0
    bad = run_module(benchmark_coldstart, {"action": "record", "state": "nvme", "timeline": {"health": 3},
                                           "log_file": str(log), "coldstart_file": str(tmp_path / "cs.json")})
    assert bad["failed"] and "timeline: no first correct answer" in bad["msg"]
    assert _bench_coldstart.parse_log("nothing")["weights_load_s"] is None


def _fixture_text(name):
    with open(os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "prom", name)) as f:
        return f.read()


def test_a_round_records_where_the_time_went_and_the_report_shows_it(run_module, server, tokenizer, fake_python,
                                                                     tmp_path):
    # the engine's /metrics before the round (idle) and after it (one request): recorded vLLM CPU texts
    server["handler"].metrics_texts[:] = [_fixture_text("vllm_cpu_colocated_idle.txt"),
                                          _fixture_text("vllm_cpu_colocated_one.txt")]
    out = tmp_path / "out"
    run_module(benchmark_plan, _plan_args(server, tokenizer, out, concurrency=[1], seeds=[1], warmup_rounds=0,
                                          requests_per_round=1))
    res = run_module(benchmark_round, {"out_dir": str(out), "index": 1, "python": fake_python})
    eng = res["record"]["phases"]["engines"]["engine"]
    assert eng["prefill"]["count"] == 1 and eng["prefill"]["sum"] == pytest.approx(0.256899, abs=1e-6)
    report = _bench_assemble.build_report(str(out), n_boot=50)
    _bench_report.validate(report)
    cell = report["cells"][0]
    assert cell["phases_ms"]["decode"]["mean_ms"] == pytest.approx(2252.4615, abs=1e-2)
    # the stand-in client's one request took 26 ms: the engine's 2.5 s cannot be this client's, and it says so
    assert cell["phases"]["explained_fraction"] == pytest.approx(2509.41 / 26.0, abs=0.01)
    assert any("not the client's" in w for w in cell["phases"]["warnings"])
    md = _bench_render.markdown(report)
    assert "## Where the time goes" in md
    assert "| colocated | 1 | 16/4 | 0.0 (p95 ≤ 300.0) | 256.9 (p95 ≤ 300.0) | – | 2252.5 (p95 2475.0) |" in md
    # the stacked bar per cell is drawn from the same phases
    assert "phases.png" in [name for name, _fig in _figure_names(report)]


def _figure_names(report):
    plt = _bench_render.pyplot()
    if plt is None:
        pytest.skip("matplotlib is not installed")
    figs = _bench_render._figures(report, plt)  # pylint: disable=protected-access
    for _name, fig in figs:
        plt.close(fig)
    return figs


def test_the_fixed_rate_ladder_runs_beside_the_concurrency_ladder_interleaved():
    proto = {"targets": [{"name": "a"}, {"name": "b"}], "lengths": [[16, 4]], "concurrency": [1], "seeds": [1],
             "warmup_rounds": 1, "repetitions": 1, "interleave": True, "requests_per_round": 8,
             "requests_per_concurrency": 0, "request_rates": [0.5, 4.0], "rate_max_concurrency": 64}
    plan = _bench_plan.make_plan(proto)
    got = [(r["kind"], r["target"], r["concurrency"], r["request_rate"], r["num_prompts"]) for r in plan]
    assert got == [
        ("warmup", "a", 1, None, 1), ("warmup", "b", 1, None, 1), ("measure", "a", 1, None, 8),
        ("measure", "b", 1, None, 8),
        # a fixed-rate warm-up is two seconds of arrivals (at least 2 requests, at most a measured round's)
        ("warmup", "a", 64, 0.5, 2), ("warmup", "b", 64, 0.5, 2), ("measure", "a", 64, 0.5, 8),
        ("measure", "b", 64, 0.5, 8),
        ("warmup", "a", 64, 4.0, 8), ("warmup", "b", 64, 4.0, 8), ("measure", "a", 64, 4.0, 8),
        ("measure", "b", 64, 4.0, 8)]
    target = {"name": "a", "url": "http://e:8000", "model": "m", "headers": {}}
    argv = _bench_client.client_argv("py", target, plan[6], "/tok", "/out", "r.json", burstiness=0.5,
                                     goodput=["ttft:500"])
    flags = dict(zip(argv, argv[1:]))
    assert flags["--request-rate"] == "0.5" and flags["--burstiness"] == "0.5"
    assert flags["--max-concurrency"] == "64" and flags["--goodput"] == "ttft:500"
    closed = _bench_client.client_argv("py", target, plan[2], "/tok", "/out", "r.json")
    assert dict(zip(closed, closed[1:]))["--request-rate"] == "inf" and "--burstiness" not in closed
    # the lower bound of a fixed-rate round is its arrivals' span: 8 requests at 0.5/s take 14 s at least
    assert _bench_plan.round_lower_bound(plan[6], 0.1) == pytest.approx(14.1)


@pytest.mark.parametrize("args,words", [
    ({"request_rates": [0]}, "benchmark_request_rates[0]: 0 must be a finite number above 0"),
    ({"request_rates": [2, 2]}, "benchmark_request_rates: [2.0, 2.0] lists a rate twice"),
    ({"goodput": ["latency:5"]}, "benchmark_goodput[0]: 'latency:5' is not metric:milliseconds"),
    ({"burstiness": -1}, "benchmark_burstiness: -1 must be a finite number above 0"),
    ({"concurrency": []}, "benchmark_concurrency: must be a non-empty list"),
])
def test_bad_ramp_inputs_are_refused_naming_the_variable(args, words):
    p = {"targets": [{"name": "a", "url": "http://e:8000", "model": "m"}], "concurrency": [1], "seeds": [1],
         "lengths": [[16, 4]], "requests_per_round": 4, "warmup_rounds": 0}
    p.update(args)
    with pytest.raises(_bench_inputs.BenchError) as e:
        _bench_inputs.check_inputs(p)
    assert words in str(e.value)


def test_an_open_loop_cell_past_what_the_target_serves_is_saturated(run_module, server, tokenizer, fake_python,
                                                                    tmp_path):
    # the stand-in server takes 20 ms a request and the stand-in client sends one at a time: it keeps up with 20/s
    # offered, not with 1000/s
    server["handler"].delay = 0.02
    out = tmp_path / "out"
    run_module(benchmark_plan, _plan_args(server, tokenizer, out, concurrency=[], request_rates=[20, 1000], seeds=[1],
                                          warmup_rounds=0, requests_per_round=12, goodput=["ttft:25"]))
    for i in (1, 2):
        res = run_module(benchmark_round, {"out_dir": str(out), "index": i, "python": fake_python})
        assert res["stopped"] is None, res
        # the progress line names the offered rate, not the in-flight cap the fixed-rate round runs under
        assert "colocated R=%d/s (achieved " % (20, 1000)[i - 1] in res["msg"] and "C=256" not in res["msg"], res
    report = _bench_assemble.build_report(str(out), n_boot=50)
    cells = sorted(report["cells"], key=lambda c: c["request_rate"])
    assert [c["request_rate"] for c in cells] == [20, 1000]
    slow, fast = cells
    assert slow["saturated"] is False and fast["saturated"] is True
    assert fast["achieved_rate"] < 55 < fast["expected_rate"]
    assert slow["achieved_rate"] == pytest.approx(20, rel=0.5)
    # the client's goodput: the 6 requests with TTFT <= 25 ms over the round's duration
    rnd = _bench_outdir.done_rounds(str(out))[1]
    assert slow["goodput_rate"] == pytest.approx(6 / rnd["duration_s"], rel=1e-6)
    md = _bench_render.markdown(report)
    assert "## Fixed-rate ramp" in md and "| colocated | 16/4 | 1000 |" in md and "| **yes** |" in md
    # every table names a fixed-rate cell by its rate, never by the in-flight cap its rounds pass to the client
    assert "| colocated | R=20/s | 16/4 | 1 |" in md and "| colocated | R=1000/s | 16/4 | 1 |" in md
    assert "| colocated | 256 |" not in md
    assert "rate_ramp.png" in [name for name, _fig in _figure_names(report)]


STUB_VLLM = {
    "vllm/__init__.py": "",
    "vllm/utils/__init__.py": "",
    "vllm/utils/argparse_utils.py": "from argparse import ArgumentParser as FlexibleArgumentParser\n",
    "vllm/benchmarks/__init__.py": "",
    # the shape of vllm/benchmarks/serve.py (v0.11+): main() awaits the module's benchmark(tokenizer=...,
    # input_requests=[SampleRequest]) and saves {**result_json, **benchmark_result}
    "vllm/benchmarks/serve.py": (
        "import asyncio, json, os\n"
        "class Req:\n"
        "    def __init__(self, prompt):\n"
        "        self.prompt = prompt\n"
        "class Tok:\n"
        "    def encode(self, text, add_special_tokens=True):\n"
        "        if os.environ.get('STUB_TOKENIZER_FAILS'):\n"
        "            raise RuntimeError('no tokenizer')\n"
        "        return [ord(c) for c in text]\n"
        "def add_cli_args(p):\n"
        "    p.add_argument('--out')\n"
        "    p.add_argument('--prompts')\n"
        "async def benchmark(**kw):\n"
        "    return {'completed': len(kw['input_requests'])}\n"
        "def main(args):\n"
        "    reqs = [Req(p) for p in args.prompts.split(',')]\n"
        "    res = asyncio.run(benchmark(tokenizer=Tok(), input_requests=reqs))\n"
        "    with open(args.out, 'w') as f:\n"
        "        json.dump(res, f)\n"),
}


def _stub_client(tmp_path, prompts, **env):
    root = tmp_path / "stub"
    for rel, text in STUB_VLLM.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    out = tmp_path / ("result-%s-%d.json" % (prompts, len(env)))
    subprocess.run([sys.executable, "-c", _bench_client.CLIENT_SOURCE, "--out", str(out), "--prompts", prompts],
                   check=True, env=dict(os.environ, PYTHONPATH=str(root), **env), timeout=60)
    with open(out) as f:
        return json.load(f)


def test_the_client_records_a_digest_of_the_prompt_token_ids_it_sends(tmp_path):
    doc = _stub_client(tmp_path, "ab,cd")
    assert doc["completed"] == 2  # the client's own result is untouched
    d = doc["llmops_prompt_digest"]
    assert d == {"sha256": hashlib.sha256(b"[97, 98]\n[99, 100]\n").hexdigest(), "prompts": 2, "kind": "token_ids"}
    assert _stub_client(tmp_path, "ab,ce")["llmops_prompt_digest"]["sha256"] != d["sha256"]
    text = _stub_client(tmp_path, "ab,cd", STUB_TOKENIZER_FAILS="1")["llmops_prompt_digest"]
    assert text["kind"] == "text" and text["sha256"] != d["sha256"]


def test_ab_cells_with_different_prompts_are_not_compared(run_module, server, tokenizer, fake_python, tmp_path):
    out = tmp_path / "out"
    targets = [{"name": "direct", "url": server["url"], "model": "tiny-llama"},
               {"name": "gateway", "url": server["url"] + "/", "model": "tiny-llama"}]
    run_module(benchmark_plan, _plan_args(server, tokenizer, out, targets=targets, concurrency=[1], seeds=[1],
                                          warmup_rounds=0, requests_per_round=2))
    run_module(benchmark_round, {"out_dir": str(out), "index": 1, "python": fake_python})
    run_module(benchmark_round, {"out_dir": str(out), "index": 2, "python": fake_python})
    report = _bench_assemble.build_report(str(out), n_boot=50)
    assert {cp["verdict"] for cp in report["comparisons"]} <= {"differs", "cannot tell"}
    assert all(cp["same_prompts"] is True for cp in report["comparisons"])
    # the gateway's round got other prompts: no comparison, and the report says why
    run_module(benchmark_round, {"out_dir": str(out), "index": 2, "python": fake_python,
                                 "env": {"FAKE_PROMPT_SALT": "other"}})
    report = _bench_assemble.build_report(str(out), n_boot=50)
    _bench_report.validate(report)
    assert {cp["verdict"] for cp in report["comparisons"]} == {"not comparable"}
    assert all(cp["delta_ms"] is None and "seed 1" in cp["reason"] for cp in report["comparisons"])
    assert any(c["code"] == "prompts_differ" for c in _bench_report.caveats(report))


def test_a_pd_target_opens_its_transport_first_and_the_report_gives_first_and_warmed_transfers_apart(
        run_module, server, tokenizer, fake_python, tmp_path):
    # a fresh P/D pair: the first transfer carries the connection set-up (1 MiB in 0.5 s), then 1 MiB in 2 ms
    server["handler"].nixl_per_post[:] = [(1048576.0, 0.5), (1048576.0, 0.002)]
    sysfs = tmp_path / "sys"
    sysfs.mkdir()
    out = tmp_path / "out"
    target = {"name": "pd", "url": server["url"], "model": "tiny-llama",
              "decode_metrics_url": server["url"] + "/metrics", "transport": "tcp"}
    plan = run_module(benchmark_plan, _plan_args(server, tokenizer, out, targets=[target], concurrency=[1],
                                                 seeds=[1], warmup_rounds=0, requests_per_round=2,
                                                 transport_warmup_requests=4))
    with open(out / "plan.json") as f:
        first = json.load(f)["rounds"][0]
    assert first["transport_warmup"] is True and first["kind"] == "warmup" and first["num_prompts"] == 4
    res = run_module(benchmark_round, {"out_dir": str(out), "index": 1, "python": fake_python,
                                       "sysfs_root": str(sysfs)})
    # the plan's probe was the pair's first request: the set-up is in its transfer, the warm-up's are warm
    with open(out / "plan.json") as f:
        assert json.load(f)["probes"][0]["kv_transfer"]["per_transfer_ms"] == 500.0
    reqs = res["record"]["transport_requests"]
    assert [r["per_transfer_ms"] for r in reqs] == [2.0, 2.0, 2.0, 2.0]
    assert "first 2.0 ms, then median 2.0 ms" in res["msg"]
    for i in range(2, plan["rounds"] + 1):
        run_module(benchmark_round, {"out_dir": str(out), "index": i, "python": fake_python,
                                     "sysfs_root": str(sysfs)})
    report = _bench_assemble.build_report(str(out), n_boot=50)
    tw = report["meta"]["transport_warmup"]["pd"]
    assert tw["first"]["request"] == "probe 16/4"
    assert tw["first"]["per_transfer_ms"] == 500.0 and tw["first"]["rate_bytes_per_s"] == 2097152.0
    assert tw["after_warmup"] == {"requests": 4, "per_transfer_ms_median": 2.0,
                                  "rate_bytes_per_s_median": pytest.approx(524288000.0)}
    # the measured round's 2 requests: 2 transfers of 2 ms (the handshake is not in them)
    assert tw["measured"]["per_transfer_ms"] == 2.0 and tw["measured"]["transfers"] == 2
    md = _bench_render.markdown(report)
    assert "| pd | 500.00 | 2.0 MiB/s | 2.00 | 500.0 MiB/s | 2.00 | 500.0 MiB/s |" in md


def test_the_pd_ramp_example_measures_each_cell_five_times_interleaved_on_one_pair_two_ways():
    import yaml
    root = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..")
    with open(os.path.join(root, "roles", "benchmark", "files", "pd_ramp.yml")) as f:
        ex = yaml.safe_load(f)
    proto = _bench_inputs.check_inputs(dict((k[len("benchmark_"):], v) for k, v in ex.items()))
    plan = _bench_plan.make_plan(proto)
    a, b = proto["targets"]
    # one P/D pair, two ways in: the same engines' metrics, another URL
    assert a["url"] != b["url"] and b["headers"].get("routing-strategy") == "pd"
    assert (a["prefill_metrics_url"], a["decode_metrics_url"]) == (b["prefill_metrics_url"], b["decode_metrics_url"])
    # the transport of each target is opened before anything else
    assert [(r["target"], r.get("transport_warmup")) for r in plan[:2]] == [("pd-direct", True), ("pd-gateway", True)]
    measured = [r for r in plan if r["kind"] == "measure"]
    cells = {}
    for r in measured:
        cells.setdefault((r["target"], r["request_rate"], r["input_len"]), []).append(r)
    assert {len(v) for v in cells.values()} == {5} and all(k[1] for k in cells)
    assert {len({r["seed"] for r in v}) for v in cells.values()} == {5}
    # per rate, the targets alternate A, B, A, B
    first_rate = [r["target"] for r in measured if r["request_rate"] == 1 and r["input_len"] == 128]
    assert first_rate == ["pd-direct", "pd-gateway"] * 5
    assert proto["goodput"] == ["ttft:500", "tpot:50"]


def test_a_ramp_cell_with_fewer_than_five_rounds_carries_a_caveat(run_module, server, tokenizer, fake_python,
                                                                  tmp_path):
    out = tmp_path / "out"
    run_module(benchmark_plan, _plan_args(server, tokenizer, out, concurrency=[], request_rates=[50], seeds=[1],
                                          warmup_rounds=0, requests_per_round=2))
    run_module(benchmark_round, {"out_dir": str(out), "index": 1, "python": fake_python})
    report = _bench_assemble.build_report(str(out), n_boot=50)
    cav = dict((c["code"], c["text"]) for c in _bench_report.caveats(report))
    assert "colocated R=50/s 16/4" in cav["few_rounds"] and "fewer than 5 measured rounds" in cav["few_rounds"]


def test_a_transport_warmup_round_run_as_a_job_is_a_usable_client_round(tmp_path):
    plan_doc = {"rounds": [{"index": 1, "kind": "warmup", "transport_warmup": True, "target": "pd", "concurrency": 1,
                            "request_rate": None, "input_len": 16, "output_len": 4, "seed": 1, "rep": 0,
                            "num_prompts": 2}]}
    rec = dict(plan_doc["rounds"][0], samples=[], failed=0, duration_s=1.0, wall_s=1.0, client=None)
    assert _bench_outdir.round_problem(rec, 1, plan_doc) is None
    assert "round.transport_requests[0].kv_bytes" in _bench_outdir.round_problem(
        dict(rec, transport_requests=[{"ok": True, "kv_bytes": -1}]), 1, plan_doc)


# ---- measurements that cannot be: the engine's phases are unknown, the round and the report go on --------- #

@pytest.mark.parametrize("pattern,replacement,what", [
    (r'^(vllm:e2e_request_latency_seconds_sum\{[^}]*\}) \S+$', r"\1 +Inf", "not a finite number"),
    (r'^(vllm:e2e_request_latency_seconds_count\{[^}]*\}) \S+$', r"\1 -3", "cannot be negative"),
    (r'^(vllm:request_queue_time_seconds_bucket\{engine="0",)le="0.3"', r'\1le="NaN"', "bucket bound le"),
])
def test_a_metrics_figure_that_cannot_be_leaves_the_engines_phases_unknown(
        run_module, server, tokenizer, fake_python, tmp_path, pattern, replacement, what):
    """+Inf was written into the round file as Infinity (and a negative count as itself): the round was then
    refused on reading, its client samples with it. Now only that engine's phases are unknown."""
    after = re.sub(pattern, replacement, _fixture_text("vllm_cpu_colocated_one.txt"), count=1, flags=re.M)
    assert after != _fixture_text("vllm_cpu_colocated_one.txt")
    server["handler"].metrics_texts[:] = [_fixture_text("vllm_cpu_colocated_idle.txt"), after]
    out = tmp_path / "out"
    run_module(benchmark_plan, _plan_args(server, tokenizer, out, concurrency=[1], seeds=[1], warmup_rounds=0,
                                          requests_per_round=1))
    res = run_module(benchmark_round, {"out_dir": str(out), "index": 1, "python": fake_python})
    assert not res.get("failed"), res.get("msg")
    assert res["record"]["phases"]["engines"] == {}
    assert [e for e in res["record"]["phases"]["errors"] if e.startswith("engine metrics: ") and what in e]
    with open(_bench_outdir.round_path(str(out), 1)) as f:
        text = f.read()
    assert "Infinity" not in text and "NaN" not in text.replace('le=\\"NaN\\"', "")
    rounds, problems = _bench_outdir.read_rounds(str(out))
    assert problems == [] and len(rounds[1]["samples"]) == 1
    report = _bench_assemble.build_report(str(out), n_boot=50)
    _bench_report.validate(report)
    assert report["cells"][0]["phases_ms"] in (None, {}) or all(
        v is None for v in report["cells"][0]["phases_ms"].values())


@pytest.mark.parametrize("line", [
    "(Worker pid=2) INFO [default_loader.py:501] Loading weights took 1.2.3 seconds",
    "(Worker pid=2) INFO [default_loader.py:501] Loading weights took %s seconds" % ("9" * 400),
    "(Worker pid=2) INFO [default_loader.py:501] Loading weights took %s seconds" % ("9" * 5000),
])
def test_a_log_figure_that_cannot_be_is_null_and_later_records_still_work(run_module, tmp_path, line):
    """1.2.3 was a ValueError traceback; 400 nines were float('inf'), written as Infinity, which made every later
    record refuse the cold-start file."""
    log = tmp_path / "engine.log"
    log.write_text("==== 2026-12-01T10:05:00Z starting: vllm serve\n%s\n" % line)
    timeline = {"port_open": 60.0, "health": 61.0, "models": 61.5, "first_correct": 62.0}
    args = {"action": "record", "state": "nvme", "timeline": timeline, "log_file": str(log),
            "coldstart_file": str(tmp_path / "cs.json")}
    first = run_module(benchmark_coldstart, dict(args, rep=1))
    assert not first.get("failed"), first.get("msg")
    assert first["entry"]["log"]["weights_load_s"] is None and first["entry"]["phases"]["weights_load"] is None
    second = run_module(benchmark_coldstart, dict(args, rep=2))
    assert not second.get("failed"), second.get("msg")
    with open(tmp_path / "cs.json") as f:
        assert "Infinity" not in f.read()


def test_a_timeline_figure_that_cannot_be_is_a_clean_error(run_module, tmp_path):
    log = tmp_path / "engine.log"
    log.write_text(LOG)
    bad = run_module(benchmark_coldstart, {"action": "record", "state": "nvme", "rep": 1, "log_file": str(log),
                                           "timeline": {"port_open": 1.0, "first_correct": float("inf")},
                                           "coldstart_file": str(tmp_path / "cs.json")})
    assert bad["failed"] and bad["msg"].startswith("timeline.first_correct is inf, not a finite number")
