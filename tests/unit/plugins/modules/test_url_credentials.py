"""Options that take a URL refuse ``user:password@``, and nothing the module returns repeats the credentials.

Each module runs as Ansible runs it (a process reading its arguments on stdin; AnsibleModule's own fail_json
with no_log masking), so the failed result, ``invocation`` included, is what ``-vvv``, a registered variable
and an AWX job event show. The refusal comes before anything is done: no request, no file, no cluster call.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

import ansible_collections.llmops.serving as collection
from ansible_collections.llmops.serving.plugins.module_utils.common import _http

TREE = os.path.dirname(os.path.dirname(os.path.dirname(list(collection.__path__)[0])))


def run_real(module, args):
    """Run ``module`` like Ansible does; returns (result, raw stdout + stderr)."""
    out = subprocess.run([sys.executable, "-m", "ansible_collections.llmops.serving.plugins.modules." + module],
                         input=json.dumps({"ANSIBLE_MODULE_ARGS": args}).encode(), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=TREE), timeout=60, check=False)
    raw = out.stdout.decode()
    return json.loads(raw), raw + out.stderr.decode()


def _creds():
    return "usr%s" % uuid.uuid4().hex[:8], "pw%s" % uuid.uuid4().hex


# The spellings a URL with credentials comes in: scheme in any case, surrounding whitespace, no scheme at all.
SPELLINGS = [
    " HTTP://{u}:{p}@gw.example:80",
    "hTTps://{u}:{p}@gw.example/v1",
    "{u}:{p}@gw.example:80",
    "\thttp://{u}:{p}@10.0.0.12:8000/metrics?x=1\n",
    "//{u}:{p}@gw.example",
]


def _cases(tmp_path, url):
    """(module, args, option as the message names it, what the fix mentions) for every module with a URL option."""
    peer = "http://10.0.0.2:9000/r/m/abc"
    target = {"name": "a", "url": "http://10.0.0.5:8000", "model": "glm"}
    k8s = {"namespace": "llm", "selector": {"app": "x"}}
    return [
        ("engine_probe", {"base_url": url, "model": "glm"}, "base_url", "headers"),
        ("pd_load", {"url": url, "model": "glm", "prompts": ["hi"]}, "url", "headers"),
        ("pd_load", {"url": "http://10.0.0.9:8000", "reference_url": url, "model": "glm", "prompts": ["hi"]},
         "reference_url", "headers"),
        ("rdma_counters", {"sysfs_root": str(tmp_path), "nixl_metrics": url}, "nixl_metrics", "/metrics"),
        ("rdma_counters", {"sysfs_root": str(tmp_path), "prefill_metrics": url}, "prefill_metrics", "/metrics"),
        ("kernel_cache", {"operation": "gc", "cache_root": str(tmp_path), "engine": "vllm", "warmup_url": url},
         "warmup_url", "127.0.0.1"),
        ("model_stage", {"src": str(tmp_path / "s"), "dest": str(tmp_path / "d"), "peers": [{"url": peer}, {"url": url}],
                         "peer_token": "t" * 32}, "peers[1].url", "peer_token"),
        ("benchmark_plan", {"targets": [target, dict(target, name="b", url=url)], "concurrency": [1], "seeds": [1],
                            "lengths": [[8, 8]], "requests_per_round": 1, "out_dir": str(tmp_path / "o")},
         "targets[1].url", "headers"),
        ("benchmark_plan", {"targets": [dict(target, decode_metrics_url=url)], "concurrency": [1], "seeds": [1],
                            "lengths": [[8, 8]], "requests_per_round": 1, "out_dir": str(tmp_path / "o")},
         "targets[0].decode_metrics_url", "/metrics"),
        ("engine_diagnose", {"namespace": "llm", "name": "eng", "host": url}, "host", "api_key"),
        ("k8s_engine_wait", dict(k8s, proxy=url), "proxy", "proxy_basic_auth"),
    ]


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_engine_probe_refuses_credentials_in_every_spelling(tmp_path, spelling):
    user, password = _creds()
    url = spelling.format(u=user, p=password)
    r, raw = run_real("engine_probe", {"base_url": url, "model": "glm", "deadline": 0})
    assert r["failed"] and r["reason"] == "credentials_in_url", r
    assert r["msg"].startswith("base_url: the URL carries credentials") and "Authorization header in headers" in r["msg"]
    assert user not in raw and password not in raw
    # the echo keeps the host, so the user still sees which option and which endpoint it was
    shown = r["invocation"]["module_args"]["base_url"]
    assert "***@" in shown and ("gw.example" in shown or "10.0.0.12" in shown), shown
    assert "checks" not in r  # nothing was sent


@pytest.mark.parametrize("index", range(11))
def test_every_url_option_refuses_credentials_before_doing_anything(tmp_path, index):
    user, password = _creds()
    module, args, option, fix = _cases(tmp_path, " HTTP://%s:%s@gw.example:80/x" % (user, password))[index]
    r, raw = run_real(module, args)
    assert r.get("failed") and r.get("reason") == "credentials_in_url", (module, r)
    assert r["msg"].startswith("%s: the URL carries credentials" % option) and fix in r["msg"], r["msg"]
    assert r["options"] == [option]
    assert user not in raw and password not in raw, module
    assert "invocation" in r and user not in json.dumps(r["invocation"])
    assert sorted(os.listdir(str(tmp_path))) == [], "%s wrote before refusing" % module


def test_a_user_without_password_and_a_percent_encoded_one_are_refused_and_hidden():
    for url, secret in (("hTTps://%s@gw.example" % ("admin" + uuid.uuid4().hex[:6]), "admin"),
                        ("http://us%%3Aer%s:p%%40ss%s@h:80" % ((uuid.uuid4().hex[:6],) * 2), "%3Aer")):
        r, raw = run_real("pd_load", {"url": url, "model": "glm", "prompts": ["x"]})
        assert r["failed"] and r["reason"] == "credentials_in_url", r
        assert secret not in raw
        assert r["invocation"]["module_args"]["url"] in ("https://***@gw.example", "http://***@h:80")


def test_urls_without_credentials_pass_the_check(tmp_path):
    # an @ after the host (path, query) is not a credential; a one-word metrics option that is not a URL neither
    for url in ("http://10.0.0.5:8000/v1/a@b", "http://h:8000/?who=a@b", "HTTP://[::1]:8000", "10.0.0.5:8000"):
        assert _http.url_userinfo(url) is None, url
    text = '# TYPE vllm:x counter\nvllm:x{user="a@b"} 1\n'
    assert not _http.credential_problems({"nixl_metrics": text}, {"nixl_metrics": ("fix", lambda v: len(v.split()) == 1)})
    r, dummy = run_real("engine_probe", {"base_url": "http://127.0.0.1:9", "model": "glm", "deadline": 0,
                                         "checks": [{"type": "models"}]})
    assert r["failed"] and "reason" not in r and r["checks"][0]["type"] == "models", r  # it went on to probe


@pytest.mark.parametrize("url,userinfo,shown", [
    (" HTTP://u:p@h", "u:p", "http://***@h"),
    ("hTTps://u@h", "u", "https://***@h"),
    ("u:p@h:80", "u:p", "***@h:80"),
    ("http://a:b@c@h:1/x?tok=s", "a:b@c", "http://***@h:1/x?***"),
    ("http://h/a@b", None, "http://h/a@b"),
])
def test_userinfo_is_found_and_removed_whatever_the_spelling(url, userinfo, shown):
    assert _http.url_userinfo(url) == userinfo
    assert _http.without_userinfo(url) == (shown if userinfo else url)


@pytest.mark.parametrize("query", ["token", "api_key", "access_token", "key", "sig", "password"])
def test_a_query_string_credential_is_refused_like_userinfo(tmp_path, query):
    """?token= (and the other credential names) is refused the way user:password@ is: the same reason, the option
    named, the value in no message, invocation or file."""
    secret = "q%s" % uuid.uuid4().hex
    r, raw = run_real("engine_probe", {"base_url": "http://gw.example:80/v1?%s=%s" % (query, secret), "model": "glm",
                                       "deadline": 0})
    assert r["failed"] and r["reason"] == "credentials_in_url", r
    assert r["msg"].startswith("base_url: the URL carries credentials (the query parameter %s)" % query), r["msg"]
    assert secret not in raw
    assert r["invocation"]["module_args"]["base_url"] == "http://gw.example:80/v1?***"


@pytest.mark.parametrize("index", range(11))
def test_every_url_option_refuses_a_query_string_credential(tmp_path, index):
    secret = "q%s" % uuid.uuid4().hex
    module, args, option, fix = _cases(tmp_path, "http://gw.example:80/x?api_key=%s" % secret)[index]
    r, raw = run_real(module, args)
    assert r.get("failed") and r.get("reason") == "credentials_in_url", (module, r)
    assert r["options"] == [option] and fix in r["msg"], r["msg"]
    assert secret not in raw, module
    assert sorted(os.listdir(str(tmp_path))) == [], "%s wrote before refusing" % module
