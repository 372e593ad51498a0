"""Credentials never reach rendered files, module results, error messages or the play output.

A fake credential is put everywhere a renderer accepts input that lands in a container; each time the
renderer refuses it naming the field, and the value appears nowhere: not in the message, not in the files,
not in the module's JSON result (``invocation`` included), not in ``ansible-playbook -vvv`` output.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

from unittest import mock

import pytest
import yaml

from ansible_collections.llmops.serving.plugins.module_utils.kube import _k8s_checks
from ansible_collections.llmops.serving.plugins.module_utils.kube import _k8s_engine as k8s
from ansible_collections.llmops.serving.plugins.module_utils.kube import _pd_manifests as pd
from ansible_collections.llmops.serving.plugins.modules import engine_manifests, pd_manifests

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.dirname(__file__)), "..", "..", "..", ".."))
BIN = os.path.dirname(sys.executable)
FAKE = "sk-fake-0a1b2c3d4e5f-llmops"
HF_FAKE = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz01234567"   # the shape of a Hugging Face access token
ENGINE = dict(engine="vllm", served_model_name="glm-5.2-fp8-vllm", namespace="llm-lab",
              model_path="/mnt/nvme/models/GLM-5.2-FP8/v1", image="vllm/vllm-openai:v0.26.0")
PD = dict(model_name="glm-5.2-fp8", image="vllm/vllm-openai:v0.10.1", model_path="/models/glm",
          ucx_net_devices="mlx5_0:1,mlx5_1:1")
SECRET_REF = {"secretKeyRef": {"name": "engine-api", "key": "key"}}


# ---- the name rule, as the renderers apply it --------------------------------------------------- #

CREDENTIAL_NAMES = [
    "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN",             # huggingface_hub/utils/_auth.py reads both
    "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID",
    "S3_SECRET_ACCESS_KEY", "S3_ACCESS_KEY_ID",       # vllm/envs.py
    "VLLM_API_KEY", "OPENAI_API_KEY", "WANDB_API_KEY", "OAUTH_CLIENT_SECRET", "DB_PASSWORD", "hf_token",
]
NOT_CREDENTIALS = [
    # vllm/envs.py tuning knobs with TOKEN inside the name
    "VLLM_MAX_TOKENS_PER_EXPERT_FP4_MOE", "VLLM_MULTI_STREAM_GEMM_TOKEN_THRESHOLD",
    "VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD", "VLLM_MAX_BAD_WORDS_TOTAL_TOKENS",
    # huggingface_hub/constants.py: a path, caches, and a boolean switch ending in TOKEN
    "HF_TOKEN_PATH", "HUGGINGFACE_HUB_CACHE", "HUGGINGFACE_ASSETS_CACHE", "HF_HUB_DISABLE_IMPLICIT_TOKEN",
    "TOKENIZERS_PARALLELISM", "AWS_REGION", "AWS_ENDPOINT_URL", "GOOGLE_APPLICATION_CREDENTIALS", "VLLM_CACHE_ROOT",
]


def test_every_credential_name_is_refused_and_no_setting_is():
    for name in CREDENTIAL_NAMES:
        with pytest.raises(_k8s_checks.SpecError, match=r"^env\.%s: plain-text credential" % name):
            k8s.build(dict(ENGINE, env=[{"name": name, "value": FAKE}]))
    settings = [{"name": n, "value": "/cache/x" if n.endswith(("PATH", "CACHE", "CREDENTIALS")) else "1"}
                for n in NOT_CREDENTIALS]
    b = k8s.build(dict(ENGINE, env=settings))
    rendered = b["objects"][-1]["spec"]["template"]["spec"]["containers"][0]["env"]
    assert [e["name"] for e in rendered] == NOT_CREDENTIALS


def test_credential_flags_are_refused_in_every_spelling_and_other_flags_are_not():
    # vllm/snapshot/runtime.py redacts --api-key/--hf-token values the same way (underscores, abbreviations);
    # --api-key takes several keys (vllm/entrypoints/launchers/cli_args.py api_key: list[str])
    for argv in (["--api-key", FAKE], ["--api_key", FAKE], ["--api-k", FAKE], ["--hf-token", FAKE],
                 ["--admin-api-key=" + FAKE], ["--db-password", FAKE], ["--api-key", "$(K)", FAKE],
                 ["--kv-transfer-config.kv_connector_extra_config.aws_secret_access_key", FAKE]):
        with pytest.raises(_k8s_checks.SpecError, match=r"^extra_args\[%d\]: plain-text credential" % (len(argv) - 1)) as e:
            k8s.build(dict(ENGINE, extra_args=argv, env=[{"name": "K", "valueFrom": SECRET_REF}]))
        assert FAKE not in str(e.value)
    fine = ["--max-num-batched-tokens", "8192", "--tokenizer", "/models/tok", "--ssl-keyfile", "/tls/key.pem",
            "--api-server-count", "4", "--long-prefill-token-threshold", "2048", "--hf-token",
            "--speculative-num-draft-tokens", "4"]
    assert k8s.build(dict(ENGINE, extra_args=fine))["command"][-len(fine):] == fine


# ---- both renderers refuse a credential wherever it can land --------------------------------------- #

ENGINE_CASES = {
    "env value": (dict(env=[{"name": "HF_TOKEN", "value": FAKE}]), "env.HF_TOKEN"),
    "aws session": (dict(env=[{"name": "AWS_SESSION_TOKEN", "value": FAKE}]), "env.AWS_SESSION_TOKEN"),
    "aws key id": (dict(env=[{"name": "AWS_ACCESS_KEY_ID", "value": FAKE}]), "env.AWS_ACCESS_KEY_ID"),
    "token shape under any name": (dict(env=[{"name": "MODEL_DOWNLOAD", "value": HF_FAKE}]), "env.MODEL_DOWNLOAD"),
    "kernel_cache_env": (dict(kernel_cache_env={"VLLM_API_KEY": FAKE}), "kernel_cache_env.VLLM_API_KEY"),
    "engine_args": (dict(engine_args={"api-key": FAKE}), "engine_args.api-key"),
    "engine_args json": (dict(engine_args={"kv-transfer-config": {
        "kv_connector": "LMCacheConnectorV1", "kv_connector_extra_config": {"s3_secret_key": FAKE}}}),
        "engine_args.kv-transfer-config (kv_connector_extra_config.s3_secret_key)"),
    "extra_args pair": (dict(extra_args=["--enforce-eager", "--api-key", FAKE]), "extra_args[2]"),
    "extra_args equals": (dict(extra_args=["--api-key=" + FAKE]), "extra_args[0]"),
    "extra_args underscore": (dict(extra_args=["--api_key", FAKE]), "extra_args[1]"),
    "extra_args abbreviation": (dict(extra_args=["--api-k", FAKE]), "extra_args[1]"),
    "extra_args second key": (dict(extra_args=["--api-key", "$(ENGINE_KEY)", FAKE],
                                   env=[{"name": "ENGINE_KEY", "valueFrom": SECRET_REF}]), "extra_args[2]"),
    "extra_args hf token": (dict(extra_args=["--hf-token", FAKE]), "extra_args[1]"),
    "extra_args dotted": (dict(extra_args=["--kv-transfer-config.kv_connector_extra_config.api_key=" + FAKE]),
                          "extra_args[0]"),
    "command script": (dict(command=["bash", "-c", "ulimit -l unlimited && exec vllm serve --api-key %s \"$@\"" % FAKE,
                                     "vllm"]), "command[2] (script)"),
    "annotation": (dict(annotations={"note": "pull with " + HF_FAKE}), "Deployment/glm-5-2-fp8-vllm"),
}


@pytest.mark.parametrize("case", sorted(ENGINE_CASES))
def test_engine_renderer_refuses_credentials_without_echoing_them(case):
    extra, field = ENGINE_CASES[case]
    with pytest.raises(_k8s_checks.SpecError) as e:
        k8s.build(dict(ENGINE, **extra))
    msg = str(e.value)
    assert field in msg and "secretKeyRef" in msg
    assert FAKE not in msg and HF_FAKE not in msg
    assert set(e.value.secret_values) & {FAKE, HF_FAKE, "pull with " + HF_FAKE}


PD_CASES = {
    "env value": (dict(env=[{"name": "HF_TOKEN", "value": FAKE}]), "env.HF_TOKEN"),
    "extra_args pair": (dict(extra_args=["--api-key", FAKE]), "extra_args[1]"),
    "extra_args equals": (dict(extra_args=["--admin-api-key=" + FAKE]), "extra_args[0]"),
    "token shape": (dict(extra_args=["--hf-overrides", json.dumps({"hub_token": HF_FAKE})]), "extra_args[1]"),
}


@pytest.mark.parametrize("mode", ["stormservice", "deployments"])
@pytest.mark.parametrize("case", sorted(PD_CASES))
def test_pd_renderer_refuses_credentials_without_echoing_them(case, mode):
    extra, field = PD_CASES[case]
    with pytest.raises(_k8s_checks.SpecError) as e:
        pd.build(dict(PD, workload=mode, proxy_source="print('proxy')\n", **extra))
    msg = str(e.value)
    assert msg.startswith(field) and "secretKeyRef" in msg
    assert FAKE not in msg and HF_FAKE not in msg


def test_secret_references_render_and_plain_or_missing_references_do_not():
    env = [{"name": "ENGINE_KEY", "valueFrom": SECRET_REF}, {"name": "HF_HUB_DISABLE_IMPLICIT_TOKEN", "value": "1"},
           {"name": "VLLM_MULTI_STREAM_GEMM_TOKEN_THRESHOLD", "value": "1024"}]
    b = k8s.build(dict(ENGINE, env=env, extra_args=["--api-key", "$(ENGINE_KEY)", "--hf-token"]))
    assert b["command"][-3:] == ["--api-key", "$(ENGINE_KEY)", "--hf-token"]
    objs = pd.build(dict(PD, env=[{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}],
                         extra_args=["--api-key=$(HF_TOKEN)"]))
    c = objs[0]["spec"]["template"]["spec"]["roles"][0]["template"]["spec"]["containers"][0]
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}} in c["env"]
    with pytest.raises(_k8s_checks.SpecError, match=r"extra_args\[1\]: takes \$\(ENGINE_KEY\) from env.ENGINE_KEY, which has "
                                                    r"a plain-text value"):
        k8s.build(dict(ENGINE, env=[{"name": "ENGINE_KEY", "value": FAKE}], extra_args=["--api-key", "$(ENGINE_KEY)"]))
    with pytest.raises(_k8s_checks.SpecError, match=r"extra_args\[0\]: .*env has no entry NOPE.*unexpanded"):
        pd.build(dict(PD, extra_args=["--api-key=$(NOPE)"]))


def test_pd_env_cannot_replace_what_the_renderer_sets():
    with pytest.raises(_k8s_checks.SpecError, match=r"^env: UCX_TLS is set by the collection"):
        pd.build(dict(PD, env=[{"name": "UCX_TLS", "value": "tcp"}]))


# ---- modules: results, invocation, target log, rendered files, diff ---------------------------------- #

def _run_module_process(module, args, tmp_path):
    """Run the module like ansible does on the target (its own process, JSON on stdout)."""
    argfile = tmp_path / "args.json"
    argfile.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": dict(args, _ansible_no_log=False)}))
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, ".build", "pycoll"))
    proc = subprocess.run([sys.executable, "-m", module.__name__, str(argfile)], env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    return json.loads(proc.stdout), proc.stdout + proc.stderr


@pytest.mark.parametrize("module, args", [
    (engine_manifests, dict(ENGINE, env=[{"name": "HF_TOKEN", "value": FAKE}, {"name": "VLLM_LOGGING_LEVEL", "value": "1"}])),
    (engine_manifests, dict(ENGINE, extra_args=["--api-key", FAKE])),
    (pd_manifests, dict(PD, extra_args=["--enforce-eager", "--api-key=" + FAKE])),
])
def test_failed_result_never_contains_the_credential(module, args, tmp_path):
    dest = tmp_path / "out"
    args = dict(args, render_dir=str(dest))
    result, raw = _run_module_process(module, args, tmp_path)
    assert result["failed"] is True and "plain-text credential" in result["msg"]
    assert FAKE not in raw
    assert not dest.exists()


def test_the_target_log_never_gets_env_or_arguments_and_results_keep_them(monkeypatch, capsys):
    """no_log on the rendered options keeps them out of the target's log (journal/syslog), but must not turn an
    env value or an argument into ******** inside the returned objects: the role applies them from the result."""
    from ansible.module_utils import _internal, basic
    from ansible.module_utils.testing import patch_module_args

    logged = []
    monkeypatch.setattr(basic.AnsibleModule, "log", lambda self, msg, log_args=None: logged.append(msg))
    value = "unflagged-setting-value-7f3e"
    results = []
    for module, args in ((engine_manifests, ENGINE), (pd_manifests, PD)):
        args = dict(args, env=[{"name": "MY_SETTING", "value": value}, {"name": "VLLM_LOGGING_LEVEL", "value": "1"}],
                    extra_args=["--enforce-eager"])
        with patch_module_args(args), mock.patch.object(_internal, "is_controller", False):
            with pytest.raises(SystemExit):
                module.main()
        results.append(json.loads(capsys.readouterr().out))
    assert len(logged) == 2 and all("Invoked with" in m for m in logged)
    assert not any(value in m or "--enforce-eager" in m for m in logged)
    for result in results:
        text = json.dumps(result["objects"])
        assert "********" not in text and value in text and "--enforce-eager" in text
        assert '{"name": "VLLM_LOGGING_LEVEL", "value": "1"}' in text


def test_diff_never_shows_a_credential_rendered_before(run_module, tmp_path):
    out = tmp_path / "gitops"
    run_module(engine_manifests, dict(ENGINE, render_dir=str(out)))
    dep = out / "40-deployment-glm-5-2-fp8-vllm-019f2c25.yaml"
    obj = yaml.safe_load(dep.read_text())
    obj["spec"]["template"]["spec"]["containers"][0]["env"] = [{"name": "HF_TOKEN", "value": FAKE}]
    dep.write_text("---\n" + yaml.safe_dump(obj))    # as an older release rendered it
    r = run_module(engine_manifests, dict(ENGINE, render_dir=str(out), hf_token_secret={"name": "hf"}), diff=True)
    assert r["changed"] is True and "40-deployment-glm-5-2-fp8-vllm-019f2c25.yaml" in r["changed_files"]
    assert FAKE not in json.dumps(r)
    assert any("previous content not shown" in d["before"] for d in r["diff"])
    assert FAKE not in dep.read_text()
    # an ordinary previous file is shown as it is
    shown = dep.read_text()
    again = run_module(engine_manifests, dict(ENGINE, render_dir=str(out), hf_token_secret={"name": "hf"},
                                              startup_timeout=5400), diff=True)
    assert [d["before"] for d in again["diff"]] == [shown]


# ---- roles: nothing shows the env or arguments, even with -vvv -------------------------------------- #

def _play(tmp_path, role, extra):
    playbook = tmp_path / ("%s.yml" % role)
    playbook.write_text(yaml.safe_dump([{
        "name": "Render", "hosts": "localhost", "connection": "local", "gather_facts": False,
        "roles": [{"role": "llmops.serving.%s" % role}]}]))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, ".build", "pycoll"),
               ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-tmp"), PATH=BIN + os.pathsep + os.environ.get("PATH", ""))
    varfile = tmp_path / "vars.json"
    varfile.write_text(json.dumps(dict(extra, ansible_python_interpreter=sys.executable)))
    proc = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-vvv", "-i", "localhost,", str(playbook),
                           "-e", "@%s" % varfile], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    return proc.returncode, proc.stdout + proc.stderr


ENGINE_ROLE = dict(engine_platform="kubernetes", engine_k8s_mode="render", engine_name="vllm",
                   engine_served_model_name="glm-5.2-fp8-vllm", engine_image="vllm/vllm-openai:v0.26.0",
                   engine_namespace="llm-lab", engine_model_path="/mnt/nvme/models/GLM-5.2-FP8/v1",
                   engine_k8s_tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                   engine_k8s_staged_nodes=["gpu-node-a"])  # rendered without SSH to the nodes: named by hand


def test_engine_role_refuses_a_plain_token_and_never_prints_it(tmp_path):
    out = tmp_path / "manifests"
    rc, output = _play(tmp_path, "engine", dict(ENGINE_ROLE, engine_render_dir=str(out), engine_env={"HF_TOKEN": FAKE}))
    assert rc != 0
    assert "env.HF_TOKEN: plain-text credential" in output and "hf_token_secret" in output
    assert FAKE not in output
    assert not out.exists()


def test_engine_role_output_hides_env_but_keeps_the_report(tmp_path):
    out = tmp_path / "manifests"
    value = "plain-setting-seen-only-in-files-5c2a"
    rc, output = _play(tmp_path, "engine", dict(ENGINE_ROLE, engine_render_dir=str(out), engine_env={"MY_SETTING": value},
                                                kernel_cache_env={"TRITON_CACHE_DIR": "/cache/" + value}))
    assert rc == 0, output[-3000:]
    assert value not in output
    flat = " ".join(output.split())
    assert "concurrent reads" in flat and "rendered into %s: changed 10-service-glm-5-2-fp8-vllm-019f2c25.yaml" % out in flat
    assert value in (out / "40-deployment-glm-5-2-fp8-vllm-019f2c25.yaml").read_text()


def test_pd_role_refuses_a_plain_api_key_and_never_prints_it(tmp_path):
    out = tmp_path / "pd"
    rc, output = _play(tmp_path, "pd_disagg", dict(pd_disagg_platform="kubernetes", pd_disagg_render_dir=str(out),
                                                   pd_disagg_engine_extra_args=["--api-key", FAKE],
                                                   pd_disagg_prefill_nodes=["gpu-node-p"],
                                                   pd_disagg_decode_nodes=["gpu-node-d"]))
    assert rc != 0
    assert "extra_args[1]: plain-text credential" in output
    assert FAKE not in output
    assert not out.exists()


# ---- nesting cannot hide a credential --------------------------------------------------------------- #

def _nested(depth, leaf, array=False):
    opening = "".join("[" if array and i % 2 else '{"level%d": ' % i for i in reversed(range(depth)))
    closing = "".join("]" if array and i % 2 else "}" for i in range(depth))
    return opening + json.dumps(leaf) + closing


def _scan_argv(argv):
    from ansible_collections.llmops.serving.plugins.module_utils.common import _secrets
    scan = _secrets.Scan()
    scan.argv(argv, "extra_args")
    return scan


@pytest.mark.parametrize("depth", [1, 10, 60])
@pytest.mark.parametrize("array", [False, True])
def test_credential_key_nested_in_a_json_argument_is_found(depth, array):
    """Before: a JSON argument opening with '[' was not read at all."""
    scan = _scan_argv(["--hf-overrides", "[%s]" % _nested(depth, {"api_key": FAKE}, array)])
    assert len(scan.findings) == 1 and scan.findings[0].field.startswith("extra_args[1] ("), scan.findings
    assert FAKE in scan.secret_values()


@pytest.mark.parametrize("depth", [100, 900, 20000])
def test_credential_nested_too_deep_to_check_is_refused_never_passed(depth):
    """Before: json.loads raised RecursionError (or the walk did) and the argument passed unchecked."""
    arg = _nested(depth, {"api_key": FAKE})
    for argv in (["--hf-overrides", arg], ["--hf-overrides=" + arg], ["--kv-transfer-config", arg]):
        scan = _scan_argv(argv)
        assert scan.findings and "too deep to be checked for credentials" in scan.findings[0].why, argv[0]
        with pytest.raises(ValueError) as e:
            scan.refuse()
        assert FAKE not in str(e.value) and "nests deeper than 64 levels" in str(e.value)


def test_json_argument_with_numbers_out_of_range_is_still_checked():
    scan = _scan_argv(["--hf-overrides", json.dumps({"x": 1e300, "hub_token": FAKE}).replace("1e+300", "1e400")])
    assert FAKE in scan.secret_values()


def test_deep_dict_flag_value_is_refused_not_walked_recursively():
    from ansible_collections.llmops.serving.plugins.module_utils.common import _secrets
    value = leaf = {}
    for dummy in range(5000):
        leaf["k"] = {}
        leaf = leaf["k"]
    leaf["api_key"] = FAKE
    scan = _secrets.Scan()
    scan.flags({"hf-overrides": value, "api-key": value}, "engine_args")
    assert sorted(f.field for f in scan.findings) == ["engine_args.api-key", "engine_args.hf-overrides"]
    assert all("too deep" in f.why for f in scan.findings)


def test_renderer_refuses_a_credential_nested_in_an_engine_json_argument():
    for arg in (_nested(30, {"secret_key": FAKE}), _nested(200, {"secret_key": FAKE})):
        with pytest.raises(_k8s_checks.SpecError) as e:
            k8s.build(dict(ENGINE, extra_args=["--kv-transfer-config", arg]))
        assert "extra_args[1]" in str(e.value) and FAKE not in str(e.value)


@pytest.mark.parametrize("text", [
    "a: &a [x, x]\nb: &b [*a, *a]\nc: &c [*b, *b]\nd: [*c, *c]\n",
    "---\n" + "k:\n  " * 0 + "[" * 500 + "]" * 500 + "\n",
])
def test_previous_file_that_cannot_be_checked_is_not_shown(text):
    from ansible_collections.llmops.serving.plugins.module_utils.common import _secrets
    shown = _secrets.redact_rendered_text(text)
    assert shown.startswith("# (previous content not shown: it could not be checked for credentials")


def test_previous_file_of_several_documents_is_checked_in_each():
    from ansible_collections.llmops.serving.plugins.module_utils.common import _secrets
    clean = "---\nkind: ConfigMap\ndata: {a: b}\n---\nkind: Service\n"
    assert _secrets.redact_rendered_text(clean) == clean
    leaked = clean + "---\nkind: Pod\nspec:\n  containers:\n  - env:\n    - {name: HF_TOKEN, value: %s}\n" % FAKE
    assert "plain-text credential" in _secrets.redact_rendered_text(leaked)


@pytest.mark.parametrize("name,credential", [
    ("Authorization", True), ("proxy-authorization", True), ("Cookie", True), ("X-Api-Key", True),
    ("x-auth-token", True), ("routing-strategy", False), ("model", False), ("Content-Type", False)])
def test_credential_headers_by_name(name, credential):
    from ansible_collections.llmops.serving.plugins.module_utils.common import _secrets

    assert _secrets.is_credential_header(name) is credential


# ---- one rule for every channel: URL userinfo and query, header names, NAME=value words ------------------ #

@pytest.mark.parametrize("url,where", [
    ("http://gw.example/v1?token=%s" % FAKE, "the query parameter token"),
    ("https://gw.example/v1?x=1&api_key=%s" % FAKE, "the query parameter api_key"),
    ("HTTP://gw.example/?access_token=%s" % FAKE, "the query parameter access_token"),
    ("https://storage.example/blob?sv=2024&sig=%s" % FAKE, "the query parameter sig"),
    ("https://maps.example/api?key=%s" % FAKE, "the query parameter key"),
    ("gw.example:80/?password=%s" % FAKE, "the query parameter password"),
    ("https://app.example/cb#access_token=%s" % FAKE, "the fragment parameter access_token"),
    ("https://usr:%s@gw.example" % FAKE, "user:password@ before the host"),
    ("https://gw.example/%s/v1" % HF_FAKE, "a Hugging Face access token"),
])
def test_a_url_credential_is_found_in_the_userinfo_the_query_and_the_fragment(url, where):
    from ansible_collections.llmops.serving.plugins.module_utils.common import _secrets

    found = _secrets.credential_in_url(url)
    assert [w for w, dummy in found] == [where], found
    assert any(FAKE in s or HF_FAKE in s for dummy, s in found)


@pytest.mark.parametrize("url", [
    "http://10.0.0.5:8000/v1", "http://h:8000/?who=a@b", "http://h/metrics?name[]=vllm:x",
    "http://h/v1/completions?max_tokens=16", "http://h/?token=", "http://h/?api_key=$API_KEY",
    "http://h/?tokenizer=/models/glm", "http://h/?keyword=x",
])
def test_a_url_without_credentials_passes(url):
    from ansible_collections.llmops.serving.plugins.module_utils.common import _secrets

    assert _secrets.credential_in_url(url) == []


@pytest.mark.parametrize("argv,name", [
    (["env", "HF_TOKEN=%s" % FAKE, "vllm", "serve", "/m"], "HF_TOKEN"),
    (["bash", "-c", "export OPENAI_API_KEY=%s; exec vllm serve /m" % FAKE], "OPENAI_API_KEY"),
    (["/bin/sh", "-lc", "source /opt/venv/bin/activate && export DB_PASSWORD='%s' && exec vllm serve" % FAKE],
     "DB_PASSWORD"),
    (["bash", "-c", "AWS_SECRET_ACCESS_KEY=%s exec vllm serve /m" % FAKE], "AWS_SECRET_ACCESS_KEY"),
    (["vllm", "bench", "serve", "--header", "Authorization=Bearer %s" % FAKE], "Authorization"),
    (["vllm", "bench", "serve", "--header", "x-api-key=%s" % FAKE], "x-api-key"),
])
def test_a_name_value_word_that_sets_a_credential_is_found_wherever_it_is(argv, name):
    from ansible_collections.llmops.serving.plugins.module_utils.common import _secrets

    words = _secrets.credential_words(argv)
    assert [(n, FAKE in v) for dummy, n, v in words] == [(name, True)], words
    values, fields = _secrets.command_credentials(argv)
    assert any(FAKE in v for v in values) and fields


@pytest.mark.parametrize("argv", [
    ["env", "HF_TOKEN_PATH=/run/token", "TOKENIZERS_PARALLELISM=false", "vllm", "serve"],
    ["bash", "-c", "export HF_TOKEN=$(cat /run/secrets/hf); exec vllm serve /m"],
    ["bash", "-c", "export HF_TOKEN=\"${HF_TOKEN:-}\"; exec vllm serve /m"],
    ["vllm", "bench", "serve", "--header", "routing-strategy=pd"],
])
def test_a_name_value_word_that_reads_its_value_from_elsewhere_passes(argv):
    from ansible_collections.llmops.serving.plugins.module_utils.common import _secrets

    assert _secrets.credential_words(argv) == []
    assert _secrets.command_credentials(argv) == ([], [])


def test_a_command_with_a_credential_in_a_url_or_a_curl_header_is_found():
    from ansible_collections.llmops.serving.plugins.module_utils.common import _secrets

    cmd = ["bash", "-c", "curl -H 'Authorization: Bearer %s' http://gw/v1/models?token=q%s && exec vllm serve" % (FAKE, FAKE)]
    values, fields = _secrets.command_credentials(cmd)
    assert "Bearer %s" % FAKE in values and "q%s" % FAKE in values
    assert fields == ["command[2] (script)"]


def test_engine_process_masks_a_credential_set_by_env_or_export_everywhere(tmp_path):
    """engine_process takes the collection's one rule for its command: HF_TOKEN=... after env and an export in
    bash -c are masked in the result, its invocation and spec.json (before, only --api-key and token shapes were)."""
    from ansible_collections.llmops.serving.plugins.module_utils.engine import _process

    for cmd in (["env", "HF_TOKEN=%s" % FAKE, "sleep", "30"],
                ["bash", "-c", "export OPENAI_API_KEY=%s; exec sleep 30" % FAKE]):
        values, fields = _process.command_secrets(cmd)
        assert FAKE in values and fields, cmd
        assert FAKE not in json.dumps(_process.redact(cmd, values))
