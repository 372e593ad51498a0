#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_stage_follow
short_description: Follow a background copy, printing bytes, rate and ETA at each poll
version_added: "0.1.0"
description:
  - Follows an async job (a task started with C(async) and C(poll) 0, such as M(llmops.serving.model_stage))
    until it ends, in one flat loop, and returns the job's own result. A job that failed makes this task fail
    with the job's C(msg).
  - Each poll is one shell command on the target reading the async job file (as M(ansible.builtin.async_status)
    reads it) and O(progress_file). While the job runs the task prints one line per poll on the controller
    (host, O(label), state, bytes done and total, percent, files, rate, ETA), built from the numbers and the
    state word in the progress file only. Once the
    job file no longer says running, M(ansible.builtin.async_status) returns the result.
  - Nothing grows with the number of polls, so a copy may be followed for days at any interval (a task file that
    includes itself once per poll fails with a recursion error after a few hundred polls).
  - A progress file that says V(done) or V(failed) while the job still runs is from an earlier run and is not
    shown. Connection errors during a poll are retried for up to 300 seconds; the job runs on regardless.
  - This is an action plugin; the copy itself runs on the target as the job being followed.
options:
  jid:
    description: The C(ansible_job_id) registered from the task started with C(async) and C(poll) 0.
    type: str
    required: true
  progress_file:
    description:
      - JSON progress file the job writes on the target (M(llmops.serving.model_stage) O(llmops.serving.model_stage#module:progress_file)),
        with C(bytes_done), C(bytes_total), C(files_done), C(files_total), C(rate_bytes_per_second), C(eta_seconds)
        and C(state).
      - Without it, each poll prints only how long the job has run.
    type: str
  poll_interval:
    description: Seconds between polls (and progress lines). Fractions are allowed.
    type: float
    default: 10
  timeout:
    description:
      - Most seconds to follow the job; then the task fails and the job is left running. V(0) follows until it ends.
      - The async wrapper already ends the job at its C(async) limit; set this a little above that limit to bound
        a wrapper that was killed and will never report.
    type: float
    default: 0
  label:
    description: Prefix of each progress line (for example C(name@revision)); defaults to the job id.
    type: str
    default: ""
  cleanup:
    description: Remove the job's status file on the target once the result has been read.
    type: bool
    default: true
extends_documentation_fragment:
  - llmops.serving.attributes
  - llmops.serving.attributes.flow
attributes:
  action:
    support: full
    details: The polling loop runs on the controller; the target only answers one shell command per poll.
  async:
    support: none
  check_mode:
    support: full
    details:
      - Reads the job's files the same way in check mode (a job started in check mode is followed the same way).
      - With O(cleanup) the job's status file is removed once its result is read, in check mode too.
  diff_mode:
    support: none
author:
  - LLMOps Serving maintainers (@llmops-serving)
"""

EXAMPLES = r"""
- name: Stage in the background
  llmops.serving.model_stage:
    src: /mnt/shared/models/glm-5.2-fp8/3f2a9c1d7e44
    dest: /mnt/nvme/models/glm-5.2-fp8/3f2a9c1d7e44
    progress_file: /var/tmp/llmops/stage-progress/glm-5.2-fp8.json
  async: 21600
  poll: 0
  register: stage_job

- name: Follow it, one progress line every 10 seconds, failing if the copy failed
  llmops.serving.model_stage_follow:
    jid: "{{ stage_job.ansible_job_id }}"
    progress_file: /var/tmp/llmops/stage-progress/glm-5.2-fp8.json
    poll_interval: 10
    timeout: 21700
    label: glm-5.2-fp8@3f2a9c1d7e44
  register: stage_result
"""

RETURN = r"""
polls:
  description: Polls made until the job ended.
  returned: always
  type: int
  sample: 361
ansible_job_id:
  description: The job followed.
  returned: always
  type: str
  sample: "j208403914235.4711"
msg:
  description: The job's message; when this task itself gave up (timeout, unreachable target), why.
  returned: when the job or this task failed
  type: str
"""
