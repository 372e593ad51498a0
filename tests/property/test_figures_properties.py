"""Property-based harness for measurements that cannot be: the one parser of a figure (``_untrusted.figure``) and
every reader of figures from text the collection does not control (an engine's ``/metrics``, an engine log).

Generated metrics texts hold the histogram families a round reads, with values and bucket bounds drawn from every
number Prometheus text can write (``NaN``, ``+Inf``, ``-Inf``, negatives, ``1e308``, 400 digits, words) and lines
of any length; generated logs hold the cold-start lines with durations drawn the same way. The invariants:

* a figure is a finite float within its bounds, or a clean ``UntrustedInput`` (``limit="number"``): nothing else;
* an engine's ``/metrics`` gives either its phases, all finite and non-negative, or an error that names it (short,
  whatever the line's length): the round's record is JSON without ``Infinity`` or ``NaN`` and is a round the
  reader accepts (its client samples are never lost to a figure);
* the KV view of a ``/metrics`` is JSON without ``Infinity`` or ``NaN``, or ``PromParseError``;
* a log's durations are null or finite and non-negative, and its shard counts bounded or absent: never a
  traceback (``int()`` of 5000 digits raises).

CI runs a bounded number of examples with a fixed seed; ``make fuzz`` runs many more (``LLMOPS_FUZZ_EXAMPLES``).
"""
from __future__ import annotations

import json
import math
import os

from hypothesis import HealthCheck, example, given, settings, strategies as st

from ansible_collections.llmops.serving.plugins.module_utils.bench import _bench_coldstart, _bench_phases
from ansible_collections.llmops.serving.plugins.module_utils.common import _untrusted
from ansible_collections.llmops.serving.plugins.module_utils.engine import _diagnose
from ansible_collections.llmops.serving.plugins.module_utils.transport import _prom

EXAMPLES = int(os.environ.get("LLMOPS_FUZZ_EXAMPLES", "25"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

#: Every way a number can be written where the collection reads one.
NUMBER_TEXT = st.one_of(
    st.sampled_from(["NaN", "nan", "+Inf", "-Inf", "Inf", "inf", "Infinity", "-0", "0", "1e308", "-1e308", "1e-320",
                     "18446744073709551616", "1.2.3", "..", ".", "", "1_000", "0x10", "abc", "9" * 400, "9" * 5000]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(min_value=-(10 ** 30), max_value=10 ** 30).map(str),
    st.text(alphabet="0123456789.eE+-", max_size=80),
)
FAMILIES = [fam for dummy, fam in _bench_phases.HISTOGRAMS]


def _json_ok(doc):
    json.dumps(doc, allow_nan=False)  # raises ValueError on Infinity / NaN
    return True


@SETTINGS
@given(value=st.one_of(NUMBER_TEXT, st.floats(allow_nan=True, allow_infinity=True), st.integers(),
                       st.booleans(), st.none()),
       nonnegative=st.booleans())
def test_a_figure_is_finite_and_bounded_or_a_clean_refusal(value, nonnegative):
    try:
        got = _untrusted.figure(value, "f", nonnegative=nonnegative)
    except _untrusted.UntrustedInput as e:
        assert e.limit == "number" and len(str(e)) < 400
        return
    assert isinstance(got, float) and math.isfinite(got) and abs(got) <= _untrusted.MAX_ABS_NUMBER
    assert not nonnegative or got >= 0


@SETTINGS
@given(text=st.one_of(st.text(max_size=2000), st.binary(max_size=2000)), limit=st.integers(1, 300))
def test_an_excerpt_is_short_whatever_it_quotes(text, limit):
    shown = _untrusted.excerpt(text * 50, limit)
    assert len(shown) <= 10 * limit + 80  # repr writes a character in at most 10 (\U0001f600)


@st.composite
def histogram_lines(draw):
    fam = draw(st.sampled_from(FAMILIES))
    suffix = draw(st.sampled_from(["_sum", "_count", "_bucket"]))
    labels = 'engine="%d"' % draw(st.integers(0, 3))
    if suffix == "_bucket":
        labels += ',le="%s"' % draw(st.one_of(NUMBER_TEXT, st.sampled_from(["+Inf", "0.5", "1.0", "2.5"])))
    value = draw(st.one_of(NUMBER_TEXT, st.floats(0, 1e6).map(repr)))
    return "%s%s{%s} %s" % (fam, suffix, labels, value)


@SETTINGS
@given(lines=st.lists(histogram_lines(), max_size=12), junk=st.one_of(st.none(), st.text(max_size=300)),
       long_line=st.booleans(), client_ms=st.floats(min_value=1e-300, max_value=1e6))
@example(lines=['vllm:e2e_request_latency_seconds_sum{engine="0"} +Inf'], junk=None, long_line=False, client_ms=10.0)
@example(lines=['vllm:e2e_request_latency_seconds_count{engine="0"} -3'], junk=None, long_line=True, client_ms=10.0)
@example(lines=['vllm:request_queue_time_seconds_bucket{engine="0",le="NaN"} 1'], junk=None, long_line=False,
         client_ms=10.0)
@example(lines=["vllm:request_queue_time_seconds_sum 1e19", "vllm:request_queue_time_seconds_count 1e-300"],
         junk=None, long_line=False, client_ms=10.0)
@example(lines=["vllm:request_queue_time_seconds_sum 1e19", "vllm:request_queue_time_seconds_count 1",
                "vllm:request_prefill_time_seconds_sum 1", "vllm:request_prefill_time_seconds_count 1",
                "vllm:request_decode_time_seconds_sum 1", "vllm:request_decode_time_seconds_count 1"],
         junk=None, long_line=False, client_ms=1e-300)
def test_a_rounds_phases_are_finite_or_the_engine_is_named(lines, junk, long_line, client_ms):
    text = "\n".join(lines + ([junk] if junk is not None else []) + (["x{a=" + "y" * 200000] if long_line else []))
    snap = _bench_phases.snapshot({"url": "http://e:8000"}, fetch=lambda url: text)
    assert set(snap["engines"]) | {e.split(" metrics: ")[0] for e in snap["errors"]} == {"engine"}
    assert all(len(e) < 1000 for e in snap["errors"])
    for hists in snap["engines"].values():
        for h in hists.values():
            assert math.isfinite(h["sum"]) and h["sum"] >= 0 and math.isfinite(h["count"]) and h["count"] >= 0
            assert all(math.isfinite(le) and math.isfinite(c) and c >= 0 for le, c in h["buckets"])
    idle = _bench_phases.snapshot({"url": "http://e:8000"}, fetch=lambda url: "")  # the round's whole figures count
    phases = _bench_phases.round_phases(idle, snap)
    assert _json_ok(phases) and _bench_phases.round_problem(phases) is None
    cell = _bench_phases.cell_phases([phases], client_e2el_ms_mean=client_ms, client_requests=1)
    assert _json_ok(cell)


@SETTINGS
@given(values=st.lists(NUMBER_TEXT, min_size=1, max_size=6))
@example(values=["+Inf"])
@example(values=["1e19", "1", "1e-300"])
@example(values=["1", "2", "3", "0", "4", "inf"])
def test_the_kv_view_is_finite_json_or_a_parse_error(values):
    names = [_prom.VLLM_BYTES + "_sum", _prom.VLLM_BYTES + "_count", _prom.VLLM_XFER_TIME + "_sum",
             _prom.VLLM_FAILED + "_total", 'vllm:prompt_tokens_by_source_total{source="x"}',
             "sglang:kv_transfer_speed_gb_s"]
    text = "\n".join("%s %s" % (n, v) for n, v in zip(names, values))
    try:
        before = _prom.kv_sample(text)
    except _prom.PromParseError as e:
        assert len(str(e)) < 1000
        return
    assert _json_ok(before) and _json_ok(_prom.kv_delta(None, before)) and _json_ok(_prom.kv_delta(before, before))


LOG_TEMPLATES = [
    "Loading weights took %s seconds",
    "Model loading took 1.2 GiB memory and %s seconds",
    "init engine (profile, create kv cache, warmup model) took %s s",
    "init engine (profile, create kv cache, warmup model) took 3.0 s (compilation: %s s)",
    "torch.compile takes %s s in total",
    "Dynamo bytecode transform time: %s s",
]


@SETTINGS
@given(lines=st.lists(st.tuples(st.sampled_from(LOG_TEMPLATES),
                                st.one_of(NUMBER_TEXT, st.text(alphabet="0123456789.", min_size=1, max_size=500))),
                      max_size=8))
@example(lines=[(LOG_TEMPLATES[0], "1.2.3")])
@example(lines=[(LOG_TEMPLATES[2], "9" * 400)])
@example(lines=[(LOG_TEMPLATES[5], "9" * 400), (LOG_TEMPLATES[5], "1")])
def test_a_logs_durations_are_null_or_finite(lines):
    log = "\n".join(t % v for t, v in lines)
    parsed = _bench_coldstart.parse_log(log)
    for v in parsed.values():
        assert v is None or (isinstance(v, float) and math.isfinite(v) and v >= 0)
    timeline = {"port_open": 60.0, "health": 61.0, "models": 61.5, "first_correct": 62.0}
    assert _json_ok(_bench_coldstart.phases(timeline, parsed))


DIGITS = st.one_of(st.integers(0, 10 ** 6).map(str), st.text(alphabet="0123456789", min_size=1, max_size=6000))


@SETTINGS
@given(n=DIGITS, total=DIGITS, elapsed=st.text(alphabet="0123456789:", min_size=1, max_size=6000))
@example(n="9" * 5000, total="2", elapsed="00:01")
@example(n="1", total="2", elapsed="9" * 4000)
def test_a_loading_progress_line_is_read_or_left_out(n, total, elapsed):
    line = "Loading safetensors checkpoint shards:  50%% Completed | %s/%s [%s<00:01, 1.0it/s]" % (n, total, elapsed)
    progress = _diagnose.analyse_log(line)["progress"]
    assert progress is None or (0 <= progress["n"] <= _untrusted.MAX_ABS_NUMBER
                                and 0 <= progress["total"] <= _untrusted.MAX_ABS_NUMBER
                                and 0 <= progress["elapsed_s"] <= _untrusted.MAX_ABS_NUMBER
                                and len(progress["line"]) < 300)
    assert _json_ok(progress)
