#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: release_check
short_description: Fail when the collection that runs a job is not the build of its playbooks
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
  - A version alone does not tell two builds apart (C(galaxy.yml) kept one version for many commits), so the check
    then compares the build identity, the commit the artifact was built from (C(meta/build_identity.json), written
    into the built tree by the build recipe of C(make install) and C(make ee) and listed in the artifact's
    C(FILES.json)), with the playbooks' revision (O(playbook_revision), else the C(HEAD) of the git checkout at
    O(playbook_release_dir)). Same commit passes; another commit fails naming both and the fix (rebuild the
    execution environment from the playbooks' commit, or pin the project's C(scm_branch) to the build's commit).
    A build from uncommitted changes passes only when every shipped file is the playbooks' tree's file.
  - When it cannot tell (no build identity, a source tree, no playbooks' revision, a build from uncommitted changes
    whose files cannot be compared) the verdict is V(unknown) with the reason; it fails when O(require_identity) is
    on and warns otherwise. The collection's own playbooks (the same directory on both sides) always pass.
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
  playbook_revision:
    description:
      - The commit of the playbooks (40 or 64 hex digits). Under AWX pass C(awx_project_revision), the project's
        revision AWX gives every job (AWX copies the project into the job without its C(.git)).
      - Default is the C(HEAD) commit of the git checkout whose root is O(playbook_release_dir); uncommitted
        changes there are not seen.
    type: str
  require_identity:
    description:
      - Fail when the check cannot tell whether the collection is the playbooks' build (verdict V(unknown)); when
        off, it warns and the job goes on.
      - C(playbooks/tasks/release_check.yml) turns it on in AWX jobs (C(awx_job_id) is defined), where the
        execution environment's artifact and the project's revision are both known unless something is wrong.
    type: bool
    default: true
extends_documentation_fragment:
  - llmops.serving.attributes.internal_action
attributes:
  check_mode:
    details: Only reads two small files; runs the same in check mode.
author:
  - LLMOps Serving maintainers (@llmops-serving)
"""

EXAMPLES = r"""
- name: Check that the collection is the build of the playbooks
  llmops.serving.release_check:
    playbook_release_dir: "{{ playbook_dir }}/.."
    playbook_revision: "{{ awx_project_revision | default(omit) }}"
    require_identity: "{{ awx_job_id is defined }}"
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
verdict:
  description: >-
    The build identity's verdict: V(ok) (the same commit, the same files, or the same directory), V(mismatch) or
    V(unknown).
  returned: when both releases were read
  type: str
  sample: ok
verdict_reason:
  description: >-
    Why: V(same_commit), V(same_files), V(same_tree); V(commit_mismatch), V(files_differ); or, when it cannot tell,
    V(source_tree), V(no_build_identity), V(identity_not_in_artifact), V(invalid_build_identity),
    V(build_not_from_git), V(no_playbook_revision), V(invalid_playbook_revision), V(dirty_build).
  returned: when both releases were read
  type: str
  sample: same_commit
build_commit:
  description: The commit the running collection was built from, when known.
  returned: when both releases were read
  type: str
  sample: 0fb4490e1f0a4c1d6c7b8f3a2e9d5c4b3a2f1e0d
build_dirty:
  description: Whether that build had uncommitted changes, when known.
  returned: when both releases were read
  type: bool
build_identity_file:
  description: The build identity file of the running collection.
  returned: when both releases were read
  type: str
  sample: /usr/share/ansible/collections/ansible_collections/llmops/serving/meta/build_identity.json
playbooks_revision:
  description: The playbooks' commit, when known.
  returned: when both releases were read
  type: str
  sample: 0fb4490e1f0a4c1d6c7b8f3a2e9d5c4b3a2f1e0d
playbooks_revision_source:
  description: Where it was read, V(playbook_revision) or V(git HEAD).
  returned: when both releases were read
  type: str
  sample: playbook_revision
file:
  description: On failure, the file that is missing, unreadable or of another release or build.
  returned: failure
  type: str
reason:
  description: >-
    On failure, V(missing), V(unreadable), V(invalid) or V(mismatch) (the releases), V(commit_mismatch) or
    V(files_differ) (another build), or V(identity_unknown) (it cannot tell and O(require_identity) is on).
  returned: failure
  type: str
  sample: commit_mismatch
"""
