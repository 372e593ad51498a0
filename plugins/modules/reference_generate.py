#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: reference_generate
short_description: Greedy reference generations from transformers on a model directory
version_added: "0.1.0"
description:
  - Loads the model directory with transformers and runs greedy C(generate) for each prompt. An engine that
    serves the same files must produce the same tokens; M(llmops.serving.engine_probe) compares them.
  - Only reads the model. The generation runs in O(python), which must have torch and transformers.
  - With O(cache_dir) the answer is computed once per request and revision. The key is a SHA-256 over the model
    directory's real path, its C(SHA256SUMS) bytes and every file's relative name, size and mtime_ns, the prompts,
    O(max_new_tokens), O(dtype), the generation script and the interpreter (path, file identity, torch and
    transformers versions). A changed file, prompt or interpreter is another key, so a stale answer is never
    served. A malformed, truncated, oversized or foreign entry is recomputed and overwritten; the newest 64
    entries are kept.
  - In check mode a cached answer is served and a missing one is computed as in a normal run, but nothing is
    written and O(cache_dir) is not created.
options:
  model_path:
    description: Model directory (config.json, tokenizer, safetensors shards).
    type: path
    required: true
  prompts:
    description: Prompts to complete.
    type: list
    elements: str
    required: true
  max_new_tokens:
    description: Tokens to generate per prompt.
    type: int
    default: 16
  dtype:
    description: Torch dtype used for the reference.
    type: str
    choices: [float32, bfloat16, float16]
    default: float32
  python:
    description: Interpreter of the engine environment that runs the generation; default is the module's own.
    type: path
  cache_dir:
    description:
      - Directory of cached answers (created with mode 0700, entries 0600). Unset or empty computes every time.
      - A symlink, a non-directory or another user's directory is refused.
    type: path
extends_documentation_fragment:
  - llmops.serving.attributes
  - llmops.serving.attributes.info_module
author:
  - LLMOps Serving maintainers (@llmops-serving)
"""

EXAMPLES = r"""
- name: Reference tokens for the readiness check
  llmops.serving.reference_generate:
    model_path: /var/tmp/llmops/nvme/models/tiny-llama/8f94f6f0fade
    prompts: ["The model is staged"]
    cache_dir: /var/tmp/llmops/run/references
  register: ref
"""

RETURN = r"""
references:
  description: One entry per prompt with C(prompt), C(prompt_token_ids), C(token_ids) and C(text).
  returned: always
  type: list
  elements: dict
load_seconds:
  description: Seconds to import and load the model.
  returned: always
  type: float
generate_seconds:
  description: Seconds spent generating.
  returned: always
  type: float
library_versions:
  description: torch and transformers versions used.
  returned: always
  type: dict
cached:
  description: True when the result is an earlier computation's, read from O(cache_dir); false when computed now.
  returned: always
  type: bool
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmops.serving.plugins.module_utils.engine import _reference


def main():
    module = AnsibleModule(
        argument_spec=dict(
            model_path=dict(type="path", required=True),
            prompts=dict(type="list", elements="str", required=True),
            max_new_tokens=dict(type="int", default=16, no_log=False),
            dtype=dict(type="str", default="float32", choices=["float32", "bfloat16", "float16"]),
            python=dict(type="path"),
            cache_dir=dict(type="path"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    if not os.path.isfile(os.path.join(p["model_path"], "config.json")):
        module.fail_json(msg="model_path: %s has no config.json; point it at a model revision directory"
                         % p["model_path"])
    if not p["prompts"]:
        module.fail_json(msg="prompts: give at least one prompt")
    if p["max_new_tokens"] < 1:
        module.fail_json(msg="max_new_tokens: must be >= 1")
    try:
        out, warnings = _reference.cached_reference(p["model_path"], p["prompts"], p["max_new_tokens"], p["dtype"],
                                                    python=p["python"], cache_dir=p["cache_dir"],
                                                    check_mode=module.check_mode)
    except _reference.ReferenceError_ as e:
        module.fail_json(msg=str(e), reason="cache_dir" if str(e).startswith("cache_dir:") else "reference")
    for w in warnings:
        module.warn(w)
    module.exit_json(changed=False, **out)


if __name__ == "__main__":
    main()
