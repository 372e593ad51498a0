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
        out = _reference.greedy_reference(p["model_path"], p["prompts"], p["max_new_tokens"], p["dtype"],
                                          python=p["python"])
    except _reference.ReferenceError_ as e:
        module.fail_json(msg=str(e))
    module.exit_json(changed=False, **out)


if __name__ == "__main__":
    main()
