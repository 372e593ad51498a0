"""A benchmark target's credential header never reaches a command line, a Job, a rendered file or a result.

The load client (``vllm bench serve``) gets the target's headers in its environment (``LLMOPS_BENCH_HEADERS``),
never as ``--header`` arguments, which every local user reads in ``/proc/<pid>/cmdline``; the client's own
wrapper (``_bench_client.DIGEST_SOURCE``) hands them to ``benchmark()`` as ``extra_headers`` after the arguments
were parsed and printed. A Kubernetes Job reads the credential headers from a Secret (``header_secret``), so
neither the Job YAML nor the module's result holds them; without a Secret the module refuses with
``reason=credential_header``.
"""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest

from ansible_collections.llmops.serving.plugins.module_utils.bench import _bench_client, _bench_job, _bench_outdir
from ansible_collections.llmops.serving.plugins.module_utils.bench import _bench_round
from ansible_collections.llmops.serving.plugins.modules import benchmark_job

BEARER = "Bearer gw-credential-7f3a9c1e"
ROUND = {"index": 1, "kind": "measure", "target": "gw", "concurrency": 2, "input_len": 16, "output_len": 4,
         "num_prompts": 4, "seed": 1, "rep": 0, "request_rate": None}


def _plan(tmp_path, headers):
    out = tmp_path / "out"
    _bench_outdir.prepare_out_dir(str(out))
    _bench_outdir.write_plan(str(out), {
        "schema": _bench_outdir.PLAN_SCHEMA, "started_at": 0.0, "tokenizer": "/models/tok", "rounds": [ROUND],
        "targets": [{"name": "gw", "url": "http://gw.example:80", "model": "glm", "headers": headers}],
        "protocol": {}, "probes": [], "estimate_s": None, "ready_timeout_s": 30, "time_budget_s": 0})
    return str(out)


def test_the_client_command_line_never_carries_a_header():
    target = {"name": "gw", "url": "http://gw.example:80", "model": "glm",
              "headers": {"Authorization": BEARER, "routing-strategy": "pd"}}
    argv = _bench_client.client_argv("python3", target, ROUND, "/tok", "/out", "r.json")
    assert "--header" not in argv and not [a for a in argv if "gw-credential" in a or "routing-strategy" in a]
    env = _bench_client.client_env(target, {"PATH": "/usr/bin"})
    assert json.loads(env[_bench_client.HEADERS_ENV]) == target["headers"] and env["PATH"] == "/usr/bin"


class _Answer(object):
    """An answer of the target: its model list, and an empty /metrics."""

    status = 200
    headers = {}

    def __init__(self, url):
        self._body = io.BytesIO(json.dumps({"data": [{"id": "glm"}]}).encode() if "/v1/models" in url else b"")

    def read(self, n=-1):
        return self._body.read(n)

    def close(self):
        pass


def _opener(url, **kwargs):
    return _Answer(url)


def test_a_local_round_hands_the_headers_to_the_client_in_its_environment(tmp_path):
    out = _plan(tmp_path, {"Authorization": BEARER, "model": "glm"})
    plan = _bench_outdir.read_plan(out)
    seen = {}

    def runner(argv, log_path, timeout, env):
        seen.update(argv=argv, env=env)
        return 1, 0.0

    _bench_round.run_round(out, plan, 1, "python3", env={"PATH": "/usr/bin"}, runner=runner, client_output=None,
                           opener=_opener)
    assert seen, "the client did not run"
    assert not [a for a in seen["argv"] if "gw-credential" in a] and "--header" not in seen["argv"]
    assert json.loads(seen["env"][_bench_client.HEADERS_ENV]) == {"Authorization": BEARER, "model": "glm"}


def _stub_vllm(root):
    """A stand-in ``vllm.benchmarks.serve`` with the parser and the call of ``benchmark()`` of vLLM's own
    (vllm/benchmarks/serve.py: ``--header`` KEY=VALUE pairs become the ``extra_headers`` keyword; ``main`` prints
    the parsed arguments)."""
    pkg = os.path.join(root, "vllm")
    for sub in ("", "benchmarks", "utils"):
        os.makedirs(os.path.join(pkg, sub), exist_ok=True)
        open(os.path.join(pkg, sub, "__init__.py"), "w").close()
    with open(os.path.join(pkg, "utils", "argparse_utils.py"), "w") as f:
        f.write("from argparse import ArgumentParser as FlexibleArgumentParser\n")
    with open(os.path.join(pkg, "benchmarks", "serve.py"), "w") as f:
        f.write('''import asyncio, json, os, sys
def add_cli_args(p):
    p.add_argument("--header", nargs="*")
    p.add_argument("--base-url")
async def benchmark(input_requests=None, tokenizer=None, extra_headers=None):
    print("HEADERS " + json.dumps(extra_headers, sort_keys=True))
    print("ENV " + json.dumps(sorted(k for k in os.environ if k.startswith("LLMOPS_BENCH"))))
    return {}
def main(args):
    print("ARGS %r" % (args,))
    headers = dict(h.split("=", 1) for h in (args.header or [])) or None
    return asyncio.run(benchmark(input_requests=[], extra_headers=headers))
''')


def test_the_client_wrapper_sends_the_environment_headers_and_drops_the_variables(tmp_path):
    _stub_vllm(str(tmp_path))
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    env[_bench_client.HEADERS_ENV] = json.dumps({"routing-strategy": "pd"})
    env[_bench_client.SECRET_HEADERS_ENV] = json.dumps({"Authorization": BEARER})
    proc = subprocess.run([sys.executable, "-c", _bench_client.CLIENT_SOURCE, "--base-url", "http://gw"],
                          env=env, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if " " in line)
    assert json.loads(lines["HEADERS"]) == {"Authorization": BEARER, "routing-strategy": "pd"}
    assert json.loads(lines["ENV"]) == []  # nothing the client starts inherits them
    assert "gw-credential" not in lines["ARGS"]  # the printed arguments never hold them


def test_a_job_without_a_secret_for_a_credential_header_is_refused(run_module, tmp_path):
    out = _plan(tmp_path, {"Authorization": BEARER, "model": "glm"})
    r = run_module(benchmark_job, {"out_dir": out, "namespace": "llm", "image": "vllm/vllm-openai:v0.10.1",
                                   "render_dir": str(tmp_path / "jobs")})
    assert r["failed"] and r["reason"] == "credential_header", r
    assert r["msg"].startswith("header_secret:") and "Authorization (gw)" in r["msg"]
    assert "gw-credential" not in json.dumps(r)
    assert not (tmp_path / "jobs").exists()


def test_a_job_reads_the_credential_header_from_the_secret_and_holds_no_value(run_module, tmp_path):
    out = _plan(tmp_path, {"Authorization": BEARER, "model": "glm"})
    r = run_module(benchmark_job, {"out_dir": out, "namespace": "llm", "image": "vllm/vllm-openai:v0.10.1",
                                   "render_dir": str(tmp_path / "jobs"), "header_secret": "bench-headers"})
    assert not r.get("failed"), r
    (container,) = r["objects"][0]["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env[_bench_client.SECRET_HEADERS_ENV]["valueFrom"] == {
        "secretKeyRef": {"name": "bench-headers", "key": "headers"}}
    assert json.loads(env[_bench_client.HEADERS_ENV]["value"]) == {"model": "glm"}
    assert "--header" not in container["args"]
    assert "gw-credential" not in json.dumps(r)
    for name in os.listdir(str(tmp_path / "jobs")):
        assert "gw-credential" not in (tmp_path / "jobs" / name).read_text(), name


@pytest.mark.parametrize("headers", [{"X-Api-Key": "k-123456"}, {"Cookie": "session=abc"},
                                     {"x-custom": "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz01234567"}])
def test_every_credential_header_by_the_one_rule_goes_through_the_secret(headers):
    plan = {"targets": [{"name": "gw", "url": "http://gw", "model": "m", "headers": headers}], "rounds": [ROUND],
            "tokenizer": "/models/tok"}
    with pytest.raises(_bench_job.BenchError) as e:
        _bench_job.check_header_secret(plan, None)
    assert e.value.reason == "credential_header"
    job = _bench_job.job_manifest(plan, ROUND, "llm", "img", header_secret="s")
    assert list(headers.values())[0] not in json.dumps(job)
