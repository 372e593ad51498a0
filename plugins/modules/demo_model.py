#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: demo_model
short_description: Generate a tiny deterministic Llama checkpoint offline
version_added: "0.1.0"
description:
  - Writes a small Llama causal LM (transformers layout) to C(<models_root>/<name>/<revision>) with a byte-level
    BPE tokenizer trained offline, several safetensors shards, C(model.safetensors.index.json) and a
    C(SHA256SUMS) manifest. Nothing is downloaded.
  - The same inputs give bit-identical files; the revision is derived from the content (first 12 hex of the
    sha256 of C(SHA256SUMS)). The directory is written under a temporary name and renamed into place.
  - Requires numpy, safetensors and tokenizers on the target.
requirements:
  - numpy, safetensors and tokenizers on the host that runs the module
options:
  models_root:
    description: Directory that holds models as C(<name>/<revision>) (the shared filesystem in the demo).
    type: path
    required: true
  name:
    description: Model name (directory name).
    type: str
    default: tiny-llama
  seed:
    description: Seed of the weights.
    type: int
    default: 0
  vocab_size:
    description: Target tokenizer vocabulary size (the trained vocabulary can be smaller).
    type: int
    default: 512
  hidden_size:
    description: Hidden size. With O(num_heads) it gives the head dimension (64 by default; the vLLM CPU attention rejects 16).
    type: int
    default: 128
  intermediate_size:
    description: MLP intermediate size.
    type: int
    default: 256
  num_layers:
    description: Number of decoder layers.
    type: int
    default: 2
  num_heads:
    description: Attention heads (and key/value heads).
    type: int
    default: 2
  num_shards:
    description: Number of safetensors shards.
    type: int
    default: 3
extends_documentation_fragment:
  - llmops.serving.attributes
attributes:
  check_mode:
    support: full
    details: Builds the files in memory and reports the revision and whether it would be written; writes nothing.
  diff_mode:
    support: none
author:
  - LLMOps Serving maintainers (@llmops-serving)
"""

EXAMPLES = r"""
- name: Generate the demo model on the shared filesystem
  llmops.serving.demo_model:
    models_root: /var/tmp/llmops/shared/models
  register: demo
"""

RETURN = r"""
path:
  description: Directory of the generated revision.
  returned: always
  type: str
revision:
  description: Content-derived revision.
  returned: always
  type: str
  sample: 8f94f6f0fade
files:
  description: File names in the revision.
  returned: always
  type: list
  elements: str
bytes:
  description: Total size of the files.
  returned: always
  type: int
"""

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.llmops.serving.plugins.module_utils.engine import _demo_model


def main():
    module = AnsibleModule(
        argument_spec=dict(
            models_root=dict(type="path", required=True),
            name=dict(type="str", default="tiny-llama"),
            seed=dict(type="int", default=0),
            vocab_size=dict(type="int", default=512),
            hidden_size=dict(type="int", default=128),
            intermediate_size=dict(type="int", default=256),
            num_layers=dict(type="int", default=2),
            num_heads=dict(type="int", default=2),
            num_shards=dict(type="int", default=3),
        ),
        supports_check_mode=True,
    )
    p = module.params
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_shards"):
        if p[key] < 1:
            module.fail_json(msg="%s: must be a positive integer (got %d)" % (key, p[key]))
    if p["hidden_size"] % p["num_heads"]:
        module.fail_json(msg="hidden_size: %d is not divisible by num_heads %d" % (p["hidden_size"], p["num_heads"]))
    if "/" in p["name"] or p["name"] in (".", ".."):
        module.fail_json(msg="name: %r must be a single directory name" % p["name"])
    try:
        info = _demo_model.generate_model(
            p["models_root"], name=p["name"], seed=p["seed"], check_mode=module.check_mode,
            vocab_size=p["vocab_size"], hidden_size=p["hidden_size"], intermediate_size=p["intermediate_size"],
            num_layers=p["num_layers"], num_heads=p["num_heads"], num_shards=p["num_shards"])
    except ImportError as e:
        module.fail_json(msg=missing_required_lib(str(e.name or e)), exception=str(e))
    except OSError as e:
        module.fail_json(msg="models_root: cannot write %s: %s" % (p["models_root"], e))
    module.exit_json(**info)


if __name__ == "__main__":
    main()
