# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""**PRIVATE** to llmops.serving: a serving benchmark round as a Kubernetes Job.

* :func:`job_manifest` - the Job (:func:`job_name`) that runs one round in the cluster with :data:`JOB_SOURCE`:
  the same client and flags as a local round, its result printed on one marked line of the log
  (``_bench_client.result_from_output`` reads it back).
* :func:`check_header_secret` - a target header that carries a credential (``Authorization``, ``X-Api-Key``, a
  token-shaped value; ``_bench_inputs.split_headers``) never goes into the Job: the Job reads it from a
  Kubernetes Secret (``valueFrom.secretKeyRef`` into ``LLMOPS_BENCH_SECRET_HEADERS``); the other headers go in
  ``LLMOPS_BENCH_HEADERS``. Neither is ever an argument.
"""
from __future__ import annotations

import json
import re

from ansible_collections.llmops.serving.plugins.module_utils.bench import _bench_client, _bench_inputs
from ansible_collections.llmops.serving.plugins.module_utils.bench._bench_client import DIGEST_SOURCE
from ansible_collections.llmops.serving.plugins.module_utils.bench._bench_inputs import BenchError

#: In a Kubernetes Job: the same client, then its saved result on one marked line of the log.
JOB_SOURCE = DIGEST_SOURCE + r'''
import json, os, sys, tempfile
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
d = tempfile.mkdtemp()
parser = FlexibleArgumentParser(prog="vllm bench serve", description="vllm bench serve")
add_cli_args(parser)
main(parser.parse_args(sys.argv[1:] + ["--save-result", "--save-detailed", "--result-dir", d,
                                       "--result-filename", "result.json"]))
with open(os.path.join(d, "result.json")) as f:
    doc = json.load(f)
doc.pop("generated_texts", None)
print("\n%s%s" % ("LLMOPS_BENCH_RESULT ", json.dumps(doc)), flush=True)
'''


def job_name(plan_doc, rnd):
    base = re.sub(r"[^a-z0-9-]+", "-", rnd["target"].lower()).strip("-")[:30] or "target"
    return "bench-%03d-%s" % (rnd["index"], base)


def check_header_secret(plan_doc, header_secret):
    """Refuse (:class:`BenchError`, reason ``credential_header``) a plan whose targets send a credential header
    when no Secret is named for it: the Job would have to carry the value, and a Job is stored in Git, printed by
    ``kubectl get -o yaml`` and returned by the module. The message names the headers, never their values."""
    names = sorted({"%s (%s)" % (k, t["name"]) for t in plan_doc["targets"]
                    for k in _bench_inputs.split_headers(t.get("headers"))[1]})
    if names and not header_secret:
        raise BenchError("header_secret: the targets send credential headers (%s), which a Job must not carry in "
                         "plain text (it is stored in Git and shown by kubectl get -o yaml); create a Secret whose key "
                         "headers holds them as a JSON object, e.g. kubectl create secret generic bench-headers "
                         "--from-literal=headers='{\"Authorization\": \"Bearer ...\"}', and set header_secret "
                         "(benchmark_k8s_header_secret) to its name" % ", ".join(names),
                         reason="credential_header", field="header_secret")


def _env(target, header_secret, header_secret_key):
    """The client's env entries: the plain headers as a JSON value, the credential ones from the Secret."""
    plain, cred = _bench_inputs.split_headers(target.get("headers"))
    env = []
    if plain:
        env.append({"name": _bench_client.HEADERS_ENV, "value": json.dumps(plain, sort_keys=True)})
    if cred:
        env.append({"name": _bench_client.SECRET_HEADERS_ENV,
                    "valueFrom": {"secretKeyRef": {"name": header_secret, "key": header_secret_key}}})
    return env


def job_manifest(plan_doc, rnd, namespace, image, python="python3", tokenizer_host_path="/mnt/nvme/models",
                 tokenizer_mount="/models", node_selector=None, active_deadline=3600, affinity=None, tolerations=None,
                 header_secret=None, header_secret_key="headers"):
    """The Kubernetes Job that runs round ``rnd`` in the cluster with :data:`JOB_SOURCE` (same flags as a local
    round). The tokenizer comes from a read-only hostPath, so ``affinity`` (a required node affinity to the nodes
    that hold it) and ``tolerations`` (those nodes' taints) place the pod where it is. A target's headers go in
    the client's environment, never its arguments: the plain ones as a value, the credential ones from the Secret
    ``header_secret`` (:func:`check_header_secret` refuses a plan that has some and no Secret)."""
    check_header_secret(plan_doc, header_secret)
    target = next(t for t in plan_doc["targets"] if t["name"] == rnd["target"])
    argv = _bench_client.client_argv(python, target, rnd, plan_doc["tokenizer"], "/tmp", "unused.json",
                                     ready_timeout=plan_doc.get("ready_timeout_s", 30),
                                     **_bench_client.load_args(plan_doc))
    # JOB_SOURCE adds the result flags itself
    cut = argv.index("--save-result")
    args = argv[3:cut] + argv[cut + 6:]
    labels = {"app.kubernetes.io/name": "llmops-benchmark", "app.kubernetes.io/managed-by": "llmops.serving",
              "llmops.serving/round": str(rnd["index"])}
    spec = {
        "backoffLimit": 0, "activeDeadlineSeconds": int(active_deadline), "ttlSecondsAfterFinished": 86400,
        "template": {
            "metadata": {"labels": labels},
            "spec": {
                "restartPolicy": "Never",
                "containers": [{
                    "name": "client", "image": image, "command": [python, "-c", JOB_SOURCE], "args": args,
                    "volumeMounts": [{"name": "tokenizer", "mountPath": tokenizer_mount, "readOnly": True}],
                    "resources": {"requests": {"cpu": "2", "memory": "4Gi"}},
                }],
                "volumes": [{"name": "tokenizer", "hostPath": {"path": tokenizer_host_path, "type": "Directory"}}],
            },
        },
    }
    env = _env(target, header_secret, header_secret_key)
    if env:
        spec["template"]["spec"]["containers"][0]["env"] = env
    if node_selector:
        spec["template"]["spec"]["nodeSelector"] = dict(node_selector)
    if affinity:
        spec["template"]["spec"]["affinity"] = json.loads(json.dumps(affinity))
    if tolerations:
        spec["template"]["spec"]["tolerations"] = [dict(t) for t in tolerations]
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": job_name(plan_doc, rnd), "namespace": namespace, "labels": labels}, "spec": spec}
