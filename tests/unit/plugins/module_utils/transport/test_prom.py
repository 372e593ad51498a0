"""Prometheus text parsing and the KV-transfer view of vLLM / SGLang decode metrics."""
from __future__ import annotations

import io
import math
import os

import pytest

from ansible_collections.llmops.serving.plugins.module_utils.transport import _prom

PROM = os.path.join(os.path.dirname(os.path.dirname(__file__)), "..", "..", "fixtures", "prom")


def prom(name):
    with open(os.path.join(PROM, name)) as f:
        return f.read()


def test_parse_labels_escapes_special_values_and_types():
    text = (
        "# HELP m A metric.\n"
        "# TYPE m counter\n"
        'm_total{a="x",b="q\\"uote\\\\",c="line\\nbreak"} 3 1700000000000\n'
        'h_bucket{le="+Inf"} +Inf\n'
        "g NaN\n"
        "plain 1.5e3\n"
    )
    samples, types = _prom.parse_text(text)
    assert types == {"m": "counter"}
    name, labels, value = samples[0]
    assert name == "m_total" and value == 3.0
    assert labels == {"a": "x", "b": 'q"uote\\', "c": "line\nbreak"}
    assert samples[1][2] == math.inf and math.isnan(samples[2][2]) and samples[3][2] == 1500.0


@pytest.mark.parametrize("bad,where", [
    ("m{a=x} 1", "line 1: label a value must be quoted"),
    ('ok 1\nm{a="x 1', "line 2: unterminated label value"),
    ('m{a="x" 1', "line 1: expected ',' or '}' after label a"),
    ("m", "line 1: sample m has no value"),
    ("m abc", "line 1: sample m has a non-numeric value 'abc'"),
    ("<html>", "line 1: not a metric sample"),
])
def test_malformed_text_names_the_line(bad, where):
    with pytest.raises(_prom.PromParseError, match=where):
        _prom.parse_text(bad)


def test_vllm_decode_sample_sums_histograms_counters_and_sources():
    s = _prom.kv_sample(prom("vllm_decode_after.txt"))
    assert s["engine"] == "vllm"
    assert s["bytes"] == pytest.approx(4.77e9 + 38.18e9)
    assert s["transfers"] == 72 and s["xfer_count"] == 72
    assert s["xfer_time_s"] == pytest.approx(4.62)
    assert s["failed_transfers"] == 0 and s["kv_expired_reqs"] == 0
    assert s["prompt_tokens_by_source"] == {"local_compute": 8, "local_cache_hit": 0,
                                            "external_kv_transfer": 294840}


def test_sums_across_engines_and_accepts_counters_without_total_suffix():
    text = (
        'vllm:nixl_bytes_transferred_sum{engine="0"} 100\n'
        'vllm:nixl_bytes_transferred_sum{engine="1"} 50\n'
        'vllm:nixl_num_failed_transfers{engine="0"} 1\n'
    )
    s = _prom.kv_sample(text)
    assert s["bytes"] == 150 and s["failed_transfers"] == 1


def test_engine_without_nixl_has_no_kv_fields():
    s = _prom.kv_sample(prom("vllm_colocated.txt"))
    assert s["engine"] == "vllm" and s["bytes"] is None and s["prompt_tokens_by_source"] is None
    d = _prom.kv_delta(None, s)
    assert d["bytes"] is None and d["rate_bytes_per_s"] is None and d["failures"] is None


def test_kv_delta_rate_is_bytes_over_summed_xfer_time():
    d = _prom.kv_delta(_prom.kv_sample(prom("vllm_decode_before.txt")),
                       _prom.kv_sample(prom("vllm_decode_after.txt")))
    assert d["baseline"] is True
    assert d["bytes"] == pytest.approx(38.18e9) and d["transfers"] == 64
    assert d["xfer_time_s"] == pytest.approx(4.1)
    assert d["rate_bytes_per_s"] == pytest.approx(38.18e9 / 4.1)
    assert d["failures"] == 0 and d["restarted"] == []
    assert d["prompt_tokens_by_source"] == {"external_kv_transfer": 262080, "local_cache_hit": 0,
                                            "local_compute": 0}


def test_kv_delta_detects_recompute_and_failures():
    before = _prom.kv_sample(prom("vllm_decode_before.txt"))
    rec = _prom.kv_delta(before, _prom.kv_sample(prom("vllm_decode_recompute.txt")))
    assert rec["bytes"] == 0 and rec["prompt_tokens_by_source"]["local_compute"] == 8192
    failed = _prom.kv_delta(before, _prom.kv_sample(prom("vllm_decode_failed.txt")))
    assert failed["failures"] == 2


def test_engine_restart_uses_the_new_totals_and_says_so():
    d = _prom.kv_delta(_prom.kv_sample(prom("vllm_decode_before.txt")),
                       _prom.kv_sample(prom("vllm_decode_restarted.txt")))
    assert d["bytes"] == pytest.approx(1.19e9)
    assert "bytes" in d["restarted"] and d["bytes"] >= 0


def test_sglang_kv_transfer_metrics_and_failures():
    s = _prom.kv_sample(prom("sglang_decode.txt"))
    assert s["engine"] == "sglang" and s["bytes"] is None
    assert s["sglang_kv_transfer"] == {"sglang:kv_transfer_speed_gb_s": 21.7,
                                       "sglang:kv_transfer_latency_ms": 13.4}
    d = _prom.kv_delta(s, _prom.kv_sample(prom("sglang_decode_failed.txt")))
    assert d["failures"] == 3 and d["sglang_kv_transfer"]["sglang:kv_transfer_speed_gb_s"] == 21.7


def test_load_fetches_urls_through_the_opener_and_passes_text_through():
    seen = {}

    def opener(url, **kw):
        seen["url"], seen["kw"] = url, kw
        return io.BytesIO(b"vllm:nixl_bytes_transferred_sum 7\n")

    assert _prom.load(" http://10.0.0.12:8000/metrics ", opener=opener).startswith("vllm:nixl")
    assert seen["url"] == "http://10.0.0.12:8000/metrics" and seen["kw"]["method"] == "GET"
    assert _prom.load("vllm:x 1\n", opener=opener) == "vllm:x 1\n"


def test_real_vllm_cpu_decode_metrics_after_four_pd_requests():
    # /metrics of a vLLM CPU decode engine (NixlConnector over UCX tcp) after four P/D requests.
    s = _prom.kv_sample(prom("vllm_cpu_decode_real.txt"))
    assert s["engine"] == "vllm"
    assert s["bytes"] == 524288 and s["transfers"] == 4 and s["xfer_count"] == 4
    assert s["xfer_time_s"] == pytest.approx(0.044187)
    assert s["failed_transfers"] == 0 and s["failed_notifications"] == 0
    assert s["prompt_tokens_by_source"] == {"local_compute": 0, "local_cache_hit": 0, "external_kv_transfer": 67}


# ---- figures that cannot be, and messages that quote only a short excerpt --------------------------------- #

def test_a_huge_malformed_line_is_quoted_only_in_part():
    """A 5 MB malformed line was echoed whole into the message (and twice into the round file)."""
    line = "vllm:x{a=" + "z" * (5 * 1024 * 1024) + "} 1"
    with pytest.raises(_prom.PromParseError) as e:
        _prom.parse_text(line)
    assert str(e.value).startswith("line 1: label a value must be quoted: 'vllm:x{a=zzz")
    assert "(the first 120 of %d characters)" % len(line) in str(e.value) and len(str(e.value)) < 300


@pytest.mark.parametrize("text,what", [
    ("vllm:nixl_bytes_transferred_sum +Inf\n", "is inf, not a finite number"),
    ("vllm:nixl_bytes_transferred_count -1\n", "cannot be negative"),
    ("vllm:nixl_xfer_time_seconds_sum NaN\n", "is nan, not a finite number"),
    ('vllm:prompt_tokens_by_source_total{source="local_compute"} -Inf\n', "not a finite number"),
    ("vllm:nixl_num_failed_transfers_total 1e30\n", "beyond"),
])
def test_a_counter_that_cannot_be_is_refused_naming_the_sample(text, what):
    with pytest.raises(_prom.PromValueError) as e:
        _prom.kv_sample(text)
    assert what in str(e.value) and text.split("{")[0].split()[0] in str(e.value)


def test_a_sglang_gauge_that_is_not_finite_is_left_out():
    s = _prom.kv_sample("sglang:kv_transfer_speed_gb_s NaN\nsglang:kv_transfer_latency_ms +Inf\n"
                        "sglang:kv_transfer_bootstrap_ms 2.5\n")
    assert s["sglang_kv_transfer"] == {"sglang:kv_transfer_bootstrap_ms": 2.5}


@pytest.mark.parametrize("le,out", [("+Inf", math.inf), ("0.25", 0.25), ("1e3", 1000.0)])
def test_bucket_bounds(le, out):
    assert _prom.bucket_bound("h_bucket", {"le": le}) == out


@pytest.mark.parametrize("labels", [{"le": "NaN"}, {"le": "soon"}, {"le": "-Inf"}, {"le": "1e300"}, {}])
def test_a_bucket_bound_that_cannot_be_is_refused(labels):
    with pytest.raises(_prom.PromValueError, match="its bucket bound le"):
        _prom.bucket_bound("h_bucket", labels)


def test_a_count_is_a_whole_number_and_a_rate_is_never_infinite():
    """A count of 1e-300 made the mean 1e19 / 1e-300 = inf (Infinity in the round, a report that cannot be
    written); a transfer time of 1e-300 made the rate inf."""
    with pytest.raises(_prom.PromValueError, match="it counts, so it is a whole number"):
        _prom.kv_sample("vllm:nixl_xfer_time_seconds_count 1e-300\n")
    d = _prom.kv_delta(None, _prom.kv_sample("vllm:nixl_bytes_transferred_sum 1e19\n"
                                             "vllm:nixl_xfer_time_seconds_sum 1e-300\n"))
    assert d["bytes"] == 1e19 and d["rate_bytes_per_s"] is None
