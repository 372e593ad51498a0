#!/usr/bin/env bash
# Build the execution environment of execution-environment.yml without a registry or a package index inside the
# build, then run one job through the route AWX uses (ansible-runner transmit | worker in the EE | process).
#
#   bash awx/ee/build.sh            (make ee)
#
# Needs: docker (a running daemon), debootstrap, root (debootstrap and docker), the repository's .venv
# (ansible-builder, ansible-runner, ansible-galaxy) and pip access to the Python package index on the host.
# Environment: EE_SUITE (Debian suite of the base; default: the host's), EE_MIRROR (default: the host's first
# apt source), EE_REBUILD_BASE=1 (debootstrap again even when the base image exists), EE_TEMPLATE / EE_ANSWERS
# (the job template of awx/controller_templates.yml run at the end, and its survey answers as JSON).
# Work files go to .build/ee/ (collections, wheels, build context, the job's private data dir and its output).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PY=${PYTHON:-$ROOT/.venv/bin/python}
BIN=$(dirname "$PY")
WORK=$ROOT/.build/ee   # execution-environment.yml's additional_build_files point here
TEMPLATE=${EE_TEMPLATE:-llmops stage model}
# The stage template's survey, answered for a small synthetic revision (tiny-ee@r1, 16 MiB, written below onto
# the job's shared filesystem). EE_ANSWERS= (empty) sends the survey defaults, as AWX's launch form does.
ANSWERS=${EE_ANSWERS-'{"stage_model_name": "tiny-ee", "stage_model_revision": "r1", "model_stage_verify": "sha256", "model_stage_read_streams": 2, "model_stage_keep_revisions": 2}'}

say() { printf '%s ee: %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { say "error: $*"; exit 1; }
elapsed() { echo $(( $(date +%s) - $1 )); }

for tool in docker debootstrap "$BIN/ansible-builder" "$BIN/ansible-runner"; do
    command -v "$tool" >/dev/null || die "$tool not found; install it (apt-get install docker.io debootstrap; make venv)"
done
docker info >/dev/null 2>&1 || die "no Docker daemon answers; start dockerd (or the docker service) first"

# What the definition says: the base image's name, the EE's tag, the pinned ansible-core / ansible-runner.
read -r BASE TAG CORE RUNNER < <("$PY" - "$ROOT/execution-environment.yml" <<'EOF'
import sys, yaml
ee = yaml.safe_load(open(sys.argv[1]))
deps = ee["dependencies"]
print(ee["images"]["base_image"]["name"], ee["options"]["tags"][0], deps["ansible_core"]["package_pip"],
      deps["ansible_runner"]["package_pip"])
EOF
)
SUITE=${EE_SUITE:-$(. /etc/os-release && echo "$VERSION_CODENAME")}
if [ -z "${EE_MIRROR:-}" ]; then
    EE_MIRROR=$(grep -hsE '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2; exit}')
    [ -n "$EE_MIRROR" ] || EE_MIRROR=$(grep -hsE '^deb ' /etc/apt/sources.list | awk '{print $2; exit}')
fi
[ -n "$EE_MIRROR" ] || die "no Debian mirror in /etc/apt; set EE_MIRROR"
mkdir -p "$WORK"
START=$(date +%s)

# 1. The base: a minimal Debian of the host's suite with python3, pip and the system packages of bindep.txt
#    (the definition's package_manager_path is /usr/bin/true: nothing is installed from a package repository
#    inside the build, so what bindep.txt names must already be here).
if [ "${EE_REBUILD_BASE:-0}" = 1 ] || ! docker image inspect "$BASE" >/dev/null 2>&1; then
    T=$(date +%s)
    system=$(awk '{sub(/#.*/, "")} /platform:dpkg/ {print $1}' "$ROOT/bindep.txt" | paste -sd, -)
    rootfs=$WORK/rootfs
    rm -rf "$rootfs"
    say "debootstrap --variant=minbase $SUITE from $EE_MIRROR (python3, pip, venv, ca-certificates, $system)"
    debootstrap --variant=minbase --include="python3,python3-pip,python3-venv,ca-certificates,$system" \
        "$SUITE" "$rootfs" "$EE_MIRROR" > "$WORK/debootstrap.log" 2>&1 \
        || { tail -20 "$WORK/debootstrap.log" >&2; die "debootstrap failed (log: $WORK/debootstrap.log)"; }
    rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb
    tar -C "$rootfs" --numeric-owner -c . | docker import -c 'CMD ["/bin/bash"]' - "$BASE" >/dev/null
    rm -rf "$rootfs"
    say "base $BASE imported in $(elapsed "$T")s"
else
    say "base $BASE exists (EE_REBUILD_BASE=1 rebuilds it)"
fi

# 2. The two collection tarballs the definition installs: this repository's artifact, and kubernetes.core
#    re-packed from the copy the ansible package installed (the version the tests use).
say "collection tarballs -> .build/ee/collections"
"$PY" "$ROOT/tests/lib/awx_harness.py" ee-collections "$WORK/collections" >/dev/null

# 3. Local wheels of everything pip installs in the build: the pins, both collections' Python requirements,
#    what ansible-builder's builder stage needs (bindep, PyYAML, packaging) and dumb-init (its final stage).
KC_REQ=$("$PY" -c 'import os, ansible_collections.kubernetes.core as k; print(os.path.join(list(k.__path__)[0], "requirements.txt"))')
T=$(date +%s)
say "pip download -> .build/ee/wheels ($CORE, $RUNNER, meta/ee-requirements.txt, kubernetes.core's requirements.txt)"
"$PY" -m pip download --quiet --only-binary=:all: --dest "$WORK/wheels" "$CORE" "$RUNNER" \
    -r "$ROOT/meta/ee-requirements.txt" -r "$KC_REQ" bindep pyyaml packaging 'dumb-init==1.2.5' \
    2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
say "$(ls "$WORK/wheels" | wc -l) wheels ($(du -sh "$WORK/wheels" | cut -f1)) in $(elapsed "$T")s"

# 4. The image. --network=none: a RUN step that tried to reach a package index or a registry would fail.
T=$(date +%s)
say "ansible-builder build -t $TAG (log: .build/ee/build.log)"
(cd "$ROOT" && PIP_NO_INDEX=1 "$BIN/ansible-builder" build -f execution-environment.yml -c "$WORK/context" \
    --container-runtime docker --extra-build-cli-args=--network=none -v 2) > "$WORK/build.log" 2>&1 \
    || { tail -40 "$WORK/build.log" >&2; die "ansible-builder build failed (log: $WORK/build.log)"; }
BUILD_S=$(elapsed "$T")
SIZE=$(docker image inspect -f '{{.Size}}' "$TAG")
say "built $TAG: $((SIZE / 1000000)) MB in ${BUILD_S}s"

# 5. One job, the way AWX runs it: the private data dir is streamed to ansible-runner worker inside the EE
#    (AWX's receptor work unit: --user 1000:0, no network), and the event stream is processed on this side.
jobs=$WORK/jobs out=$WORK/out
rm -rf "$jobs" "$out"
prepared=$("$PY" "$ROOT/tests/lib/awx_harness.py" prepare "$jobs" "$TEMPLATE" ${ANSWERS:+"$ANSWERS"}) \
    || die "the job template '$TEMPLATE' could not be launched with these answers"
pdd=$(sed -n 1p <<<"$prepared") playbook=$(sed -n 2p <<<"$prepared")
# The job's LLMOPS_ROOT is /runner/llmops, inside the private data dir the worker receives: its "shared
# filesystem" gets a 2-shard safetensors revision with SHA256SUMS (tests/lib/stage_synth.py).
"$PY" -c 'import sys; sys.path.insert(0, sys.argv[1]); import stage_synth; stage_synth.write_checkpoint(sys.argv[2], 16 << 20, shards=2)' \
    "$ROOT/tests/lib" "$pdd/llmops/shared/models/tiny-ee/r1" >/dev/null
T=$(date +%s)
say "job '$TEMPLATE' ($playbook): ansible-runner transmit | docker run -i --rm --user 1000:0 --network none $TAG ansible-runner worker | ansible-runner process"
set +e
"$BIN/ansible-runner" transmit "$pdd" -p "$playbook" \
    | docker run -i --rm --user 1000:0 --network none "$TAG" ansible-runner worker --private-data-dir=/runner \
    | "$BIN/ansible-runner" process "$out" > "$WORK/job.log" 2>&1
rcs="${PIPESTATUS[*]}"
set -e
JOB_S=$(elapsed "$T")
read -r status rc events failed artifacts < <("$PY" "$ROOT/awx/ee/job_summary.py" "$out/artifacts")
say "job status $status, rc $rc, $events events, $failed failed, ${JOB_S}s (transmit|worker|process exit codes: $rcs)"
say "job artifacts (set_stats): $artifacts"

# Leave no build cache behind (the stage images are dangling once the EE is tagged).
docker builder prune -f >/dev/null 2>&1 || true
docker image prune -f >/dev/null 2>&1 || true
rm -rf "$WORK/context"

printf 'ee_image=%s ee_size_bytes=%s build_s=%s job_template="%s" job_status=%s job_rc=%s job_events=%s job_s=%s total_s=%s\n' \
    "$TAG" "$SIZE" "$BUILD_S" "$TEMPLATE" "$status" "$rc" "$events" "$JOB_S" "$(elapsed "$START")"
[ "$status" = successful ] && [ "$rc" = 0 ] && [ "$failed" = 0 ] || { tail -40 "$WORK/job.log" >&2; die "the job did not succeed (log: $WORK/job.log)"; }
