"""Service / route names derived from served model names follow the Kubernetes rules AIBrix depends on."""
from __future__ import annotations

import re

import pytest

from ansible_collections.llmops.serving.plugins.module_utils.kube import _k8s_names as names

DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


@pytest.mark.parametrize(
    "model, expected",
    [
        ("glm-5.2-fp8-vllm", "glm-5-2-fp8-vllm"),
        ("glm-5.2-fp8-sglang-test", "glm-5-2-fp8-sglang-test"),
        ("Qwen2.5-7B-Instruct", "qwen2-5-7b-instruct"),
        ("qwen3-8B", "qwen3-8b"),
        ("deepseek-ai/DeepSeek-V3", "deepseek-ai-deepseek-v3"),
        ("llama__3..1", "llama-3-1"),
        ("7b-chat", "m-7b-chat"),
        ("-.glm.-", "glm"),
        ("already-valid", "already-valid"),
    ],
)
def test_service_name_examples(model, expected):
    assert names.service_name(model) == expected
    assert names.is_dns1035_label(expected)


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


def test_short_names_get_no_hash():
    assert names.service_name("glm-5.2-fp8-vllm") == "glm-5-2-fp8-vllm"


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
