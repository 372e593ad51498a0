#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_stage
short_description: Stage a model revision from a shared filesystem to node-local disk, verified and resumable
version_added: "0.1.0"
description:
  - Copies the revision directory O(src) (read-only, authoritative) to O(dest) on local NVMe so engines
    load from local disk instead of every rank reading the shared filesystem.
  - The copy is built in C(<dest>.partial/) and published with one C(rename) together with the completion
    marker C(<dest>/.llmops-staged.json). Nothing half-copied is ever visible at O(dest).
  - The marker identifies every file by content and identity, not by size and mtime - its size, the sha256 of
    its safetensors header (O(verify=headers) and O(verify=sha256)), its sha256 where O(verify=sha256)
    computed one, the source file's device, inode, mtime and ctime, and the copy's inode, size, mtime and
    ctime at publish. Two revisions with identical shapes and mtimes never reuse each other's files.
  - A re-run only C(lstat)s O(src) and O(dest) (no data or header is read) and reports C(changed=false) when
    every copy is intact and of the same source file. A copy removed, resized or rewritten after publish, or
    whose source file is no longer the one it was copied from, is staged again, alone (RV(restaged_files));
    the intact files are hard-linked into the new build and the revision is republished. Files in O(dest)
    that O(src) does not have are dropped the same way. A directory holding only a copied marker is not
    staged.
  - A killed copy resumes, from the same O(src) or another one; a file completed before the kill is reused
    only when C(<dest>.partial/.llmops-staged.journal) proves it is a copy of today's source file.
  - One run at a time owns O(dest) through C(<dest>.lock) (O(dest)'s parent resolved, so every spelling of
    O(dest) shares it); a second run waits and then finds the revision published. O(state=absent) and pruning
    take the same lock and delete the lock file only while holding it.
  - O(src) is only read. Before anything changes the module refuses O(dest), C(<dest>.partial),
    C(<dest>.lock), O(progress_file) or O(fleet_slots_dir) inside O(src) or containing it, and O(checksums) or
    O(progress_file) inside O(dest), after resolving symlinks. An O(dest) that is a symlink is refused
    (publishing there would change the revision it points to).
  - At most O(read_streams) files of O(src) are open at once on this host; with O(fleet_slots_dir) every
    stream also holds a lease in that shared directory, capping readers across all hosts and all
    concurrent runs at O(fleet_read_streams). The safetensors headers, the index and the manifest read before
    the copy (a few KiB per file) hold no lease.
  - Copies use C(O_DIRECT) through one aligned buffer per stream where the filesystems allow it (see
    O(direct_io)), otherwise C(copy_file_range) (falling back to C(sendfile), then read/write). With
    O(verify=sha256) the single read also feeds the hash.
options:
  src:
    description:
      - Revision directory on the shared filesystem. Never written, moved or deleted.
      - It must hold regular files. A file symlink is followed when its target is inside O(src). A symlink
        that leaves O(src), a directory symlink (not followed, it could leave O(src) or loop), a dangling link,
        a FIFO, socket or device, an unreadable directory, and a name the module reserves (top-level names
        starting with C(.llmops-staged), any name ending in C(.llmops-part)) are refused, naming the path.
      - A name that is not valid UTF-8, or that the O(dest) filesystem cannot hold with the suffix the module
        adds while copying (C(.llmops-part), so a name over NAME_MAX less 12 bytes; NAME_MAX is 255 bytes on ext4 and XFS), or
        a path under C(<dest>.partial) over PATH_MAX, is refused before the lock is taken or anything is
        written, naming the file and the limit (C(reason) V(not_utf8), V(name_too_long), V(path_too_long)).
    type: path
    required: true
  dest:
    description:
      - Published revision directory on local disk, usually C(<root>/<name>/<revision>).
      - Must not be a symlink, inside O(src) or contain it. Its name with the longest suffix the module puts
        beside it (C(.removing-XXXXXXXX), 18 bytes) must fit the filesystem's NAME_MAX.
    type: path
    required: true
  state:
    description:
      - V(present) stages the revision.
      - V(absent) removes O(dest) (and any C(<dest>.partial)) under C(<dest>.lock); refused when O(dest) is
        listed in O(pinned), when it was not staged by this module (no marker file), or when a process uses it
        by any path, found under O(proc_root) by device and inode - an open file, a mapping, its working or root
        directory, or a bind mount in another mount namespace (how pods mount it). The error names the pid and
        how it uses O(dest).
    type: str
    choices: [present, absent]
    default: present
  verify:
    description:
      - V(size) compares sizes only.
      - V(headers) parses every C(*.safetensors) header (8-byte length + JSON) and checks that the file size is
        8 + N + the largest data offset, that every tensor spans shape x dtype bytes, that tensors do not
        overlap, and that every tensor named in C(model.safetensors.index.json) exists in the shard it names.
        The copy's header is compared with the source's, so no second full read is needed.
      - V(sha256) does the header checks and hashes every file during the copy against O(checksums).
    type: str
    choices: [size, headers, sha256]
    default: headers
  checksums:
    description:
      - A C(sha256sum)-format manifest (C(<hex>  <relative path>) per line) used by O(verify=sha256).
      - Defaults to C(SHA256SUMS) in O(src) when that file exists. Every file of O(src) except the manifest must
        be listed, by its path relative to O(src) (absolute names and C(..) are refused). Must not be inside
        O(dest).
    type: path
  read_streams:
    description:
      - Most files of O(src) this host reads at once (also the most fleet slots it holds).
      - Each stream keeps one 4 MiB read in flight on O(src) while it hashes and writes the 4 MiB before with
        O_DIRECT (three aligned buffers a stream; 4 MiB is one whole request on a disk that takes 4 MiB at once),
        the safetensors header is compared in those buffers, and a copied file is fsynced and renamed beside the
        streams. The default, 4, is the measured one (C(docs/benchmarks/model_stage.md)). On one local disk 4
        streams staged a 3 GiB, 48-shard revision at 0.53 times the disk's limit for reads and writes at once on a
        quiet host and 0.80 times under heavy load; from a source in RAM at 0.65 times the parallel direct write
        (quiet; 1.42 times under heavy load, where the host's CPUs, not the disk, were short). 8 streams were
        level with 4 in the same alternating rounds on a quiet host, and on one disk no faster under load. Raise
        it for a source whose single stream is slow (a network filesystem far away); lower it when many hosts
        read O(src) at once and O(fleet_read_streams) does not already cap them.
    type: int
    default: 4
  fleet_slots_dir:
    description:
      - Lease directory on the shared filesystem that caps concurrent readers fleet-wide. Every host and every
        concurrent run must use the same directory and the same O(fleet_read_streams). Must not overlap O(src)
        or O(dest).
      - Leases are exclusive-create files with a heartbeat; a lease whose holder died (same host) or that
        has not been refreshed for O(fleet_stale_seconds) is taken over.
    type: path
  fleet_read_streams:
    description: Fleet-wide cap on concurrent read streams. Required with O(fleet_slots_dir); ignored without it.
    type: int
  fleet_host_id:
    description: Name this host uses in its leases. Defaults to the hostname.
    type: str
  fleet_stale_seconds:
    description: A lease unchanged for this long (seen by a waiter) is considered abandoned.
    type: float
    default: 60.0
  min_free_bytes:
    description:
      - The copy refuses to start unless the dest filesystem keeps this many bytes free after it, computed
        from the real sizes of the files still to copy.
    type: int
    default: 0
  progress_file:
    description:
      - JSON file rewritten every second while copying, with C(bytes_done), C(bytes_total), C(files_done),
        C(files_total), C(rate_bytes_per_second), C(eta_seconds), C(percent) and a readable C(message).
      - Must be outside O(src) and O(dest).
    type: path
  fsync:
    description: Flush every copied file and the directories to disk before publishing.
    type: bool
    default: true
  direct_io:
    description:
      - Read O(src) and write O(dest) with C(O_DIRECT) where the filesystems allow it, through one aligned
        4 MiB buffer per stream (hashed there when O(verify=sha256)). This keeps a multi-hundred-GiB copy out
        of the node's page cache and the kernel's copy loop off the CPUs.
      - A filesystem that refuses C(O_DIRECT) (at open or on a read or write) gets buffered I/O for that file,
        and the copy goes on; RV(direct_io_files) counts the files that went direct at both ends.
      - V(false) always uses buffered I/O (C(copy_file_range) where it works).
    type: bool
    default: true
  lock_timeout:
    description:
      - Seconds to wait for another run holding the lock on O(dest), and for each fleet read slot
        (O(fleet_slots_dir)); past that the run fails naming the lease directory and the hosts holding its slots.
    type: int
    default: 3600
  keep_revisions:
    description:
      - After staging, keep this many staged revisions in the parent directory of O(dest) (newest first, O(dest)
        included) and remove older ones that are neither pinned nor in use (see O(state=absent)). Only real
        directories with a valid marker count; O(src) and O(checksums) are never removed. V(0) removes nothing.
      - Newest means last published on this host, by the sequence number each marker records when its revision
        is published; no clock takes part (a revision staged while the clock was wrong keeps its place).
        Revisions whose marker has no sequence (staged by an older version) count as older than all others,
        in the order of their C(staged_at).
    type: int
    default: 0
  pinned:
    description:
      - Revisions never removed, by O(state=absent) or O(keep_revisions), as directory names (revision ids, an
        entry without C(/); the name of a symlink beside the revisions, such as C(current), pins the revision it
        points at) or paths (relative ones from the working directory). A path names a revision
        however it is spelt - a symlinked root, a trailing slash, C(..), C(//), a bind mount - compared by device
        and inode, never as a string.
      - Names are compared after Unicode normalisation (NFC), so a pin typed as C(café) protects a directory
        stored as C(cafe) plus a combining accent (as copied from macOS) and the other way round.
      - A pin that names no staged revision beside O(dest) protects nothing; it is returned in
        RV(unmatched_pins) with a warning.
    type: list
    elements: str
    default: []
  read_rate_limit:
    description:
      - Most bytes per second each read stream takes from O(src) (the copy, and pieces read there during a
        fan-out). With O(read_streams) and O(fleet_read_streams) it bounds the load on the shared filesystem.
        V(0) does not limit.
    type: int
    default: 0
  record_pieces:
    description:
      - Record the sha256 of every O(piece_size) piece of each file in the marker, computed from the bytes read
        from O(src) during the copy, so that this host can seed a fan-out (M(llmops.serving.model_stage_peer)
        serves them). Costs a sha256 of every byte copied.
      - A staged file without piece digests (staged before, or at another O(piece_size)) gets them read back
        from the staged copy, which the marker proves intact and of this source; O(src) is not read again
        (RV(pieces_read_back)).
    type: bool
    default: false
  piece_size:
    description:
      - Piece size of a fan-out in bytes, a multiple of 4096; the same on every host of the run. A seed hands a
        piece on as soon as it is written, so a smaller piece means a shorter delay per hop.
    type: int
    default: 67108864
  peers:
    description:
      - Receive the files to copy from these peers (their M(llmops.serving.model_stage_peer) servers) instead of
        reading O(src), two pieces per O(read_streams) at once from the least loaded peers holding them (a seed
        is asked, one at a time while other peers are there, for pieces it has sent nobody yet, with a header that
        makes it refuse one it sent since its last piece list, so its uplink carries each piece about once and the
        receivers trade the rest). Each piece is accepted
        only when its sha256 equals the digest a peer marked O(peers[].seed) recorded for it while reading
        O(src), and a seed's digests for a file only when its entry has the identity this host sees in O(src)
        (size, inode, mtime, ctime, safetensors header digest). Digests from other peers are never used.
      - A piece is written in place with C(O_DIRECT) into C(<dest>.partial) and handed on at once by this host's
        own server. A peer that stops answering or sends a bad piece is dropped (RV(peers_dropped),
        RV(bad_pieces_rejected)) and the piece fetched elsewhere. A piece is read from O(src) (under the fleet
        read slots and O(read_rate_limit)) only when no seed can provide it any more (every seed dropped,
        failed, or not seen within 120 s, or copying but listing no new piece for 30 s plus one piece's time at
        4 MiB/s, or at O(read_rate_limit) where that is lower), or when no seed's entry matches the source. A
        seed is judged by the pieces it holds, not by how late its board is rewritten on a loaded host.
      - Files get the checks of a copy (size, headers, sha256 with O(verify=sha256)) before they get their
        names; resume, publish, marker and pruning are those of a copy. Implies recording piece digests.
    type: list
    elements: dict
    suboptions:
      url:
        description: The peer's revision URL, C(http://<address>:<port>/r/<name>/<revision>).
        type: str
        required: true
      seed:
        description: The peer stages this revision from O(src) itself; only seeds' piece digests are trusted.
        type: bool
        default: false
  peer_token:
    description: The run's token the peers' servers expect (C(Authorization Bearer)). Required with O(peers).
    type: str
  peer_rate_limit:
    description: Most bytes per second each stream takes from one peer. V(0) does not limit.
    type: int
    default: 0
extends_documentation_fragment:
  - llmops.serving.attributes
  - llmops.serving.node.proc_root
attributes:
  check_mode:
    support: full
    details: Reads and verifies O(src) and reports what would be copied and removed; writes nothing.
  diff_mode:
    support: full
    details: Shows the staged file list (path and size) before and after.
author:
  - LLMOps Serving maintainers (@llmops-serving)
"""

EXAMPLES = r"""
- name: Stage a revision to local NVMe, at most 16 shared-FS readers across the fleet
  llmops.serving.model_stage:
    src: /mnt/shared/models/glm-5.2-fp8/3f2a9c1d7e44
    dest: /mnt/nvme/models/glm-5.2-fp8/3f2a9c1d7e44
    read_streams: 4
    fleet_slots_dir: /mnt/shared/.llmops/stage-slots
    fleet_read_streams: 16
    min_free_bytes: "{{ 50 * 1024 ** 3 }}"
    progress_file: /var/tmp/llmops/stage-glm.json
    keep_revisions: 2
    pinned: [3f2a9c1d7e44]

- name: Verify every byte against SHA256SUMS shipped with the revision
  llmops.serving.model_stage:
    src: /mnt/shared/models/tiny-llama/abc123
    dest: /mnt/nvme/models/tiny-llama/abc123
    verify: sha256

- name: Remove an old revision (refused while an engine maps it)
  llmops.serving.model_stage:
    src: /mnt/shared/models/tiny-llama/old
    dest: /mnt/nvme/models/tiny-llama/old
    state: absent
"""

RETURN = r"""
dest:
  description: Absolute path of the published revision.
  returned: always
  type: str
files_total:
  description: Files in O(src).
  returned: state=present
  type: int
files_copied:
  description: Files copied by this run (would be copied, in check mode).
  returned: state=present
  type: int
files_skipped:
  description: Files already staged, or complete and verified in C(<dest>.partial) from an interrupted run.
  returned: state=present
  type: int
copied_files:
  description: Relative paths counted in RV(files_copied).
  returned: state=present
  type: list
  elements: str
restaged_files:
  description:
    - Files of the previously published revision that this run copies again, each with C(path) and
      C(reason) (for example C(removed from dest after publish), C(resized in dest after publish),
      C(rewritten in dest after publish), C(its source file is not the one staged), or the published copy
      failing a stronger O(verify)).
  returned: state=present
  type: list
  elements: dict
reason:
  description:
    - Why the published revision was not reused as it was, in one line (C(not staged yet), C(not staged) with
      what is wrong with the marker, files staged again, files new in O(src), files in O(dest) that O(src) does
      not have, or the marker refreshed after a O(verify) upgrade); V(null) when nothing changed.
  returned: state=present
  type: str
bytes_total:
  description: Bytes in O(src) (real file sizes).
  returned: state=present
  type: int
bytes_copied:
  description: Bytes copied by this run (would be copied, in check mode).
  returned: state=present
  type: int
seconds:
  description: Wall time of the module.
  returned: state=present
  type: float
read_bytes_per_second:
  description: RV(bytes_copied) divided by the copy phase's wall time.
  returned: state=present
  type: float
verify:
  description: Verification mode used.
  returned: state=present
  type: str
peak_read_streams:
  description: Most files of O(src) this run had open at once.
  returned: state=present
  type: int
fleet_wait_seconds:
  description: Seconds read streams spent waiting for a fleet slot, summed over streams.
  returned: state=present
  type: float
direct_io_files:
  description: Files this run copied with C(O_DIRECT) on both O(src) and O(dest) (see O(direct_io)).
  returned: state=present
  type: int
pruned:
  description: Older revisions removed by O(keep_revisions) (would be removed, in check mode).
  returned: state=present
  type: list
  elements: str
bytes_from_source:
  description: Bytes of file data this run read from O(src) (copies and pieces read there).
  returned: state=present
  type: int
bytes_from_peers:
  description: Bytes of verified pieces this run received from O(peers).
  returned: state=present
  type: int
peers_used:
  description: URLs of the peers that sent this run at least one verified piece.
  returned: state=present
  type: list
  elements: str
bytes_per_peer:
  description: Verified bytes each peer sent this run, by URL (a seed's share shows how much of the revision left
    its uplink directly; the rest was traded among the receivers).
  returned: state=present
  type: dict
bad_pieces_rejected:
  description: Pieces from peers whose sha256 differed from the seed's digest (discarded and fetched elsewhere).
  returned: state=present
  type: int
peers_dropped:
  description:
    - Peers this run stopped using, each with C(url), C(reason), C(seed) and C(lied).
    - C(lied) is true for a peer whose bytes or digests the authority contradicted (a seed's digests, or, where
      two seeds disagreed, the shared filesystem's); a peer dropped for failing C(3) tries in a row (error
      answers, pieces listed but not served, stalls, malformed piece lists) or refusing the token has C(lied=false).
  returned: state=present
  type: list
  elements: dict
pieces_read_back:
  description: Staged files whose piece digests were read back from their copy (O(record_pieces)).
  returned: state=present
  type: int
unmatched_pins:
  description: Entries of O(pinned) that name no staged revision beside O(dest) (after Unicode normalisation),
    so they protected nothing; each is also warned about. Computed when O(keep_revisions) prunes.
  returned: state=present
  type: list
  elements: str
kept_in_use:
  description:
    - Older revisions O(keep_revisions) would remove but kept because a process uses them, each with C(path),
      C(pid), C(via) (C(fd), C(map), C(cwd), C(root), C(mount), or C(lock) when another run holds its lock and
      C(pid) is null) and C(file) (what the process holds, as it spells it).
  returned: state=present
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmops.serving.plugins.module_utils.common import _option_specs
from ansible_collections.llmops.serving.plugins.module_utils.common import _paths
from ansible_collections.llmops.serving.plugins.module_utils.stage import _safetensors
from ansible_collections.llmops.serving.plugins.module_utils.stage import _stage


def main():
    module = AnsibleModule(
        argument_spec=dict(
            src=dict(type="path", required=True),
            dest=dict(type="path", required=True),
            state=dict(type="str", choices=["present", "absent"], default="present"),
            verify=dict(type="str", choices=["size", "headers", "sha256"], default="headers"),
            checksums=dict(type="path"),
            read_streams=dict(type="int", default=4),
            fleet_slots_dir=dict(type="path"),
            fleet_read_streams=dict(type="int"),
            fleet_host_id=dict(type="str"),
            fleet_stale_seconds=dict(type="float", default=60.0),
            min_free_bytes=dict(type="int", default=0),
            progress_file=dict(type="path"),
            fsync=dict(type="bool", default=True),
            direct_io=dict(type="bool", default=True),
            lock_timeout=dict(type="int", default=3600),
            keep_revisions=dict(type="int", default=0),
            pinned=dict(type="list", elements="str", default=[]),
            **_option_specs.node("proc_root"),
            read_rate_limit=dict(type="int", default=0),
            record_pieces=dict(type="bool", default=False),
            piece_size=dict(type="int", default=64 * 1024 * 1024),
            peers=dict(type="list", elements="dict", options=dict(
                url=dict(type="str", required=True),
                seed=dict(type="bool", default=False))),
            peer_token=dict(type="str", no_log=True),
            peer_rate_limit=dict(type="int", default=0),
        ),
        required_by={"fleet_slots_dir": "fleet_read_streams"},
        supports_check_mode=True,
    )
    if module.params["peers"]:  # the one URL option; a run without peers does not import the HTTP client
        from ansible_collections.llmops.serving.plugins.module_utils.common import _http
        _http.refuse_url_credentials(module, {"peers[].url": "the peers' servers take the run's token through "
                                                             "peer_token (no_log)"})
    p = module.params
    for name in ("read_streams", "fleet_read_streams"):
        if p[name] is not None and p[name] < 1:
            module.fail_json(msg="%s: must be at least 1 (got %d)" % (name, p[name]))
    for name in ("min_free_bytes", "keep_revisions", "lock_timeout", "read_rate_limit", "peer_rate_limit"):
        if p[name] < 0:
            module.fail_json(msg="%s: must not be negative (got %d)" % (name, p[name]))
    try:
        if p["state"] == "absent":
            result = _stage.remove(p["dest"], pinned=p["pinned"], check_mode=module.check_mode,
                                   lock_timeout=p["lock_timeout"], proc_root=p["proc_root"])
        else:
            result = _stage.stage(
                p["src"], p["dest"], verify=p["verify"], checksums=p["checksums"],
                read_streams=p["read_streams"], fleet_slots_dir=p["fleet_slots_dir"],
                fleet_read_streams=p["fleet_read_streams"], fleet_host_id=p["fleet_host_id"],
                fleet_stale_seconds=p["fleet_stale_seconds"], min_free_bytes=p["min_free_bytes"],
                progress_file=p["progress_file"], check_mode=module.check_mode, diff=module._diff,
                lock_timeout=p["lock_timeout"], fsync=p["fsync"], keep_revisions=p["keep_revisions"],
                pinned=p["pinned"], proc_root=p["proc_root"], direct_io=p["direct_io"],
                read_rate_limit=p["read_rate_limit"], record_pieces=p["record_pieces"], piece_size=p["piece_size"],
                peers=p["peers"], peer_token=p["peer_token"], peer_rate_limit=p["peer_rate_limit"])
    except _safetensors.CheckpointError as e:
        module.fail_json(msg="verify: %s: %s; dest %s was left untouched" % (e.path, e.reason, p["dest"]),
                         file=e.path, reason=e.reason)
    except _stage.StageError as e:
        module.fail_json(msg=str(e), **dict((k, v) for k, v in (("file", e.file), ("reason", e.reason)) if v))
    except _paths.PathEscape as e:
        module.fail_json(msg=str(e))
    except OSError as e:
        module.fail_json(msg="%s: %s (dest %s)" % (getattr(e, "filename", None) or "io", e, p["dest"]))
    for pin in result.get("unmatched_pins") or ():
        module.warn("pinned: %r names no staged revision beside %s (names compared after Unicode NFC "
                    "normalisation), so it protects nothing; fix or remove the entry" % (pin, result["dest"]))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
