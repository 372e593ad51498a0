"""Property-based harness for credentials in URL options (``_http.refuse_url_credentials``).

For any URL an option may receive - scheme in any case or none, surrounding whitespace, percent-encoded or plain
credentials, a user with or without a password, ``@`` in the path or query - the invariants a user relies on:

* a URL carries credentials for the helper exactly when the HTTP client would send some (``urllib``'s
  ``urlsplit``, which ``ansible.module_utils.urls.open_url`` uses, finds a user in it);
* a URL with credentials fails the module, and neither the message, the ``invocation`` echo nor any other
  result value (as AnsibleModule's own ``remove_values`` leaves them) holds the user or the password;
* a URL without credentials is never refused.

CI runs a bounded number of examples with a fixed seed; ``make fuzz`` runs many more (``LLMOPS_FUZZ_EXAMPLES``).
"""
from __future__ import annotations

import json
import os
from urllib.parse import quote, urlsplit

from ansible.module_utils.common.parameters import remove_values
from hypothesis import HealthCheck, Phase, given, settings, strategies as st

from ansible_collections.llmops.serving.plugins.module_utils.common import _http

EXAMPLES = int(os.environ.get("LLMOPS_FUZZ_EXAMPLES", "150"))
PHASES = [Phase.explicit, Phase.reuse, Phase.generate] + ([Phase.shrink] if os.environ.get("LLMOPS_FUZZ_SHRINK") else [])
SETTINGS = dict(max_examples=EXAMPLES, derandomize=True, deadline=None, phases=PHASES,
                suppress_health_check=[HealthCheck.too_slow])

# Credentials: long enough to be masked on their own; drawn from letters no host, path or message below uses
# (upper case), so finding one in the output is a leak, never a coincidence.
SECRET_CHARS = "QWXYZKJVBNMPHGFDSUTR"
secret = st.text(alphabet=SECRET_CHARS + "-_.~!$&*+;=", min_size=3, max_size=16).filter(lambda s: s[0] in SECRET_CHARS)
scheme = st.sampled_from(["http", "https"]).flatmap(
    lambda s: st.tuples(*[st.sampled_from([c.lower(), c.upper()]) for c in s]).map("".join))
space = st.sampled_from(["", " ", "  ", "\t", "\n", " \t"])
host = st.sampled_from(["gw.example", "10.0.0.12", "[::1]", "aibrix-gateway.aibrix-system.svc", "localhost"])
port = st.sampled_from(["", ":80", ":8000", ":8443"])
path = st.sampled_from(["", "/", "/v1", "/metrics", "/r/m/abc", "/v1/a@b", "/x?who=a@b"])


class FakeModule(object):
    """What the helper uses of AnsibleModule: ``params``, ``no_log_values`` and ``fail_json``, with the result
    masked the way AnsibleModule's ``_return_formatted`` masks it (``invocation`` = the params)."""

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


def _refused(params, options):
    module = FakeModule(params)
    try:
        _http.refuse_url_credentials(module, options)
    except FakeModule.Failed:
        return module.result
    return None


@settings(**SETTINGS)
@given(user=secret, password=st.one_of(st.none(), secret), encode=st.booleans(), sch=st.one_of(st.none(), scheme),
       before=space, after=space, h=host, p=port, rest=path)
def test_credentials_are_found_and_never_shown(user, password, encode, sch, before, after, h, p, rest):
    u, pw = (quote(user, safe=""), quote(password or "", safe="")) if encode else (user, password or "")
    userinfo = u + (":" + pw if password is not None else "")
    url = before + ("%s://" % sch if sch else "") + userinfo + "@" + h + p + rest + after
    assert _http.url_userinfo(url) == userinfo
    if sch:  # the HTTP client would send these credentials: the helper sees what it sees
        assert urlsplit(url.strip()).username is not None
    shown = _http.without_userinfo(url)
    assert user not in shown and (password is None or password not in shown) and "***@" in shown
    result = _refused({"base_url": url, "model": "glm"}, {"base_url": "use headers"})
    assert result is not None and result["reason"] == "credentials_in_url"
    assert result["msg"].startswith("base_url: the URL carries credentials")
    text = json.dumps(result)
    assert user not in text and (password is None or password not in text), text
    assert u not in text and (not pw or pw not in text)  # as written in the URL (percent-encoded) too


@settings(**SETTINGS)
@given(user=secret, sch=scheme, before=space, h=host, p=port, rest=path, index=st.integers(0, 3))
def test_nested_url_options_name_the_entry(user, sch, before, h, p, rest, index):
    targets = [{"name": "t%d" % i, "url": "http://10.0.0.%d:8000" % i} for i in range(4)]
    targets[index]["url"] = before + "%s://%s:pw%s@%s%s%s" % (sch, user, user, h, p, rest)
    result = _refused({"targets": targets}, {"targets[].url": "use the target's headers"})
    assert result["options"] == ["targets[%d].url" % index]
    assert user not in json.dumps(result)


@settings(**SETTINGS)
@given(sch=st.one_of(st.none(), scheme), before=space, h=host, p=port, rest=path)
def test_urls_without_credentials_are_never_refused(sch, before, h, p, rest):
    url = before + ("%s://" % sch if sch else "") + h + p + rest
    assert _http.url_userinfo(url) is None
    assert _refused({"base_url": url}, {"base_url": "use headers"}) is None
    if sch:
        assert urlsplit(url.strip()).username is None
