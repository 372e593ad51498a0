# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: the one rule for credentials in rendered manifests.

A rendered manifest is committed to Git, printed by ``kubectl get -o yaml`` and shown by ``--diff``: a
credential written into it is leaked. Both renderers (``engine_manifests``, ``pd_manifests``) pass every input
that reaches a container through :class:`Scan` (environment, engine flags, extra arguments, the entrypoint) and
then the built objects through :meth:`Scan.objects` as a last net. A finding names the field (``env.HF_TOKEN``,
``engine_args.api-key``, ``extra_args[3]``) and the fix (a Secret reference), never the value; the plain values
found are kept on the raised error (``secret_values``) so a module can add them to ``no_log_values`` and the
failed result's ``invocation`` does not show them either.

What is a credential:

* an environment variable, flag or JSON key whose name is in :data:`CREDENTIAL_NAMES`, or whose last ``_``/``-``
  word is one of :data:`CREDENTIAL_WORDS` (``HF_TOKEN``, ``HUGGING_FACE_HUB_TOKEN``, ``AWS_SECRET_ACCESS_KEY``,
  ``AWS_SESSION_TOKEN``, ``VLLM_API_KEY``, ``DB_PASSWORD``, ``--api-key``, ``--hf-token``), except the names in
  :data:`NOT_CREDENTIALS`. Only the *last* word counts: vLLM's tuning knobs ``VLLM_MAX_TOKENS_PER_EXPERT_FP4_MOE``
  or ``VLLM_MULTI_STREAM_GEMM_TOKEN_THRESHOLD``, ``TOKENIZERS_PARALLELISM``, ``HF_TOKEN_PATH`` (a path) and
  ``HUGGINGFACE_HUB_CACHE`` are not credentials. Names are not matched on a prefix such as ``AWS_*`` or
  ``HUGGINGFACE_*``: ``AWS_REGION`` and ``HUGGINGFACE_HUB_CACHE`` are plain settings;
* an abbreviation of a credential flag of the engines (argparse accepts unambiguous prefixes);
* any value shaped like a known token (:data:`TOKEN_SHAPES`), whatever its name.

A value is *not* plain text when it is empty or a boolean word (``--hf-token`` without a value, ``true``), a
Kubernetes dependent variable ``$(NAME)`` whose ``NAME`` is an env entry with ``valueFrom`` (Kubernetes expands
it in ``command``, ``args`` and ``env``), or a shell variable ``$NAME`` / ``${NAME}``.

The same rule covers every channel a credential travels through (one function per channel, all on the names
above): a URL's ``user:password@`` and its query or fragment parameters (:func:`credential_in_url`:
``?token=``, ``?api_key=``, ``?sig=``), an HTTP header name (:func:`is_credential_header`), and the
``NAME=value`` words of a command (:func:`credential_words`: ``env HF_TOKEN=...``, ``export OPENAI_API_KEY=...``
inside ``bash -c``). :class:`Scan` applies all of them to what a renderer or a module puts on a command line.

Nesting cannot hide a credential: JSON arguments (objects or arrays) are parsed by the shared reader
(``_untrusted``) and walked without recursion; a value nested deeper than ``MAX_DEPTH`` levels cannot be
checked and is refused as a finding, never passed unchecked.
"""
from __future__ import annotations

import json
import re
import shlex
from urllib.parse import unquote

from ansible_collections.llmops.serving.plugins.module_utils.common._untrusted import (
    MAX_DEPTH, UntrustedInput, loads_json, loads_yaml)

# Last words of a name that make it a credential.
CREDENTIAL_WORDS = frozenset({"TOKEN", "PASSWORD", "PASSWD", "PASSPHRASE", "SECRET", "KEY", "APIKEY"})

# Credentials whose last word is not one of CREDENTIAL_WORDS.
CREDENTIAL_NAMES = frozenset({
    # AWS CLI / boto3 credential pair (AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN match by their last word).
    "AWS_ACCESS_KEY_ID",
    # vllm/envs.py: S3_ACCESS_KEY_ID with S3_SECRET_ACCESS_KEY, for loading weights from S3.
    "S3_ACCESS_KEY_ID",
})

# Names that end in a credential word but hold no credential.
NOT_CREDENTIALS = frozenset({
    # huggingface_hub/constants.py: a boolean switch ("do not send the stored token implicitly").
    "HF_HUB_DISABLE_IMPLICIT_TOKEN",
})

# Credential flags of the engines, for abbreviations (vllm/snapshot/runtime.py redacts the same two of vLLM,
# abbreviations included). vLLM: --api-key (vllm/entrypoints/launchers/cli_args.py, ``api_key: list[str]``,
# several values), --hf-token (vllm/engine/arg_utils.py, ``bool | str``: bare means the stored login token).
# SGLang (python/sglang/srt/server_args.py): --api-key and --admin-api-key.
CREDENTIAL_FLAGS = ("--api-key", "--hf-token", "--admin-api-key")
MULTI_VALUE_FLAGS = frozenset({"--api-key"})

# Values with the shape of a token, whatever the field is called.
TOKEN_SHAPES = (
    # Hugging Face user access tokens: "hf_" and 34 letters (GitHub secret scanning's Hugging Face pattern).
    ("a Hugging Face access token", re.compile(r"(?<![A-Za-z0-9_])hf_[A-Za-z0-9]{30,}(?![A-Za-z0-9])")),
    # AWS access key ids: AKIA (long-term) or ASIA (temporary) and 16 upper-case letters or digits.
    ("an AWS access key id", re.compile(r"(?<![A-Z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Z0-9])")),
    ("a private key", re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----")),
)

BOOLEAN_WORDS = frozenset({"", "0", "1", "true", "false", "yes", "no", "on", "off", "none", "null"})
K8S_REF = re.compile(r"^\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)$")
SHELL_REF = re.compile(r"^\$(\{[A-Za-z_][A-Za-z0-9_]*\}|[A-Za-z_][A-Za-z0-9_]*)$")
SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ash", "ksh", "mksh", "yash", "posh", "busybox"})
VALUE_FROM_KINDS = ("secretKeyRef", "configMapKeyRef", "fieldRef", "resourceFieldRef")
MAX_FINDINGS_SHOWN = 8
TOO_DEEP = ("nests deeper than %d levels, too deep to be checked for credentials, so it is refused; pass a "
            "flatter value" % MAX_DEPTH)


def _depth(obj, limit=MAX_DEPTH):
    """Nesting of dicts/lists in ``obj``, counted without recursion; stops (returning ``limit + 1``) once over
    ``limit``."""
    deepest, stack = 0, [(obj, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children = node.values()
        elif isinstance(node, (list, tuple)):
            children = node
        else:
            continue
        if depth > limit:
            return limit + 1
        deepest = max(deepest, depth)
        stack.extend((v, depth + 1) for v in children)
    return deepest


def normal_name(name):
    """``api-key`` / ``Aws_Secret_Access_Key`` -> ``API_KEY`` / ``AWS_SECRET_ACCESS_KEY``."""
    return re.sub(r"[^A-Z0-9]+", "_", str(name).upper()).strip("_")


def is_credential_name(name):
    """True when an env variable, flag (without dashes) or JSON key of this name holds a credential."""
    n = normal_name(name)
    if not n or n in NOT_CREDENTIALS:
        return False
    return (n.rsplit("_", 1)[-1] in CREDENTIAL_WORDS or n in CREDENTIAL_NAMES
            or any(n.endswith("_" + c) for c in CREDENTIAL_NAMES))  # X-AWS-Access-Key-Id, MY_S3_ACCESS_KEY_ID


#: HTTP request headers that carry credentials whatever their value looks like: ``Authorization`` and
#: ``Proxy-Authorization`` (RFC 9110 sections 11.6.2 and 11.7.2) and ``Cookie`` (RFC 6265 section 5.4).
CREDENTIAL_HEADERS = frozenset({"AUTHORIZATION", "PROXY_AUTHORIZATION", "COOKIE"})


def is_credential_header(name):
    """True when an HTTP header of this name carries a credential: one of :data:`CREDENTIAL_HEADERS`, or a name
    that is a credential name (``X-Api-Key``, ``X-Auth-Token``)."""
    return normal_name(name) in CREDENTIAL_HEADERS or is_credential_name(name)


#: Query (or fragment) parameters that carry a credential although their name is not a credential name: Azure
#: shared access signatures (``sig``), AWS SigV4 presigned URLs (``X-Amz-Signature``, ``X-Amz-Credential``) and
#: the generic ``auth``. Every credential name (``token``, ``api_key``, ``access_token``, ``key``, ``password``)
#: and every credential header name count too (:func:`is_credential_query_key`).
CREDENTIAL_QUERY_KEYS = frozenset({"SIG", "SIGNATURE", "X_AMZ_SIGNATURE", "X_AMZ_CREDENTIAL", "AUTH"})

#: ``scheme://`` as RFC 3986 writes a scheme (any case); what follows up to ``/ ? #`` is the authority.
_SCHEME_AUTHORITY = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")
_AUTHORITY_END = re.compile(r"[/?#\\]")
#: ``NAME=value`` as a shell assignment or a ``--header`` pair writes it (``HF_TOKEN=x``, ``X-Api-Key=x``).
_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_.\-]*)=(.*)$", re.S)
#: ``Name: value`` as ``curl -H`` writes a header.
_HEADER_LINE = re.compile(r"^([A-Za-z][A-Za-z0-9-]*):[ \t]*(.+)$", re.S)
#: Shorter parts of a credential are not masked on their own (a one-letter mask would garble every message).
MIN_MASKED = 3


def is_credential_query_key(name):
    """True when a URL query (or fragment) parameter of this name carries a credential."""
    return is_credential_header(name) or normal_name(name) in CREDENTIAL_QUERY_KEYS


def split_userinfo(value):
    """``(before, userinfo, after)`` of a URL written with credentials (whitespace removed), else None.

    Whitespace and the case of the scheme do not matter (`` HTTP://u:p@h``, ``hTTps://u@h``); without a scheme
    the text up to the first ``/ ? #`` is taken as the authority (``u:p@h:80``), as a client that adds ``http://``
    in front would."""
    if not isinstance(value, str):
        return None
    text = "".join(value.split())
    m = _SCHEME_AUTHORITY.match(text)
    start = m.end() if m else (2 if text.startswith("//") else 0)
    authority = _AUTHORITY_END.split(text[start:], 1)[0]
    if "@" not in authority:
        return None
    userinfo = authority.rsplit("@", 1)[0]
    return text[:start], userinfo, text[start + len(userinfo) + 1:]


def url_userinfo(value):
    """The credentials written in a URL (``user:password`` of ``scheme://user:password@host``), or None."""
    parts = split_userinfo(value)
    return parts[1] if parts else None


def _plain(value):
    """True when ``value`` is plain text, not empty, a boolean word or a reference (``$NAME``, ``$(NAME)``,
    ``${NAME}``, ``$(cat /run/secrets/x)``: the shell or Kubernetes puts the value in)."""
    text = str(value).strip()
    return bool(text) and text.lower() not in BOOLEAN_WORDS and not text.startswith("$")


def credential_in_url(value):
    """``[(where, secret)]`` for every credential written in the URL ``value``; ``[]`` when it has none.

    ``where`` says which part (``user:password@ before the host``, ``the query parameter token``, ``the
    fragment parameter access_token``, ``a Hugging Face access token``), ``secret`` is the text as written
    (for masking; never shown). Query and fragment parameters count by :func:`is_credential_query_key`, so
    ``?token=``, ``?api_key=``, ``?access_token=``, ``?key=``, ``?sig=`` and ``?password=`` are found the way an
    environment variable of that name is; a token-shaped value counts wherever it is.
    """
    if not isinstance(value, str):
        return []
    found = []
    userinfo = url_userinfo(value)
    if userinfo is not None:
        found.append(("user:password@ before the host", userinfo))
    text = "".join(value.split())
    rest, dummy, fragment = text.partition("#")
    query = rest.partition("?")[2]
    for part, where in ((query, "query"), (fragment, "fragment")):
        if "=" not in part:
            continue
        for pair in re.split(r"[&;]", part):
            key, dummy2, val = pair.partition("=")
            key = unquote(key.replace("+", " "))
            if is_credential_query_key(key) and _plain(unquote(val)):
                found.append(("the %s parameter %s" % (where, key), val))
    shape = _token_match(unquote(text))
    if shape and not any(shape[1] in unquote(s) for dummy3, s in found):
        found.append((shape[0], shape[1]))
    return found


def secrets_of(text):
    """What must not be shown of a credential ``text``: itself (as written and percent-decoded) and, for a
    ``user:password``, each part of at least :data:`MIN_MASKED` characters."""
    found = set()
    for t in (text, unquote(text)):
        if t:
            found.add(t)
        for part in t.split(":", 1):
            if len(part) >= MIN_MASKED:
                found.add(part)
    return found


def credential_words(argv):
    """``[(index, name, value)]`` for every ``NAME=value`` word of ``argv`` that sets a credential in plain text.

    ``NAME`` is a credential name or a credential header name (``HF_TOKEN=...`` after ``env`` or ``export``,
    ``Authorization=Bearer ...`` after ``--header``); the value is plain unless it is empty, a boolean word or
    a reference the shell or Kubernetes expands (``$VAR``, ``$(NAME)``, ``$(cat /run/secrets/x)``). A shell's
    script (``bash -c "export OPENAI_API_KEY=...; ..."``) is split into words first (:func:`command_words`).
    """
    out = []
    for i, word in enumerate(command_words(argv)[0]):
        m = _ASSIGNMENT.match(word) if isinstance(word, str) else None
        if m and is_credential_header(m.group(1)) and _plain(m.group(2)):
            out.append((i, m.group(1), m.group(2)))
    return out


def _script_words(script):
    """The words of a shell script, its operators (``;``, ``&&``, ``|``) split off; quotes removed."""
    lexer = shlex.shlex(script, posix=True, punctuation_chars=";&|()<>")
    lexer.whitespace_split = True
    lexer.commenters = ""
    try:
        return list(lexer)
    except ValueError:
        return script.split()


def command_words(command, field="command"):
    """``(words, fields)`` of an entrypoint with its arguments: a shell's script (``sh -c '...'``, any argument
    with a space or a newline after a shell) becomes its words; ``fields`` names where each came from."""
    command = list(command or [])
    shell = bool(command) and isinstance(command[0], str) and command[0].rsplit("/", 1)[-1] in SHELLS
    words, fields = [], []
    for i, tok in enumerate(command):
        if shell and isinstance(tok, str) and i > 0 and tok != "-c" and (" " in tok or "\n" in tok or "=" in tok):
            parts = _script_words(tok)
            words += parts
            fields += ["%s[%d] (script)" % (field, i)] * len(parts)
        else:
            words.append(tok)
            fields.append("%s[%d]" % (field, i))
    return words, fields


def why_credential_name(name):
    """Why ``name`` is a credential name, for messages (``"the name ends in TOKEN"``)."""
    n = normal_name(name)
    known = [c for c in CREDENTIAL_NAMES if n == c or n.endswith("_" + c)]
    if known and n.rsplit("_", 1)[-1] not in CREDENTIAL_WORDS:
        return "%s is a credential name" % known[0]
    return "the name ends in %s" % n.rsplit("_", 1)[-1]


def token_shape(value):
    """The kind of token ``value`` contains (``"a Hugging Face access token"``), or None."""
    found = _token_match(value)
    return found[0] if found else None


def _token_match(value):
    """``(kind, matched text)`` of the first token shape in ``value``, or None."""
    if not isinstance(value, str):
        return None
    for what, pattern in TOKEN_SHAPES:
        m = pattern.search(value)
        if m:
            return what, m.group(0)
    return None


def credential_flag(option):
    """The canonical credential flag ``option`` (``--api_key``, ``--api-k``, ``--hf-token``) names, or None.

    A flag named like a credential (``--admin-api-key``, ``--db-password``) is one too; vLLM's dotted JSON
    flags (``--kv-transfer-config.kv_connector_extra_config.secret_key``) count by their last key.
    """
    if not option.startswith("--") or len(option) < 3:
        return None
    name = option[2:].lower().replace("_", "-")
    head = name.split(".", 1)[0]
    for flag in CREDENTIAL_FLAGS:
        if "--" + head == flag or (len(head) >= 3 and flag.startswith("--" + head) and "." not in name):
            return flag
    if any(is_credential_name(part) for part in name.split(".")):
        return "--" + head
    return None


class Finding(object):
    """One plain-text credential (or broken reference): ``field`` and ``why``; ``value`` is never shown."""

    __slots__ = ("field", "why", "value")

    def __init__(self, field, why, value=None):
        self.field = field
        self.why = why
        self.value = value

    def __repr__(self):
        return "Finding(%r, %r)" % (self.field, self.why)


class Scan(object):
    """Collects findings over everything a renderer puts into containers; :meth:`refuse` raises them.

    ``refs`` maps env names to ``"secret"`` (``valueFrom``) or ``"plain"`` (``value``): a credential written
    as ``$(NAME)`` is accepted only when ``NAME`` comes from ``valueFrom``.
    """

    def __init__(self, env_field="env"):
        self.findings = []
        self.refs = {}
        self.env_field = env_field

    # ---- values ---------------------------------------------------------------------------------- #

    def _value(self, field, value, why_plain):
        """Check a value that must not be plain text (it sits under a credential name or flag)."""
        if value is None or isinstance(value, bool):
            return
        if isinstance(value, (dict, list)):
            if _depth(value) > MAX_DEPTH:
                self.findings.append(Finding(field, TOO_DEEP))
                return
            value = json.dumps(value, sort_keys=True)
        value = str(value)
        if value.strip().lower() in BOOLEAN_WORDS or SHELL_REF.match(value):
            return
        ref = K8S_REF.match(value)
        if not ref and value.strip().startswith("$"):
            return  # a shell expansion (${NAME:-}, $(cat /run/secrets/x)): the value comes from elsewhere
        if ref:
            kind = self.refs.get(ref.group(1))
            if kind is None:
                self.findings.append(Finding(field, "takes $(%s) but %s has no entry %s, so Kubernetes passes the "
                                             "text '$(%s)' unexpanded" % ((ref.group(1), self.env_field) + (ref.group(1),) * 2)))
            elif kind == "plain":
                self.findings.append(Finding(field, "takes $(%s) from %s.%s, which has a plain-text value"
                                             % (ref.group(1), self.env_field, ref.group(1))))
            return
        self.findings.append(Finding(field, why_plain, value))

    def _shape(self, field, value):
        found = _token_match(value)
        if found:
            self.findings.append(Finding(field, "holds %s" % found[0], found[1]))

    def _json_keys(self, field, obj, path=""):
        """Credential-named keys with string values inside a JSON flag value, walked without recursion.

        Returns False (with a finding) when ``obj`` nests deeper than ``MAX_DEPTH``: it is refused, not passed
        unchecked (and never serialised, which would recurse)."""
        if _depth(obj) > MAX_DEPTH:
            self.findings.append(Finding(field, TOO_DEEP))
            return False
        stack = [(obj, path)]
        while stack:
            node, at = stack.pop()
            if isinstance(node, dict):
                items = []
                for k, v in node.items():
                    sub = "%s.%s" % (at, k) if at else str(k)
                    if isinstance(v, (dict, list)):
                        items.append((v, sub))
                    elif isinstance(v, str) and is_credential_name(k):
                        self._value("%s (%s)" % (field, sub), v, "plain-text value of the JSON key %s" % sub)
                stack.extend(reversed(items))
            elif isinstance(node, list):
                stack.extend(reversed([(v, "%s[%d]" % (at, i)) for i, v in enumerate(node)]))
        return True

    # ---- inputs ---------------------------------------------------------------------------------- #

    def env(self, entries, field="env", error=ValueError):
        """Validate Kubernetes env entries (``name`` with ``value`` or ``valueFrom``) and scan them.

        Structural problems raise ``error`` at once; credentials are collected. Scalar values become
        strings (the schema wants strings); returns the normalised entries.
        """
        if not isinstance(entries, list):
            raise error("%s: must be a list of {name, value} or {name, valueFrom} entries" % field)
        out = []
        for i, item in enumerate(entries):
            if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item.get("name"):
                raise error("%s[%d]: each entry needs a 'name' (a string)" % (field, i))
            name = item["name"]
            where = "%s.%s" % (field, name)
            unknown = sorted(set(item) - {"name", "value", "valueFrom"})
            if unknown:
                raise error("%s: unknown field(s) %s; an env entry has name and value or valueFrom" % (where, ", ".join(unknown)))
            if "value" in item and "valueFrom" in item:
                raise error("%s: set either value or valueFrom, not both" % where)
            entry = dict(item)
            if "valueFrom" in item:
                ref = item["valueFrom"]
                kinds = [k for k in VALUE_FROM_KINDS if isinstance(ref, dict) and k in ref]
                if not isinstance(ref, dict) or len(kinds) != 1 or len(ref) != 1:
                    raise error("%s: valueFrom must hold exactly one of %s" % (where, ", ".join(VALUE_FROM_KINDS)))
                if kinds[0] in ("secretKeyRef", "configMapKeyRef"):
                    sel = ref[kinds[0]]
                    if not isinstance(sel, dict) or not all(isinstance(sel.get(k), str) and sel.get(k) for k in ("name", "key")):
                        raise error("%s: valueFrom.%s needs the %s's name and key: {name: <%s>, key: <key>}"
                                    % (where, kinds[0], kinds[0][:-6], kinds[0][:-6]))
                self.refs[name] = "secret" if kinds[0] == "secretKeyRef" else "ref"
            else:
                value = item.get("value", "")
                if isinstance(value, (dict, list)):
                    raise error("%s: value must be a string, number or boolean, not a %s" % (where, type(value).__name__))
                if isinstance(value, bool):
                    value = "true" if value else "false"
                elif value is None:
                    value = ""
                entry["value"] = str(value)
                self.refs[name] = "plain"
            out.append(entry)
        for entry in out:
            if "value" in entry:
                self._env_value("%s.%s" % (field, entry["name"]), entry["name"], entry["value"])
        return out

    def mapping(self, mapping, field):
        """``{NAME: value}`` rendered as plain env values (``kernel_cache_env``)."""
        for name, value in sorted((mapping or {}).items()):
            self.refs.setdefault(name, "plain")
        for name, value in sorted((mapping or {}).items()):
            self._env_value("%s.%s" % (field, name), name, value)

    def _env_value(self, field, name, value):
        if is_credential_name(name):
            self._value(field, value, "%s and the value is plain text" % why_credential_name(name))
        else:
            self._shape(field, value)

    def flags(self, flags, field="engine_args"):
        """``{flag: value}`` turned into ``--flag value`` (True = bare flag, dicts become JSON)."""
        for flag, value in (flags or {}).items():
            where = "%s.%s" % (field, flag)
            option = flag if str(flag).startswith("-") else "--" + str(flag)
            if credential_flag(option):
                if value is not True:
                    self._value(where, value, "plain-text value of the credential flag %s" % option)
                continue
            if isinstance(value, (dict, list)):
                if not self._json_keys(where, value):
                    continue
                value = json.dumps(value)
            elif isinstance(value, str):
                self._json_arg(where, value)
            self._shape(where, value)

    def argv(self, argv, field, fields=None):
        """An argument list: credential flags (``--api-key x``, ``--api-key=x``), JSON values, token shapes.

        ``fields`` names each token (default ``field[i]``).
        """
        pending = None
        for i, tok in enumerate(argv or []):
            if not isinstance(tok, str):
                continue
            where = fields[i] if fields else "%s[%d]" % (field, i)
            if tok.startswith("-") and len(tok) > 1 and not _is_number(tok):
                pending = None
                option, sep, value = tok.partition("=")
                flag = credential_flag(option)
                if flag and sep:
                    self._value(where, value, "plain-text value of %s" % flag)
                elif flag:
                    pending = flag
                elif sep:
                    self._word(where, value)
                continue
            if pending:
                self._value(where, tok, "plain-text value of %s" % pending)
                if pending not in MULTI_VALUE_FLAGS:
                    pending = None
                continue
            self._word(where, tok)

    def _word(self, where, tok):
        """One word that is not a credential flag's value: ``NAME=value`` and ``Name: value`` (a credential name
        or header), a URL (:func:`credential_in_url`), JSON, token shapes."""
        m = _ASSIGNMENT.match(tok) or _HEADER_LINE.match(tok)
        if m and is_credential_header(m.group(1)):
            self._value(where, m.group(2), "%s is set to a plain-text value (%s)"
                        % (m.group(1), why_credential_name(m.group(1)) if is_credential_name(m.group(1))
                           else "a header that carries credentials"))
            return
        if "://" in tok or tok.startswith("//"):
            found = credential_in_url(tok)
            for what, secret in found:
                self.findings.append(Finding(where, "a URL with a credential in it (%s)" % what, secret))
            if found:
                return
        self._json_arg(where, tok)
        self._shape(where, tok)

    def _json_arg(self, where, text):
        """A JSON object or array given as text: its credential-named keys are checked at any depth the shared
        reader accepts; deeper (or larger) JSON is refused as a finding, never skipped."""
        text = text.strip()
        if not text.startswith(("{", "[")):
            return
        try:
            obj = loads_json(text, where)
        except UntrustedInput as e:
            if e.limit in ("depth", "size"):
                self.findings.append(Finding(where, TOO_DEEP if e.limit == "depth" else
                                             "is JSON too large to be checked for credentials, so it is refused"))
                return
            if e.limit != "number":
                return  # not JSON: scanned as text (token shapes) by the caller
            # numbers out of range do not hide keys: read them as text (the depth is already within the cap)
            obj = json.loads(text, parse_int=str, parse_float=str, parse_constant=str)
        self._json_keys(where, obj)

    def command(self, command, field="command"):
        """An entrypoint (with its arguments); a shell script is split into words and scanned like arguments."""
        if not command or not isinstance(command, list):
            return
        words, fields = command_words(command, field)
        self.argv(words, field, fields)

    # ---- built objects --------------------------------------------------------------------------- #

    def objects(self, objects, field="objects"):
        """Last net over the built objects: env of every container and token shapes in every string (an object
        nested deeper than ``MAX_DEPTH`` cannot be walked and is refused as a finding)."""
        for i, obj in enumerate(objects or []):
            kind = obj.get("kind", "?") if isinstance(obj, dict) else "?"
            name = (obj.get("metadata") or {}).get("name", "?") if isinstance(obj, dict) else "?"
            head = "%s[%d] %s/%s" % (field, i, kind, name)
            if _depth(obj) > MAX_DEPTH:
                self.findings.append(Finding(head, TOO_DEEP))
                continue
            self._walk(head, obj, "")

    def _walk(self, head, node, path):
        if isinstance(node, dict):
            if isinstance(node.get("containers"), list):
                for key in ("initContainers", "containers"):
                    for j, c in enumerate(node.get(key) or []):
                        if isinstance(c, dict):
                            self._container("%s %s%s[%d]" % (head, path + "." if path else "", key, j), c)
            for k, v in node.items():
                if k in ("containers", "initContainers") and isinstance(node.get("containers"), list):
                    continue
                self._walk(head, v, "%s.%s" % (path, k) if path else str(k))
        elif isinstance(node, list):
            for j, v in enumerate(node):
                self._walk(head, v, "%s[%d]" % (path, j))
        elif isinstance(node, str):
            self._shape("%s %s" % (head, path), node)

    def _container(self, where, c):
        saved, self.refs = self.refs, {}
        for e in c.get("env") or []:
            if isinstance(e, dict) and isinstance(e.get("name"), str):
                self.refs[e["name"]] = ("secret" if "secretKeyRef" in (e.get("valueFrom") or {})
                                        else "ref" if "valueFrom" in e else "plain")
        for e in c.get("env") or []:
            if isinstance(e, dict) and "value" in e and isinstance(e.get("name"), str):
                self._env_value("%s.env.%s" % (where, e["name"]), e["name"], e["value"])
        self.command(list(c.get("command") or []) + list(c.get("args") or []), "%s.command+args" % where)
        rest = dict((k, v) for k, v in c.items() if k not in ("env", "command", "args"))
        self._walk(where, rest, "")
        self.refs = saved

    # ---- outcome --------------------------------------------------------------------------------- #

    def secret_values(self):
        return sorted({f.value for f in self.findings if f.value})

    def message(self, hint=None):
        seen, shown = set(), []
        for f in self.findings:
            key = (f.field, f.why)
            if key not in seen:
                seen.add(key)
                shown.append(f)
        fields = []
        for f in shown:
            if f.field not in fields:
                fields.append(f.field)
        listed = ", ".join(fields[:MAX_FINDINGS_SHOWN])
        if len(fields) > MAX_FINDINGS_SHOWN:
            listed += " and %d more" % (len(fields) - MAX_FINDINGS_SHOWN)
        if len(shown) == 1:
            why = shown[0].why
        else:
            why = "; ".join("%s: %s" % (f.field, f.why) for f in shown[:MAX_FINDINGS_SHOWN])
        text = ("%s: plain-text credential%s (%s) would be written into the rendered manifests, which are stored in "
                "Git and shown by kubectl get -o yaml. Keep credentials in a Kubernetes Secret and reference it: "
                "an %s entry {name: HF_TOKEN, valueFrom: {secretKeyRef: {name: <secret>, key: <key>}}}; for an "
                "argument, put the Secret in %s and write the argument as --api-key=$(API_KEY) (Kubernetes "
                "expands $(VAR) in command and args), or use the variable the engine reads (VLLM_API_KEY for "
                "vLLM's --api-key, HF_TOKEN for --hf-token)"
                % (listed, "s" if len(fields) > 1 else "", why, self.env_field, self.env_field))
        if hint:
            text += "; " + hint
        return text

    def refuse(self, error=ValueError, hint=None):
        """Raise ``error`` (message without values, ``secret_values`` attached) when anything was found."""
        if not self.findings:
            return
        e = error(self.message(hint))
        e.secret_values = self.secret_values()
        raise e


def _is_number(tok):
    try:
        float(tok)
    except ValueError:
        return False
    return True


def command_credentials(command, field="command"):
    """``(values, fields)``: the plain-text credentials written in ``command`` (``--api-key X``, ``HF_TOKEN=X``
    after ``env`` or ``export`` in a shell's script, a URL with ``user:password@`` or ``?token=``, a token-shaped
    word) by :meth:`Scan.command`, and the fields that hold them."""
    scan = Scan()
    scan.command(list(command or []), field)
    fields = []
    for f in scan.findings:
        if f.value and f.field not in fields:
            fields.append(f.field)
    return scan.secret_values(), fields


def hide_command_credentials(module, *options):
    """Add the credentials written in the command options ``options`` of ``module`` to its ``no_log_values``, so
    that neither the result nor its ``invocation`` shows them (:func:`command_credentials`); returns the fields
    that hold some, for a warning."""
    fields = []
    for name in options:
        values, where = command_credentials(module.params.get(name), name)
        for value in values:
            module.no_log_values.update(secrets_of(value))
        fields += where
    return fields


def unmask_rendered_options(module, names):
    """Keep ``names`` out of the target's log (their argument spec says ``no_log``) without hiding them.

    ``no_log`` on an option also masks each of its values in the whole result, so an env value ``1`` or an
    argument ``--enforce-eager`` would turn into ``********`` inside the rendered objects. The renderers
    refuse credentials in these options, so their values are rendered and returned as they are; only what
    :meth:`Scan.refuse` reports as a credential is masked (the module adds ``secret_values``).
    """
    for name in names:
        for value in _leaves(module.params.get(name)):
            module.no_log_values.discard(value)


def _leaves(obj):
    """Scalar leaves of ``obj`` as text, walked without recursion."""
    stack = [obj]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, (list, tuple)):
            stack.extend(node)
        elif isinstance(node, bool) or node is None:
            continue
        elif isinstance(node, (int, float)):
            yield str(node)
        elif isinstance(node, str) and node:
            yield node


def redact_rendered_text(text):
    """``text`` of a previously rendered file, or a notice when it holds a credential (never shown by diff)."""
    if not text:
        return text
    try:
        from ansible.module_utils.common.yaml import HAS_YAML
    except ImportError:  # pragma: no cover - very old ansible-core
        HAS_YAML = False
    scan = Scan()
    if HAS_YAML:
        try:
            docs = [d for d in loads_yaml(text, "document", all_documents=True) if isinstance(d, dict)]
        except UntrustedInput as e:
            if e.limit != "syntax" or "YAML alias" in str(e):
                # too deep, numbers out of range, YAML aliases (a walk could fan out without end): it cannot
                # be checked, so it is not shown
                return ("# (previous content not shown: it could not be checked for credentials (%s); it is "
                        "replaced now)\n" % e.limit)
            docs = []  # not YAML: only token shapes are looked for
        scan.objects(docs, field="document")
    if not scan.findings and token_shape(text):
        scan.findings.append(Finding("a line of the file", "holds %s" % token_shape(text)))
    if scan.findings:
        return ("# (previous content not shown: it holds a plain-text credential at %s; it is replaced now)\n"
                % ", ".join(sorted({f.field for f in scan.findings})[:MAX_FINDINGS_SHOWN]))
    return text
