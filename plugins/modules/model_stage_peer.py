#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_stage_peer
short_description: Serve the verified pieces of staged revisions to peers during a fan-out
version_added: "0.1.0"
description:
  - Starts or stops a small read-only HTTP server on this node that hands the pieces of staged model revisions
    to other nodes staging the same revisions with M(llmops.serving.model_stage) and
    O(llmops.serving.model_stage#module:peers), so the shared filesystem serves each revision about once.
  - It serves only the revisions in O(revisions), and of each only the files listed in its published marker
    with piece digests at O(piece_size) and an intact copy, or listed in the board of the staging run still
    building it (C(<dest>.partial/.llmops-staged.pieces.json)), there only the pieces verified and written. A
    node so serves a piece onward as soon as it has verified it.
  - Every request needs C(Authorization Bearer) with the run's token, whose sha256 is compared in constant time
    with O(token_sha256); anything else gets 403. Paths are relative, without C(..), never through a symlink,
    and must be listed. Only C(GET) is answered; file data only for one byte range that lies in held pieces.
  - Connections that have not shown the token are bounded (the oldest is closed when too many are open), must
    send their request within 10 seconds, and a kept-alive connection is closed after 60 seconds without a
    request, so peers with the token are served while idle or slow connections are open.
  - The server is a daemon holding a lock on its pid file in O(state_dir) for its life; it exits on
    O(state=stopped), on SIGTERM, or after O(lifetime) seconds, whichever comes first. The server is given only
    the token's sha256, never the token, so nothing in its memory, files, environment or command line reveals it.
  - Starting it again with the same configuration (token included) changes nothing; another configuration
    replaces the running server.
options:
  state:
    description: V(started) starts (or keeps) the server, V(stopped) stops it.
    type: str
    choices: [started, stopped]
    default: started
  address:
    description: Data-plane address of this node to listen on (IPv4 or IPv6). Peers connect to it.
    type: str
    required: true
  port:
    description: TCP port to listen on.
    type: int
    required: true
  token_sha256:
    description:
      - The sha256 (64 hex digits) of the per-run secret the peers send as C(Authorization Bearer), for example
        C(token | hash('sha256')). Only receivers get the token itself. Required with O(state=started).
    type: str
  revisions:
    description:
      - The revisions served, each as C(http://<address>:<port>/r/<name>/<revision>).
    type: list
    elements: dict
    default: []
    suboptions:
      name:
        description: Model name (a directory name, no C(/)).
        type: str
        required: true
      revision:
        description: Revision (a directory name, no C(/)).
        type: str
        required: true
      dest:
        description:
          - The staged revision directory on this node (O(llmops.serving.model_stage#module:dest)).
          - An absolute path that names a directory, as O(llmops.serving.model_stage#module:dest) must (not C(/), not
            ending in C(.) or C(..)); another value fails before anything starts, naming C(revisions[<i>].dest).
        type: path
        required: true
  piece_size:
    description: Piece size of the fan-out, in bytes (a multiple of 4096); the same on every node of the run.
    type: int
    default: 67108864
  state_dir:
    description: Directory of the pid files (one per address and port), created with mode 0700.
    type: path
    default: /var/tmp/llmops/stage-peer
  lifetime:
    description: Seconds after which the server exits by itself, should nothing stop it. V(0) never.
    type: int
    default: 86400
extends_documentation_fragment:
  - llmops.serving.attributes
attributes:
  check_mode:
    support: full
    details: Reports whether the server would be started or stopped; starts and stops nothing.
  diff_mode:
    support: none
author:
  - LLMOps Serving maintainers (@llmops-serving)
"""

EXAMPLES = r"""
- name: Serve this node's staged revision to its peers
  llmops.serving.model_stage_peer:
    address: "{{ model_stage_fanout_address }}"
    port: 18700
    token_sha256: "{{ stage_token | hash('sha256') }}"
    revisions:
      - name: glm-5.2-fp8
        revision: 3f2a9c1d7e44
        dest: /mnt/nvme/models/glm-5.2-fp8/3f2a9c1d7e44
  no_log: true

- name: Stop it
  llmops.serving.model_stage_peer:
    address: "{{ model_stage_fanout_address }}"
    port: 18700
    state: stopped
"""

RETURN = r"""
pid:
  description: Process id of the server (started), or of the one stopped; null when none ran.
  returned: always
  type: int
url:
  description: C(http://<address>:<port>), the base of every revision's URL.
  returned: always
  type: str
revisions:
  description: The revisions served, as C(<name>/<revision>).
  returned: always
  type: list
  elements: str
"""


from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_fanout_wire
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage_peer
from ansible_collections.llmops.serving.plugins.module_utils.stage._stage_marker import StageError


def _url(address, port):
    return "http://%s:%d" % ("[%s]" % address if ":" in address else address, port)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", choices=["started", "stopped"], default="started"),
            address=dict(type="str", required=True),
            port=dict(type="int", required=True),
            token_sha256=dict(type="str", no_log=True),
            revisions=dict(type="list", elements="dict", default=[], options=dict(
                name=dict(type="str", required=True),
                revision=dict(type="str", required=True),
                dest=dict(type="path", required=True))),
            piece_size=dict(type="int", default=64 * 1024 * 1024),
            state_dir=dict(type="path", default="/var/tmp/llmops/stage-peer"),
            lifetime=dict(type="int", default=86400),
        ),
        required_if=[("state", "started", ("token_sha256",))],
        supports_check_mode=True,
    )
    p = module.params
    if not 0 < p["port"] < 65536:
        module.fail_json(msg="port: must be 1-65535 (got %d)" % p["port"], option="port", reason="bad_port")
    url = _url(p["address"], p["port"])
    try:
        revisions = _stage_peer.check_revisions(p["revisions"])
    except _stage_peer.PeerError as e:
        module.fail_json(msg=str(e), changed=False, pid=None, url=url, **e.fields())
    result = dict(changed=False, pid=None, url=url, revisions=sorted(revisions))
    cur = _stage_peer.running(p["state_dir"], p["address"], p["port"])
    if p["state"] == "stopped":
        if cur is not None:
            result.update(changed=True, pid=cur["pid"])
            if not module.check_mode:
                _stage_peer.stop(p["state_dir"], p["address"], p["port"])
        module.exit_json(**result)
    try:
        token_sha256 = _stage_peer.parse_token_sha256(p["token_sha256"])
    except _stage_peer.PeerError as e:
        module.fail_json(msg=str(e), **dict(result, **e.fields()))
    try:
        _stage_fanout_wire.check_options(piece_size=p["piece_size"])
    except ValueError as e:
        module.fail_json(msg=str(e), option="piece_size", reason="bad_piece_size", **result)
    if p["lifetime"] < 0:
        module.fail_json(msg="lifetime: must not be negative (got %d)" % p["lifetime"], option="lifetime",
                         reason="bad_lifetime", **result)
    if module.check_mode:
        digest = _stage_peer.config_digest(p["address"], p["port"], token_sha256, revisions, p["piece_size"])
        same = cur is not None and cur.get("config") == digest
        result.update(changed=not same, pid=cur["pid"] if cur else None)
        module.exit_json(**result)
    try:
        changed, rec = _stage_peer.start(p["state_dir"], p["address"], p["port"], token_sha256, revisions,
                                         p["piece_size"], p["lifetime"])
    except _stage_peer.PeerError as e:  # address/port taken, or the daemon did not report
        module.fail_json(msg=str(e), **dict(dict(result, reason="start_failed"), **e.fields()))
    except StageError as e:  # every refusal of the stage package is a failed result, never a traceback
        module.fail_json(msg=str(e), reason=e.reason or "refused", **result)
    except OSError as e:
        module.fail_json(msg=str(e), reason="start_failed", **result)
    result.update(changed=changed, pid=rec.get("pid"))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
