#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: kernel_cache
short_description: Verify, prebuild, capture, copy, check out, garbage-collect and audit fingerprinted kernel-cache directories
version_added: "0.1.0"
description:
  - Manages C(<cache_root>/<engine>/<fingerprint>/) directories on node-local storage. Each holds one
    subdirectory per cache kind (vLLM C(torch_compile), C(inductor), C(triton), C(deep_gemm),
    C(flashinfer); SGLang C(sglang), C(deep_gemm), C(jit), C(triton), C(inductor), C(flashinfer)) and a
    C(manifest.json) with the fingerprint components, every file's size and sha256, the producer host
    and the creation time. A published directory is never written again; an engine starts on its own
    copy (O(operation=checkout)).
  - Every path in a C(manifest.json) must name a file inside its directory (no absolute path, no C(..),
    no symlink on the way); a manifest entry that breaks this, lacks C(path), C(size) or C(sha256), or
    has them of the wrong type makes the directory C(bad_manifest), handled like a tampered one.
  - O(operation=verify) checks the published directory against its manifest and the expected
    O(components) before the engine starts. A tampered, incomplete, foreign or C(bad_manifest)
    directory is moved to C(<cache_root>/.quarantine/) and reported, never used. One that a running
    process uses (see O(proc_root)) is reported with C(in_use_by) and left in place.
  - O(operation=prebuild) builds the cache once per fingerprint. Under a per-fingerprint lock it
    re-checks, runs O(warmup_command) with every cache variable pointing into a private C(.partial-*)
    directory, writes the manifest, verifies it and renames it into place. Callers that waited for
    another builder report a hit.
  - O(operation=capture) is the miss path where no prebuild can run (a Kubernetes engine, whose compilers are in
    its image) - it makes engine O(instance)'s per-start directory (the path O(operation=checkout) would give it,
    C(<cache_root>/<engine>/.run/<fingerprint>-<instance>/)) empty, laid out for the engine's cache kinds, with a
    C(capture.json) marker naming the fingerprint and its O(components). A directory a process uses is left as it
    is; what an earlier start left in one no process uses is discarded (C(discarded_files)). Refused while the
    fingerprint is published and verifies.
  - O(operation=publish_capture), after the engine's first correct answer, publishes what it compiled there as the
    fingerprint's cache, with the guarantees of O(operation=prebuild) - under the per-fingerprint lock, every file
    hashed while copied into a C(.partial-*) directory (a file the engine changes meanwhile is refused), a
    manifest, verification, the publish sequence, a published directory that does not verify quarantined first.
    The first publisher of a fingerprint wins; a later one reports C(hit) and publishes nothing. A capture of
    another fingerprint or other components (its marker), one with a symlink, or an empty one (C(empty)) is
    never published. Triton's scratch directories (C(tmp.pid_*)) are left out. The per-start directory then
    holds the published manifest (it is the instance's checkout).
  - O(operation=sync) copies a verified directory from O(source_root) (a shared cache store, or the
    local cache when pushing to the store) into O(cache_root), hashing every file while copying, then
    renames it into place. Progress (bytes, rate, ETA) goes to C(.logs/<fingerprint>.sync.log).
  - O(operation=checkout) gives engine O(instance) its own writable copy of the verified published
    directory, C(<cache_root>/<engine>/.run/<fingerprint>-<instance>/), every file hashed while copied
    and Triton groups pointed at O(mount_path). The copy keeps its path from run to run (an engine left
    running keeps its spec); it is left alone while a process uses it, kept while it equals the published
    files, and replaced otherwise. RV(engine_dir) and RV(env) are what the engine must use.
  - O(operation=gc) keeps the newest O(keep) fingerprints of O(engine), newest by the order they were
    published on this node (a sequence number each manifest records when O(operation=prebuild) or
    O(operation=sync) puts it in place; no clock takes part, so a cache built while a clock was wrong keeps its
    place; caches published by an older version, without one, count as older). A fingerprint listed in
    O(in_use), or whose published directory or C(.run/) copy a running process uses, is never removed.
    Copies no process uses go with their fingerprint, except those of a fingerprint O(in_use) names, published or
    not yet (the per-start directory of O(operation=capture)); stale C(.partial-*) directories whose lock is free
    are removed too. Only real directories count; a symlink where a fingerprint directory, an engine copy or
    a build directory would be is never followed, counted or removed; it is reported (C(links) in RV(details),
    and a warning) with the fix, and gc goes on with the rest. So does a directory that cannot be removed
    (C(errors)).
  - Use by a process (of a fingerprint directory or its copies, for O(operation=gc), O(operation=checkout)
    and the quarantine of O(operation=verify), O(operation=prebuild) and O(operation=sync)) is found under
    O(proc_root) by device and inode, whatever path the process reaches the directory by - a symlinked
    O(cache_root), a bind mount in another mount namespace (a pod's hostPath), an open file, a mapping, its
    working directory or a cache variable in its environment.
  - O(operation=report) reads the engine log after start and decides C(hit) or C(miss). A start that
    recompiled (for example vLLM's C(Compiling model again due to a load failure) or SGLang's DeepGEMM
    pre-compile banner) is a miss, and so is one that wrote files into its copy; those are listed as
    C(new_files) with C(worth_publishing). The published directory is checked to be unchanged.
    Poisoned-cache signatures and MoE tuned-config fallbacks are reported too.
  - Every operation except O(operation=gc) returns RV(env), built from O(mount_path) (for
    O(operation=checkout), from the copy when O(mount_path) is not set).
options:
  operation:
    description: What to do.
    type: str
    required: true
    choices: [verify, prebuild, capture, publish_capture, sync, checkout, gc, report]
  cache_root:
    description: Node-local root of the kernel caches (C(<cache_root>/<engine>/<fingerprint>)).
    type: path
    required: true
  engine:
    description: Serving engine.
    type: str
    required: true
    choices: [vllm, sglang]
  fingerprint:
    description: RV(llmops.serving.kernel_fingerprint#module:fingerprint). Required except for O(operation=gc).
    type: str
  components:
    description:
      - RV(llmops.serving.kernel_fingerprint#module:components). Required for O(operation=verify),
        O(operation=prebuild), O(operation=capture), O(operation=publish_capture), O(operation=sync) and
        O(operation=checkout); a directory whose manifest components differ is never used.
    type: dict
  label:
    description: Readable label recorded in the manifest.
    type: str
    default: ""
  mount_path:
    description:
      - Where the engine sees its cache directory (the container mount path in Kubernetes).
        Defaults to RV(engine_dir) for O(operation=checkout), O(operation=capture), O(operation=publish_capture)
        and O(operation=report), to the fingerprint directory otherwise.
    type: str
  instance:
    description:
      - Name of the engine instance on this host whose copy O(operation=checkout) prepares (or whose per-start
        directory O(operation=capture) empties and O(operation=publish_capture) publishes) and O(operation=report)
        inspects (the engine's process name). One copy per instance and fingerprint.
    type: str
    default: engine
  quarantine:
    description: Move an unusable directory aside during O(operation=verify). When false it is only reported.
    type: bool
    default: true
  allow_extra:
    description:
      - Accept files that are not in the manifest (kernels an engine added after a partial miss).
        Changed or missing files always fail verification.
    type: bool
    default: true
  warmup_command:
    description:
      - Command that fills the caches, as an argument list. SGLang - C(python -m sglang.compile_deep_gemm)
        with the launch arguments. vLLM - the engine itself with O(warmup_mode=serve).
      - Required for O(operation=prebuild).
    type: list
    elements: str
  warmup_mode:
    description:
      - V(run) waits for the command to exit 0. V(serve) starts it, waits for a first correct response
        from O(warmup_url), then stops it.
    type: str
    default: run
    choices: [run, serve]
  warmup_url:
    description: OpenAI completions or chat URL polled in V(serve) mode.
    type: str
  warmup_body:
    description: JSON request body posted to O(warmup_url).
    type: dict
    default: {}
  warmup_expect:
    description: Substring the response text must contain; any non-empty text counts when empty.
    type: str
    default: ""
  warmup_timeout:
    description: Seconds the warm-up may take.
    type: int
    default: 3600
  warmup_env:
    description:
      - Extra environment for the warm-up (the cache variables are always set by the module).
      - Values are C(no_log) - hidden in every result, C(-vvv) output and job event. Ansible masks each value
        wherever it appears in this task's result, so a short value (C(1), C(/tmp)) also masks those
        characters in the paths this task returns; the facts the role exports come from other tasks.
    type: dict
    default: {}
  warmup_chdir:
    description: Working directory of the warm-up.
    type: path
  lock_timeout:
    description: Seconds to wait for another builder of the same fingerprint.
    type: int
    default: 7200
  source_root:
    description: Cache root to copy from for O(operation=sync).
    type: path
  keep:
    description: Newest fingerprints per engine kept by O(operation=gc) (in-use ones are kept on top).
    type: int
    default: 3
  in_use:
    description:
      - Fingerprints that O(operation=gc) must keep (mounted by running pods), each a fingerprint or a path to
        its directory or below (for example an engine's C(TRITON_CACHE_DIR)). A path is compared by device and
        inode, however it is spelt (a symlinked root, C(..), a trailing slash, a bind mount).
      - An entry that names no fingerprint directory of O(engine) protects nothing; it is listed in
        C(unmatched_in_use) in RV(details) with a warning.
    type: list
    elements: str
    default: []
  log_path:
    description: Engine log read by O(operation=report).
    type: path
extends_documentation_fragment:
  - llmops.serving.attributes
  - llmops.serving.node.proc_root
attributes:
  check_mode:
    support: full
    details: Reports what would be quarantined, built, copied or removed without doing it.
  diff_mode:
    support: none
author:
  - llmops.serving maintainers (@llmops)
"""

EXAMPLES = r"""
- name: Verify the restored cache before the engine starts
  llmops.serving.kernel_cache:
    operation: verify
    cache_root: /mnt/nvme/kernel-cache
    engine: sglang
    fingerprint: "{{ fp.fingerprint }}"
    components: "{{ fp.components }}"
    mount_path: /cache
  register: kc

- name: Prebuild the DeepGEMM cache once
  llmops.serving.kernel_cache:
    operation: prebuild
    cache_root: /mnt/nvme/kernel-cache
    engine: sglang
    fingerprint: "{{ fp.fingerprint }}"
    components: "{{ fp.components }}"
    warmup_command: [/opt/sglang/bin/python, -m, sglang.compile_deep_gemm, --model-path, /mnt/nvme/models/m/rev, --tp, "8"]

- name: Give the engine its own writable copy of the verified cache
  llmops.serving.kernel_cache:
    operation: checkout
    cache_root: /mnt/nvme/kernel-cache
    engine: vllm
    fingerprint: "{{ fp.fingerprint }}"
    components: "{{ fp.components }}"
    instance: engine
  register: kc_run

- name: Report whether the engine start hit the cache
  llmops.serving.kernel_cache:
    operation: report
    cache_root: /mnt/nvme/kernel-cache
    engine: vllm
    fingerprint: "{{ fp.fingerprint }}"
    log_path: /var/tmp/llmops/run/vllm.log

- name: Keep the newest three fingerprints
  llmops.serving.kernel_cache:
    operation: gc
    cache_root: /mnt/nvme/kernel-cache
    engine: vllm
    keep: 3
    in_use: ["{{ fp.fingerprint }}"]
"""

RETURN = r"""
status:
  description:
    - verify - V(hit), V(missing) or V(quarantined) (or the verification status when O(quarantine=false)).
    - verify - V(tampered), V(incomplete), V(foreign), V(no_manifest) or V(bad_manifest) when the directory is
      not usable but a process uses it (C(in_use_by) in RV(details)), so it was left in place.
    - prebuild - V(built), V(hit) or V(would_build). A warm-up that ends well but writes no file into the cache
      directories fails instead, and nothing is published (it ignored C(TRITON_CACHE_DIR) and the others).
    - sync - V(copied), V(hit) or V(would_copy).
    - capture - V(created), V(ready) (already an empty capture of this fingerprint), V(in_use) (a process uses the
      directory; left alone) or V(would_create).
    - publish_capture - V(published), V(hit) (published and verified already - nothing published), V(empty)
      (nothing compiled there) or V(would_publish).
    - checkout - V(copied), V(ready) (the copy equals the published files), V(in_use) (a process uses the
      copy; left alone) or V(would_copy).
    - report - V(hit), V(miss) or V(unknown). gc - V(done).
  returned: always
  type: str
cache_dir:
  description: The published fingerprint directory on this host (read-only for engines).
  returned: unless O(operation=gc)
  type: str
engine_dir:
  description:
    - The writable copy engine O(instance) runs on (checkout, capture, publish_capture); for report, the directory the start was
      judged on (the copy, or the published directory when there is none).
  returned: when O(operation=checkout), O(operation=capture), O(operation=publish_capture) or O(operation=report)
  type: str
  sample: /mnt/nvme/kernel-cache/vllm/.run/0c1d2e3f4a5b6c7d-engine
env:
  description: Environment variables for the engine, all pointing inside O(mount_path) (or RV(engine_dir)).
  returned: unless O(operation=gc)
  type: dict
  sample: {TRITON_CACHE_DIR: /cache/triton, SGLANG_DG_CACHE_DIR: /cache/deep_gemm}
problems:
  description: What failed verification (changed, missing or extra files; differing components).
  returned: when verified
  type: list
  elements: str
quarantined_to:
  description: Where an unusable directory was moved.
  returned: when something was quarantined
  type: str
details:
  description:
    - The full result of the operation (manifest summary, timings, log evidence, gc lists).
    - verify, checkout and gc - C(in_use_by), the processes found using a directory (C(pid), C(via), C(file)).
    - checkout - C(discarded_files), what a stopped start had left in a copy that was replaced.
    - report - C(new_files) (C(path), C(size), C(change) added or changed), C(missing_files),
      C(published_unchanged), C(worth_publishing) and C(publish_advice).
    - gc - C(kept), C(removed), C(protected), C(mounted), C(removed_runs), C(removed_partials), C(links) (each
      C(path), C(target), C(what), C(fix)), C(errors) (each C(path), C(reason)) and C(unmatched_in_use) (the
      O(in_use) entries that name no fingerprint directory).
    - checkout - C(replaced_link) when a symlink stood where the copy goes (the link is replaced, its target
      is never read or written).
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmops.serving.plugins.module_utils.cache import (
    _kcache, _kcache_build, _kcache_capture, _kcache_gc, _kcache_log,
)
from ansible_collections.llmops.serving.plugins.module_utils.common import _http, _option_specs, _secrets

NEEDS_COMPONENTS = ("verify", "prebuild", "capture", "publish_capture", "sync", "checkout")


def main():
    module = AnsibleModule(
        argument_spec=dict(
            operation=dict(type="str", required=True,
                           choices=["verify", "prebuild", "capture", "publish_capture", "sync", "checkout", "gc",
                                    "report"]),
            cache_root=dict(type="path", required=True),
            engine=dict(type="str", required=True, choices=sorted(_kcache.KINDS)),
            fingerprint=dict(type="str"),
            components=dict(type="dict"),
            label=dict(type="str", default=""),
            mount_path=dict(type="str"),
            instance=dict(type="str", default=_kcache.DEFAULT_INSTANCE),
            quarantine=dict(type="bool", default=True),
            allow_extra=dict(type="bool", default=True),
            warmup_command=dict(type="list", elements="str"),
            warmup_mode=dict(type="str", default="run", choices=["run", "serve"]),
            warmup_url=dict(type="str"),
            warmup_body=dict(type="dict", default={}),
            warmup_expect=dict(type="str", default=""),
            warmup_timeout=dict(type="int", default=3600),
            warmup_env=dict(type="dict", default={}, no_log=True),
            warmup_chdir=dict(type="path"),
            lock_timeout=dict(type="int", default=7200),
            source_root=dict(type="path"),
            keep=dict(type="int", default=3),
            in_use=dict(type="list", elements="str", default=[]),
            **_option_specs.node("proc_root"),
            log_path=dict(type="path"),
        ),
        required_if=[
            ("operation", "verify", ("fingerprint", "components")),
            ("operation", "prebuild", ("fingerprint", "components", "warmup_command")),
            ("operation", "sync", ("fingerprint", "components", "source_root")),
            ("operation", "checkout", ("fingerprint", "components")),
            ("operation", "capture", ("fingerprint", "components")),
            ("operation", "publish_capture", ("fingerprint", "components")),
            ("operation", "report", ("fingerprint", "log_path")),
            ("warmup_mode", "serve", ("warmup_url",)),
        ],
        supports_check_mode=True,
    )
    _http.refuse_url_credentials(module, {"warmup_url": "point it at the warmup engine this task starts on this "
                                                        "host, which needs none (http://127.0.0.1:<port>/...)"})
    _secrets.hide_command_credentials(module, "warmup_command")  # never shown in the result or invocation
    p = module.params
    op, engine, root, proc = p["operation"], p["engine"], p["cache_root"], p["proc_root"]
    if p["keep"] < 1:
        module.fail_json(msg="keep: %d keeps nothing; set keep to 1 or more" % p["keep"])
    if op in NEEDS_COMPONENTS and p["components"].get("engine") not in (None, engine):
        module.fail_json(msg="components: computed for engine %s, not %s; pass the kernel_fingerprint result "
                             "of this engine" % (p["components"].get("engine"), engine))
    try:
        if op == "gc":
            res = _kcache_gc.gc(root, engine, p["keep"], p["in_use"], proc, module.check_mode)
            for item in res["links"]:
                module.warn("%s: %s is a symlink (to %s), left alone: %s"
                            % (item["what"], item["path"], item["target"], item["fix"]))
            for item in res["errors"]:
                module.warn("%s: %s" % (item["path"], item["reason"]))
            for entry in res["unmatched_in_use"]:
                module.warn("in_use: %r names no fingerprint directory of %s under %s, so it protects nothing; "
                            "fix or remove the entry" % (entry, engine, root))
            module.exit_json(changed=res.pop("changed"), status="done", details=res)
        fp = p["fingerprint"]
        cache_dir = _kcache.fingerprint_dir(root, engine, fp)
        engine_dir = None
        if op in ("checkout", "capture", "publish_capture", "report"):
            engine_dir = _kcache.run_dir(root, engine, fp, p["instance"])
        env = _kcache.cache_env(engine, p["mount_path"] or engine_dir or cache_dir)
        if op == "verify":
            res = _kcache.restore(root, engine, fp, p["components"], p["allow_extra"], module.check_mode,
                                  p["quarantine"], proc_root=proc)
        elif op == "prebuild":
            warmup = dict(command=p["warmup_command"], mode=p["warmup_mode"], url=p["warmup_url"],
                          body=p["warmup_body"], expect=p["warmup_expect"], timeout=p["warmup_timeout"],
                          cwd=p["warmup_chdir"])
            res = _kcache_build.prebuild(root, engine, fp, p["components"], warmup, label=p["label"],
                                         extra_env=dict((k, str(v)) for k, v in p["warmup_env"].items()),
                                         lock_timeout=p["lock_timeout"], allow_extra=p["allow_extra"],
                                         check_mode=module.check_mode, proc_root=proc)
        elif op == "sync":
            res = _kcache_build.sync(p["source_root"], root, engine, fp, p["components"], p["lock_timeout"],
                                     p["allow_extra"], module.check_mode, proc_root=proc)
        elif op == "capture":
            res = _kcache_capture.prepare(root, engine, fp, p["components"], p["instance"], p["label"],
                                          p["lock_timeout"], module.check_mode, proc)
        elif op == "publish_capture":
            res = _kcache_capture.publish_capture(root, engine, fp, p["components"], p["instance"], p["label"],
                                                  p["lock_timeout"], module.check_mode, proc)
        elif op == "checkout":
            res = _kcache_build.checkout(root, engine, fp, p["components"], p["instance"], p["mount_path"],
                                         p["allow_extra"], p["lock_timeout"], module.check_mode, proc)
        else:
            text = _kcache_log.read_log(p["log_path"])
            res = _kcache_build.start_report(root, engine, fp, text, p["instance"], p["mount_path"])
            engine_dir = res["engine_dir"]
            env = _kcache.cache_env(engine, p["mount_path"] or engine_dir)
            res["status"] = res["result"]
            res["changed"] = False
    except (_kcache.KCacheError, OSError, ValueError) as e:
        module.fail_json(msg=str(e))
    verify = res.pop("verify", None) or {}
    out = dict(changed=res.pop("changed", False), status=res["status"], cache_dir=cache_dir, env=env,
               details=res)
    if engine_dir:
        out["engine_dir"] = engine_dir
    if verify:
        out["problems"] = verify.get("problems", [])
        res["manifest"] = verify.get("manifest")
        res["extra_files"] = verify.get("extra_files", [])
    if res.get("quarantined_to"):
        out["quarantined_to"] = res["quarantined_to"]
    module.exit_json(**out)


if __name__ == "__main__":
    main()
