"""Property-based harness for the one credential rule (``_secrets``) over every channel a credential travels by.

A credential name is drawn (``HF_TOKEN``, ``OPENAI_API_KEY``, ``token``, ``api_key``, ``access_token``, ``sig``,
``DB_PASSWORD``, with prefixes and in any case) and a secret value; the pair is planted in one channel:

* a URL's userinfo, its query string or its fragment (``?token=``, ``#access_token=``);
* an HTTP header of a benchmark target (``Authorization``, ``X-Api-Key``, a credential-named header);
* a ``NAME=value`` word of a command (after ``env``), an ``export NAME=value`` inside ``bash -c``/``sh -c``.

Invariants: the rule recognises it (:func:`credential_in_url`, :func:`is_credential_header`,
:func:`credential_words`); a module that takes that channel refuses or masks it, and the value appears nowhere in
what the user sees (the failed result with its ``invocation`` as AnsibleModule's ``remove_values`` leaves it, the
Job, the load client's command line). A plain setting (``max_tokens``, ``TOKENIZERS_PARALLELISM``, ``HF_TOKEN_PATH``)
is never taken for a credential.

CI runs a bounded number of examples with a fixed seed; ``make fuzz`` runs many more (``LLMOPS_FUZZ_EXAMPLES``).
"""
from __future__ import annotations

import json
import os
import shlex

from ansible.module_utils.common.parameters import remove_values
from hypothesis import HealthCheck, Phase, given, settings, strategies as st

from ansible_collections.llmops.serving.plugins.module_utils.bench import _bench_client, _bench_job
from ansible_collections.llmops.serving.plugins.module_utils.common import _http, _secrets

EXAMPLES = int(os.environ.get("LLMOPS_FUZZ_EXAMPLES", "150"))
PHASES = [Phase.explicit, Phase.reuse, Phase.generate] + ([Phase.shrink] if os.environ.get("LLMOPS_FUZZ_SHRINK") else [])
SETTINGS = dict(max_examples=EXAMPLES, derandomize=True, deadline=None, phases=PHASES,
                suppress_health_check=[HealthCheck.too_slow])

# Secrets: upper-case letters no name, host or message below uses, so finding one in the output is a leak.
SECRET_CHARS = "QWXYZJVBNMGFDSU"
secret = st.text(alphabet=SECRET_CHARS + "-_.~+", min_size=6, max_size=24).filter(lambda s: s[0] in SECRET_CHARS)
last_word = st.sampled_from(["token", "TOKEN", "key", "KEY", "password", "secret", "apikey", "passphrase"])
prefix = st.lists(st.sampled_from(["hf", "openai", "api", "access", "db", "aws", "x", "llmops", "hub"]), max_size=3)
cred_name = st.one_of(
    st.tuples(prefix, last_word).map(lambda t: "_".join(t[0] + [t[1]])),
    st.sampled_from(["AWS_ACCESS_KEY_ID", "S3_ACCESS_KEY_ID", "HUGGING_FACE_HUB_TOKEN"]))
query_name = st.one_of(cred_name, st.sampled_from(["sig", "X-Amz-Signature", "X-Amz-Credential", "auth"]))
header_name = st.one_of(st.sampled_from(["Authorization", "Proxy-Authorization", "Cookie", "X-Api-Key",
                                         "x-auth-token"]),
                        cred_name.map(lambda n: "X-" + n.replace("_", "-")))
plain_name = st.sampled_from(["max_tokens", "TOKENIZERS_PARALLELISM", "HF_TOKEN_PATH", "HF_HUB_DISABLE_IMPLICIT_TOKEN",
                              "VLLM_MULTI_STREAM_GEMM_TOKEN_THRESHOLD", "keyword", "routing-strategy", "model"])
host = st.sampled_from(["gw.example", "10.0.0.12:8000", "[::1]:8443", "aibrix-gateway.aibrix-system.svc"])
path = st.sampled_from(["", "/", "/v1", "/metrics", "/v1/a@b"])
other = st.sampled_from(["", "x=1&", "model=glm&", "max_tokens=16&"])


class FakeModule(object):
    """``params``, ``no_log_values`` and ``fail_json`` of AnsibleModule, its result masked as
    ``_return_formatted`` masks it (``invocation`` = the params)."""

    class Failed(Exception):
        pass

    def __init__(self, params):
        self.params = params
        self.no_log_values = set()
        self.result = None

    def fail_json(self, msg, **kwargs):
        kwargs.update(msg=msg, failed=True, invocation={"module_args": self.params})
        self.result = remove_values(kwargs, self.no_log_values)
        raise self.Failed()


@settings(**SETTINGS)
@given(name=query_name, value=secret, where=st.sampled_from(["query", "fragment", "userinfo"]), h=host, p=path,
       before=other, scheme=st.sampled_from(["http://", "HTTPS://", ""]))
def test_a_url_credential_is_found_and_never_shown(name, value, where, h, p, before, scheme):
    if where == "userinfo":
        url = "%susr:%s@%s%s" % (scheme, value, h, p)
    elif where == "query":
        url = "%s%s%s?%s%s=%s" % (scheme, h, p, before, name, value)
    else:
        url = "%s%s%s#%s%s=%s" % (scheme, h, p, before, name, value)
    found = _secrets.credential_in_url(url)
    assert found and any(value in s for dummy, s in found), (url, found)
    module = FakeModule({"base_url": url})
    try:
        _http.refuse_url_credentials(module, {"base_url": "send it in headers"})
    except FakeModule.Failed:
        pass
    assert module.result and module.result["reason"] == "credentials_in_url"
    assert value not in json.dumps(module.result), module.result


@settings(**SETTINGS)
@given(name=plain_name, value=secret, h=host, p=path)
def test_a_plain_parameter_is_never_taken_for_a_credential(name, value, h, p):
    assert _secrets.credential_in_url("http://%s%s?%s=%s" % (h, p, name, value)) == []
    assert _secrets.credential_words(["env", "%s=%s" % (name, value), "vllm", "serve"]) == []


@settings(**SETTINGS)
@given(name=cred_name, value=secret, shell=st.sampled_from(["bash", "sh", "/bin/bash", "/usr/bin/env"]),
       form=st.sampled_from(["env", "export", "export-quoted", "inline"]),
       before=st.sampled_from(["", "source /opt/venv/bin/activate && ", "cd /srv; "]),
       after=st.sampled_from(["; exec vllm serve /m", " && exec python -m sglang.launch_server", ""]))
def test_a_command_credential_is_found_and_never_shown(name, value, shell, form, before, after):
    if form == "env" or shell == "/usr/bin/env":
        command = ["env", "%s=%s" % (name, value), "vllm", "serve", "/m"]
    elif form == "inline":
        command = [shell, "-c", "%s%s=%s exec vllm serve /m" % (before, name, value)]
    else:
        word = "%s=%s" % (name, shlex.quote(value) if form == "export-quoted" else value)
        command = [shell, "-lc", "%sexport %s%s" % (before, word, after)]
    words = _secrets.credential_words(command)
    assert [(n, v.strip("'")) for dummy, n, v in words] == [(name, value)], (command, words)
    module = FakeModule({"command": command})
    fields = _secrets.hide_command_credentials(module, "command")
    assert fields
    shown = remove_values({"invocation": {"module_args": module.params}, "cmd": " ".join(command)},
                          module.no_log_values)
    assert value not in json.dumps(shown), shown


@settings(**SETTINGS)
@given(name=header_name, value=secret, plain=st.sampled_from([{}, {"model": "glm"}, {"routing-strategy": "pd"}]))
def test_a_credential_header_never_reaches_the_client_command_line_or_the_job(name, value, plain):
    assert _secrets.is_credential_header(name)
    headers = dict(plain, **{name: value})
    target = {"name": "gw", "url": "http://gw.example", "model": "glm", "headers": headers}
    rnd = {"index": 1, "kind": "measure", "target": "gw", "concurrency": 1, "input_len": 8, "output_len": 4,
           "num_prompts": 2, "seed": 1, "rep": 0}
    argv = _bench_client.client_argv("python3", target, rnd, "/tok", "/out", "r.json")
    assert value not in json.dumps(argv)
    plan = {"targets": [target], "rounds": [rnd], "tokenizer": "/models/tok"}
    try:
        _bench_job.job_manifest(plan, rnd, "llm", "img")
        raise AssertionError("a credential header without header_secret was rendered")
    except _bench_job.BenchError as e:
        assert e.reason == "credential_header" and value not in str(e)
    job = _bench_job.job_manifest(plan, rnd, "llm", "img", header_secret="bench-headers")
    assert value not in json.dumps(job)
