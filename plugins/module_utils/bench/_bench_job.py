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
* :func:`tokenizer_paths` - ``benchmark_tokenizer`` seen from the node (the staged revision directory, where the
  Jobs are pinned) and from the pod (the client's ``--tokenizer``): the Job mounts the node directory
  ``tokenizer_host_path`` (the staging root, ``model_stage_dest_root``) at ``tokenizer_mount``, so a path under
  either one has its twin under the other; a path under neither is refused, never guessed.
"""
from __future__ import annotations

import json
import posixpath
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


def _under(path, root):
    """``path`` relative to ``root`` when it is ``root`` or below it (``.`` for ``root`` itself), else None."""
    if path == root or root == "/":
        return posixpath.relpath(path, root)
    return path[len(root) + 1:] if path.startswith(root + "/") else None


def tokenizer_paths(tokenizer, tokenizer_host_path, tokenizer_mount):
    """``{"host": ..., "pod": ...}``: ``tokenizer`` (``benchmark_tokenizer``) on the node and in the Job's pod, which
    mounts the node directory ``tokenizer_host_path`` at ``tokenizer_mount``. The tokenizer may be given either way:
    the staged revision on the node (``<model_stage_dest_root>/<name>/<revision>``, what playbooks/benchmark.yml
    uses by default) becomes ``<tokenizer_mount>/<name>/<revision>`` in the pod, and a path under the mount is the
    pod path of ``<tokenizer_host_path>/<name>/<revision>``. Refuses (:class:`BenchError`, reason
    ``tokenizer_path``, naming ``benchmark_tokenizer``) a relative path, a path under neither directory (the pod
    could not read it) and one under both that means two different directories."""
    fix = ("give the staged revision on the node (%s/<name>/<revision>) or its path in the Job's pod "
           "(%s/<name>/<revision>), or set benchmark_k8s_tokenizer_host_path (default model_stage_dest_root) to the "
           "node directory that holds it" % (tokenizer_host_path, tokenizer_mount))
    if not isinstance(tokenizer, str) or not tokenizer.strip():
        raise BenchError("benchmark_tokenizer: empty; %s" % fix, reason="tokenizer_path", field="benchmark_tokenizer")
    for var, value in (("benchmark_k8s_tokenizer_host_path", tokenizer_host_path),
                       ("benchmark_k8s_tokenizer_mount", tokenizer_mount)):
        if not isinstance(value, str) or not posixpath.isabs(value):
            raise BenchError("%s: %r is not an absolute path; give the directory (the default is %s)"
                             % (var, value, "model_stage_dest_root" if var.endswith("host_path") else "/models"),
                             reason="tokenizer_path", field=var)
    if not posixpath.isabs(tokenizer):
        raise BenchError("benchmark_tokenizer: %r is relative; %s" % (tokenizer, fix), reason="tokenizer_path",
                         field="benchmark_tokenizer")
    path, host, mount = (posixpath.normpath(p) for p in (tokenizer, tokenizer_host_path, tokenizer_mount))
    found = []
    rel = _under(path, host)
    if rel is not None:
        found.append({"host": path, "pod": posixpath.normpath(posixpath.join(mount, rel))})
    rel = _under(path, mount)
    if rel is not None:
        found.append({"host": posixpath.normpath(posixpath.join(host, rel)), "pod": path})
    if not found:
        raise BenchError("benchmark_tokenizer: %s is neither under benchmark_k8s_tokenizer_host_path %s (on the node) "
                         "nor under benchmark_k8s_tokenizer_mount %s (in the Job's pod), so the Job could not read it; "
                         "%s" % (tokenizer, host, mount, fix), reason="tokenizer_path", field="benchmark_tokenizer")
    if len(found) == 2 and found[0] != found[1]:
        raise BenchError("benchmark_k8s_tokenizer_mount: %s and benchmark_k8s_tokenizer_host_path %s are nested, so "
                         "benchmark_tokenizer %s means %s on the node read one way and %s the other; set "
                         "benchmark_k8s_tokenizer_mount to a directory outside %s (the default /models)"
                         % (mount, host, tokenizer, found[0]["host"], found[1]["host"], host),
                         reason="tokenizer_path", field="benchmark_k8s_tokenizer_mount")
    return found[0]


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
    ``header_secret`` (:func:`check_header_secret` refuses a plan that has some and no Secret). The plan's
    tokenizer may be the node's or the pod's path (:func:`tokenizer_paths`); the client gets the pod's."""
    check_header_secret(plan_doc, header_secret)
    tokenizer = tokenizer_paths(plan_doc["tokenizer"], tokenizer_host_path, tokenizer_mount)["pod"]
    target = next(t for t in plan_doc["targets"] if t["name"] == rnd["target"])
    argv = _bench_client.client_argv(python, target, rnd, tokenizer, "/tmp", "unused.json",
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
