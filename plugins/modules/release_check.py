#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: release_check
short_description: Fail when the collection that runs a job is not the release of its playbooks
version_added: "0.1.0"
description:
  - Under AWX the playbooks come from the project (synced to a branch) and the roles and modules from the execution
    environment (built from some commit). This check, imported at the top of every playbook a job template runs
    (C(playbooks/tasks/release_check.yml)), compares the two releases and fails before anything changes when they
    differ, naming both and the fix (rebuild the execution environment from the playbooks' commit, or sync the
    project to the execution environment's release).
  - The running collection's release is read from its own C(MANIFEST.json) (an installed collection) or
    C(galaxy.yml) (a source tree); the playbooks' release from the same files in O(playbook_release_dir).
    Nothing is hard-coded.
  - This is an action plugin; it runs on the controller (the execution environment under AWX) and needs no
    connection to the target.
options:
  playbook_release_dir:
    description:
      - The root of the release the playbooks belong to, usually C({{ playbook_dir }}/..) (a project checkout with
        C(galaxy.yml), or an installed collection with C(MANIFEST.json)).
    type: path
    required: true
  collection_dir:
    description:
      - The root of the collection to compare. Default is the collection this check belongs to, the one running
        the job.
    type: path
extends_documentation_fragment:
  - llmops.serving.attributes.internal_action
attributes:
  check_mode:
    details: Only reads two small files; runs the same in check mode.
author:
  - LLMOps Serving maintainers (@llmops-serving)
"""

EXAMPLES = r"""
- name: Check that the collection matches the playbooks' release
  llmops.serving.release_check:
    playbook_release_dir: "{{ playbook_dir }}/.."
  run_once: true
"""

RETURN = r"""
collection:
  description: The running collection, C(namespace.name).
  returned: when both releases were read
  type: str
  sample: llmops.serving
collection_version:
  description: The running collection's version.
  returned: when both releases were read
  type: str
  sample: 0.1.0
collection_file:
  description: The file the running collection's release was read from.
  returned: when both releases were read
  type: str
  sample: /usr/share/ansible/collections/ansible_collections/llmops/serving/MANIFEST.json
playbooks_collection:
  description: The collection the playbooks belong to, C(namespace.name).
  returned: when both releases were read
  type: str
  sample: llmops.serving
playbooks_version:
  description: The playbooks' release.
  returned: when both releases were read
  type: str
  sample: 0.1.0
playbooks_file:
  description: The file the playbooks' release was read from.
  returned: when both releases were read
  type: str
  sample: /runner/project/galaxy.yml
file:
  description: On failure, the file that is missing, unreadable or of another release.
  returned: failure
  type: str
reason:
  description: On failure, C(missing), C(unreadable), C(invalid) or C(mismatch).
  returned: failure
  type: str
  sample: mismatch
"""
