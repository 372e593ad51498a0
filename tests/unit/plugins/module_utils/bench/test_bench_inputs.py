"""_bench_inputs: what the benchmark modules share when they act on their inputs: the header values they never show
and the fields they fail with."""
from __future__ import annotations

from ansible_collections.llmops.serving.plugins.module_utils.bench import _bench_coldstart, _bench_inputs


def test_credential_headers_are_the_values_never_shown():
    targets = [
        {"name": "a", "headers": {"x-api-key": "abc", "routing-strategy": "pd"}},
        {"name": "b", "headers": {"x-note": "hf_" + "A" * 34}},  # a token by its shape, whatever the header's name
        {"name": "c"},
    ]
    hidden = _bench_inputs.secret_header_values(targets)
    assert "abc" in hidden and "hf_" + "A" * 34 in hidden
    assert "pd" not in hidden


def test_an_authorization_header_is_never_shown_whatever_its_value():
    # RFC 9110 11.6.2 / 11.7.2 and RFC 6265 5.4: these headers carry credentials by their name alone; an opaque
    # gateway key has no recognisable shape ("Bearer" + any string).
    targets = [{"name": "gw", "headers": {"Authorization": "Bearer opaque-gateway-key", "model": "glm",
                                          "proxy-authorization": "Basic dXNlcjpwdw==", "Cookie": "session=s3"}}]
    hidden = _bench_inputs.secret_header_values(targets)
    assert sorted(hidden) == sorted(["Bearer opaque-gateway-key", "Basic dXNlcjpwdw==", "session=s3"])


def test_a_module_fails_with_the_message_and_what_the_error_carries():
    e = _bench_inputs.BenchError("benchmark_out_dir: bad", reason="bad_file", file="/x/plan.json")
    assert _bench_inputs.failure(e) == {"msg": "benchmark_out_dir: bad", "reason": "bad_file", "file": "/x/plan.json"}
    assert _bench_inputs.failure(_bench_inputs.BenchError("benchmark_seeds: bad")) == {
        "msg": "benchmark_seeds: bad", "reason": "bad_input"}
    # a cold-start error has no reason; the file to blame only when there is one
    assert _bench_inputs.failure(_bench_coldstart.ColdstartError("log_file: missing", file="/x/log")) == {
        "msg": "log_file: missing", "file": "/x/log"}
    assert _bench_inputs.failure(_bench_coldstart.ColdstartError("state: bad")) == {"msg": "state: bad"}
