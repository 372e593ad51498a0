#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: serving_record
short_description: Record, or read back, the revision a local engine was proven to serve
version_added: "0.1.0"
description:
  - V(present) writes C(<run_dir>/<name>.serving.json) after the engine answered correctly, with the model
    directory it loads (O(model_path), a staged revision C(<dest_root>/<model>/<revision>)) and the running
    engine's O(spec_hash) (C(engine_process)'s hash of command, environment and working directory; no value is
    stored).
  - V(read) returns the record of the engine that runs now. It fails with RV(reason=no_record) when nothing was
    recorded and RV(reason=record_mismatch) when the running engine has another O(spec_hash) than the recorded one
    (it was restarted by other means), because an upgrade restores only what it knows exactly.
  - The record is written atomically and read back as untrusted input (a regular file, size and type checks).
options:
  run_dir:
    description: The engine's run directory (C(engine_process)'s O(run_dir)).
    type: path
    required: true
  name:
    description: The engine's process name (C(engine_process)'s O(name)).
    type: str
    required: true
  state:
    description: V(present) writes the record, V(read) returns it.
    type: str
    choices: [present, read]
    default: read
  model_path:
    description: The revision directory the engine loads. Required with O(state=present).
    type: path
  spec_hash:
    description: The running engine's C(spec_hash) from C(engine_process). Required for both states.
    type: str
    required: true
extends_documentation_fragment:
  - llmops.serving.attributes
attributes:
  check_mode:
    support: full
    details: V(present) reports whether the record would change and writes nothing; V(read) runs the same.
  diff_mode:
    support: none
author:
  - LLMOps Serving maintainers (@llmops-serving)
"""

EXAMPLES = r"""
- name: Record what the engine was proven to serve
  llmops.serving.serving_record:
    run_dir: /var/tmp/llmops/run
    name: engine
    state: present
    model_path: /var/tmp/llmops/nvme/models/tiny-llama/8f94f6f0fade
    spec_hash: "{{ engine_proc.spec_hash }}"

- name: What serves now (before an upgrade changes it)
  llmops.serving.serving_record:
    run_dir: /var/tmp/llmops/run
    name: engine
    spec_hash: "{{ engine_status.spec_hash }}"
  register: serving_a
"""

RETURN = r"""
record:
  description: The record, C(model_path), C(model), C(revision) and C(spec_hash).
  returned: success
  type: dict
  sample: {model_path: /var/tmp/llmops/nvme/models/tiny-llama/8f94f6f0fade, model: tiny-llama,
           revision: 8f94f6f0fade, spec_hash: 5d41402abc4b}
path:
  description: The record file.
  returned: always
  type: str
reason:
  description: Why the record cannot be used (V(no_record), V(record_mismatch), V(bad_record), V(bad_model_path),
    V(bad_spec_hash)).
  returned: on failure
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmops.serving.plugins.module_utils.engine import _serving


def main():
    module = AnsibleModule(
        argument_spec=dict(
            run_dir=dict(type="path", required=True),
            name=dict(type="str", required=True),
            state=dict(type="str", choices=["present", "read"], default="read"),
            model_path=dict(type="path"),
            spec_hash=dict(type="str", required=True),
        ),
        required_if=[("state", "present", ("model_path",))],
        supports_check_mode=True,
    )
    p = module.params
    path = _serving.record_path(p["run_dir"], p["name"])
    try:
        if p["state"] == "present":
            record = _serving.describe(p["model_path"], p["spec_hash"])
            changed = _serving.write(p["run_dir"], p["name"], record, check_mode=module.check_mode)
        else:
            record, changed = _serving.current(p["run_dir"], p["name"], p["spec_hash"]), False
    except _serving.ServingError as e:
        module.fail_json(msg=str(e), reason=e.reason, path=path)
    except OSError as e:
        module.fail_json(msg="run_dir: cannot write %s: %s" % (path, e.strerror or e), reason="write_failed", path=path)
    module.exit_json(changed=changed, record=record, path=path)


if __name__ == "__main__":
    main()
