"""Service / route names derived from served model names follow the Kubernetes rules AIBrix depends on."""
from __future__ import annotations

import ast
import os
import re

import pytest
from hypothesis import given, settings, strategies as st

from ansible_collections.llmops.serving.plugins.module_utils.kube import _k8s_names as names

DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


@pytest.mark.parametrize(
    "model, spelling",
    [
        ("glm-5.2-fp8-vllm", "glm-5-2-fp8-vllm"),
        ("glm-5.2-fp8-sglang-test", "glm-5-2-fp8-sglang-test"),
        ("Qwen2.5-7B-Instruct", "qwen2-5-7b-instruct"),
        ("qwen3-8B", "qwen3-8b"),
        ("deepseek-ai/DeepSeek-V3", "deepseek-ai-deepseek-v3"),
        ("llama__3..1", "llama-3-1"),
        ("7b-chat", "m-7b-chat"),
        ("-.glm.-", "glm"),
    ],
)
def test_a_lossy_spelling_carries_the_hash_of_the_served_name(model, spelling):
    assert names.service_name(model) == "%s-%s" % (spelling, names.short_hash(model))
    assert names.is_dns1035_label(names.service_name(model))


@pytest.mark.parametrize("model", ["already-valid", "glm-5-2-fp8-vllm", "qwen3-8b", "z"])
def test_a_valid_served_name_is_its_own_service_name(model):
    assert names.service_name(model) == model


def test_two_served_names_with_one_spelling_render_different_objects():
    """The defect: ``glm-5.2-fp8`` and ``glm-5-2-fp8`` were both Service/Deployment ``glm-5-2-fp8``, so applying the
    second model overwrote the first one's objects."""
    a, b = names.object_names("glm-5.2-fp8"), names.object_names("glm-5-2-fp8")
    assert a["service"] != b["service"] and b["service"] == "glm-5-2-fp8"
    assert all(a[k] != b[k] for k in a), (a, b)


@pytest.mark.parametrize("model", ["foo-prefill", "foo-decode", "foo-pd-proxy", "foo-sglang-router",
                                   "foo-0123abcd"])
def test_a_valid_name_that_reads_like_a_derived_one_is_tagged(model):
    """``foo-prefill`` kept as it is would be the prefill Deployment of the model ``foo``; ``foo-0123abcd`` a tagged
    name of another model."""
    assert not names.kept_as_is(model)
    assert names.service_name(model) == "%s-%s" % (model, names.short_hash(model))
    assert names.service_name(model) not in names.object_names("foo").values()


@pytest.mark.parametrize(
    "model",
    ["glm-5.2-fp8-vllm", "A" * 200, "x." * 40, "9" * 70, "模型-v1", "...", "a-" * 40, "Z", "café-1.0"],
)
def test_service_name_always_valid_dns1035(model):
    derived = names.service_name(model)
    assert DNS1035.match(derived), derived
    assert len(derived) <= 63


def test_long_names_are_cut_with_a_stable_hash_suffix():
    a = "glm-5.2-fp8-" + "x" * 80 + "-vllm"
    b = "glm-5.2-fp8-" + "x" * 80 + "-sglang"
    sa, sb = names.service_name(a), names.service_name(b)
    assert len(sa) == 63 and len(sb) == 63
    assert sa != sb, "two long names sharing a prefix must not collide"
    assert sa.endswith("-" + names.short_hash(a))
    assert names.service_name(a) == sa  # deterministic


def test_short_valid_names_get_no_hash():
    assert names.service_name("glm-5-2-fp8-vllm") == "glm-5-2-fp8-vllm"
    assert names.object_name("glm-5-2-fp8-vllm", "prefill") == "glm-5-2-fp8-vllm-prefill"


def test_route_name_keeps_the_aibrix_convention():
    assert names.route_name("glm-5.2-fp8-vllm") == "glm-5.2-fp8-vllm-router"


def test_route_name_refuses_uppercase_with_explanation():
    with pytest.raises(ValueError, match="DNS-1123 subdomain.*lowercase"):
        names.route_name("Qwen3-8B")


def test_check_model_name_label_value_rules():
    assert names.check_model_name("glm-5.2-fp8-vllm") == []
    problems = names.check_model_name("org/model")
    assert any("label value" in p for p in problems)
    assert names.check_model_name("m" * 64)


def test_validators():
    assert names.is_dns1123_subdomain("glm-5.2-fp8-vllm-router")
    assert not names.is_dns1123_subdomain("glm-5.2-.router")
    assert not names.is_dns1035_label("glm-5.2")
    assert not names.is_dns1035_label("1abc")
    assert names.is_label_value("Qwen2.5_7B")
    assert not names.is_label_value("a/b")


def test_reference_grant_name_is_bounded():
    name = names.reference_grant_name("s" * 63, "aibrix-system")
    assert len(name) <= 63 and names.is_dns1123_subdomain(name)
    assert names.reference_grant_name("glm-5-2-fp8-vllm", "aibrix-system") == "glm-5-2-fp8-vllm-from-aibrix-system"


@pytest.mark.parametrize("name", ["glm-5-2-fp8-vllm", "m-" + "x" * 60, "glm-5-2-fp8-" + "y" * 40])
def test_statefulset_safe_name_leaves_room_for_group_and_revision_hash(name):
    # LeaderWorkerSet worker StatefulSet <lws>-<group>; StatefulSet pods get controller-revision-hash=<sts>-<10 hex>,
    # a label value (at most 63 characters)
    safe = names.statefulset_safe_name(name)
    assert names.is_dns1035_label(safe)
    assert len("%s-%d-%s" % (safe, 99999, "a" * 10)) <= 63
    if len(name) <= names.STATEFULSET_BASE_MAX:
        assert safe == name
    else:
        assert safe != names.statefulset_safe_name(name + "z")  # hashed, still distinct


# --------------------------------------------------------------------------------------------- #
# Every derived name: valid, within 63 characters with every suffix, and one model's own
# --------------------------------------------------------------------------------------------- #

# k8s.io/apimachinery pkg/util/validation/validation.go: dns1035LabelFmt "[a-z]([-a-z0-9]*[a-z0-9])?",
# DNS1035LabelMaxLength 63 (IsDNS1035Label), DNS1123LabelMaxLength 63 (IsDNS1123Label)
DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# served names as they come: label values (what AIBrix reads from model.aibrix.ai/name), and any text
LABEL_VALUE_TEXT = st.from_regex(r"\A[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?\Z")
SERVED = st.one_of(LABEL_VALUE_TEXT, st.text(min_size=1, max_size=120),
                   st.builds(lambda a, s: a + "-" + s, LABEL_VALUE_TEXT, st.sampled_from(names.ROLE_SUFFIXES + ("0123abcd",))))


def storm_pod_hostname(storm, role="prefill", index=99):
    """The hostname AIBrix v0.7.0 gives a stateful role's pod: ``<storm>-roleset-<5 from the API server>-<role>-
    <templateHash: at most 10>-<index>`` (pkg/controller/stormservice/rolesetoperations.go renderRoleSet GenerateName,
    pkg/controller/roleset/utils.go renderStormServicePod ``pod.Spec.Hostname = pod.Name``)."""
    return "%s-roleset-abcde-%s-%s-%d" % (storm, role, "b" * 10, index)


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(a=SERVED, b=SERVED)
def test_property_two_served_names_never_share_an_object_name(a, b):
    na, nb = names.object_names(a), names.object_names(b)
    for n in list(na.values()) + list(nb.values()):
        assert names.is_dns1035_label(n) and DNS1035.match(n) and len(n) <= 63, n
    if a != b:
        # names are unique per kind and namespace: any two names of one model against the other's, same kind
        # (a Service of one is never the Deployment a role of the other uses, and so on)
        assert not set(na.values()) & set(nb.values()), (a, b, na, nb)
    assert names.object_names(a) == na  # stable


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(served=SERVED)
def test_property_storm_service_pods_get_hostnames_of_63_characters(served):
    storm = names.stormservice_name(served)
    for role in ("prefill", "decode"):
        host = storm_pod_hostname(storm, role)
        assert DNS1123.match(host) and len(host) <= 63, host


def test_a_long_storm_service_name_is_cut_to_fit_the_pod_hostnames():
    """m9: qwen3-235b-a22b-instruct-2507-fp8-pd gave ~71-character pod hostnames, which the API server rejects."""
    served = "qwen3-235b-a22b-instruct-2507-fp8-pd"
    assert len(storm_pod_hostname(served)) > 63
    storm = names.stormservice_name(served)
    assert len(storm) == names.STORMSERVICE_NAME_MAX == 27 and storm.endswith("-" + names.short_hash(served))
    assert len(storm_pod_hostname(storm)) == 63
    assert names.stormservice_name("glm-5-2-fp8") == "glm-5-2-fp8"


# --------------------------------------------------------------------------------------------- #
# Cannot bypass: no file derives a Kubernetes name but _k8s_names
# --------------------------------------------------------------------------------------------- #

PLUGINS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "..", "..", "plugins")
OWNER = os.path.join("module_utils", "kube", "_k8s_names.py")
#: file -> why it may build a name itself
ALLOWED = {
    # a Job per round, "bench-<round index>-<target>": the round index makes it unique within a plan, and bench/
    # may not import kube/ (tests/unit/test_layout.py)
    os.path.join("module_utils", "bench", "_bench_job.py"): "the round index names it",
}
#: helpers that take an object name as their first argument
NAMED = {"_meta", "_deployment", "_service"}


def _is_formatted(node):
    """A string built here: ``"%s-x" % y``, ``a + "-x"``, an f-string, ``"{}".format(...)``, ``"-".join(...)``."""
    if isinstance(node, ast.JoinedStr):
        return True
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mod, ast.Add)):
        return True
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("format", "join")
            and isinstance(node.func.value, ast.Constant) and isinstance(node.func.value.value, str))


def _const(node, value=None):
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and (value is None or node.value == value)


#: where Kubernetes objects are rendered: a string rewritten into ``-`` there is a name (elsewhere it is a command-line
#: flag's spelling, cache/_engine_flags, common/_secrets); a built ``metadata.name`` is one anywhere
RENDERERS = (os.path.join("module_utils", "kube"), os.path.join("module_utils", "bench"), "modules", "action")


def name_derivations(path, rel, rewrites=True):
    """``rel:line what`` for each place ``path`` derives a Kubernetes name on its own (``rewrites``: also a string
    rewritten into ``-``)."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    bad = []
    for node in ast.walk(tree):
        if rewrites and isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            fn = node.func.attr
            # s.replace(".", "-") and friends: a rewrite into a name
            if fn == "replace" and len(node.args) == 2 and _const(node.args[1], "-"):
                bad.append("%s:%d .replace(..., '-')" % (rel, node.lineno))
            # re.sub(pattern, "-", ...)
            if fn == "sub" and len(node.args) >= 2 and _const(node.args[1], "-"):
                bad.append("%s:%d re.sub(..., '-', ...)" % (rel, node.lineno))
            # the low-level helper: every caller goes through object_name / service_name / stormservice_name
            if fn == "dns1035_name":
                bad.append("%s:%d dns1035_name()" % (rel, node.lineno))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in NAMED and node.args \
                and _is_formatted(node.args[0]):
            bad.append("%s:%d %s(<built name>)" % (rel, node.lineno, node.func.id))
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if _const(key, "metadata") and isinstance(value, ast.Dict):
                    for k2, v2 in zip(value.keys, value.values):
                        if _const(k2, "name") and _is_formatted(v2):
                            bad.append("%s:%d metadata.name built here" % (rel, v2.lineno))
    return bad


def test_no_file_but_k8s_names_derives_a_kubernetes_name():
    bad = []
    for dirpath, dirnames, filenames in os.walk(os.path.abspath(PLUGINS)):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for n in sorted(filenames):
            if not n.endswith(".py"):
                continue
            path = os.path.join(dirpath, n)
            rel = os.path.relpath(path, os.path.abspath(PLUGINS))
            if rel == OWNER or rel in ALLOWED:
                continue
            bad += name_derivations(path, rel, rewrites=rel.startswith(RENDERERS))
    assert not bad, ("derive Kubernetes names with kube/_k8s_names (object_name, service_name, stormservice_name, "
                     "object_names) so two served names never share an object: %s" % bad)


def test_the_name_scan_sees_each_way_of_building_a_name(tmp_path):
    src = tmp_path / "x.py"
    src.write_text('import re\n'
                   'a = model.replace(".", "-")\n'
                   'b = re.sub(r"[^a-z0-9]+", "-", model)\n'
                   'c = names.dns1035_name(model)\n'
                   'd = _meta("%s-proxy" % base, p)\n'
                   'e = {"metadata": {"name": f"{base}-x", "namespace": ns}}\n'
                   'f = {"metadata": {"name": names.object_name(model), "namespace": ns}}\n'
                   'g = text.replace(secret, "***")\n')
    got = [b.split(" ", 1)[1] for b in name_derivations(str(src), "x.py")]
    assert sorted(got) == sorted([".replace(..., '-')", "re.sub(..., '-', ...)", "dns1035_name()",
                                  "_meta(<built name>)", "metadata.name built here"]), got
