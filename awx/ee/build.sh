#!/usr/bin/env bash
# Build the execution environment of execution-environment.yml without a registry or a package index inside the
# build, run one job through the route AWX uses (ansible-runner transmit | worker in the EE | process), then tag
# and push it where asked.
#
#   bash awx/ee/build.sh            (make ee)
#   bash awx/ee/build.sh --plan     print what would be built with which runtime, tag and push target; build nothing
#   bash awx/ee/build.sh --lock     resolve the EE's Python packages against the package index and write
#                                   meta/ee-requirements.lock.txt (every package pinned with its sha256); build nothing
#
# Needs: podman or docker (a working one: `podman info` / `docker info`), debootstrap and root (for the base image),
# python3 with venv, and access to the Python package index on this host, and to Ansible Galaxy or else the index's
# ansible package for kubernetes.core (the build itself has no network). The tools come from their own small virtual environment, .build/ee/tools (ansible-core and
# ansible-runner at the definition's pins, ansible-builder at requirements-test.txt's range), never the engine's.
# Environment:
#   EE_RUNTIME        podman or docker (default: podman when it is on PATH, else docker)
#   EE_TAG            the image's local name (default: llmops-serving-ee:<galaxy.yml's version>-<commit, 12 hex
#                     digits>[-dirty]: one name per build, so that the EE object's `pull: missing` never serves an older
#                     build under a reused name; the artifact inside records the same commit, which the job templates'
#                     release check compares with the project's revision)
#   EE_PUSH           registry/repository:tag to tag the image as and push it to once its job passed (default: none);
#                     its tag must name the commit (e.g. <version>-<commit>), and a build with uncommitted changes is
#                     never pushed
#   EE_SUITE          Debian suite of the base (default: the host's); EE_MIRROR (default: the host's first apt source)
#   EE_REBUILD_BASE=1 debootstrap again even when the base image exists
#   EE_UNPINNED_BASE=1 build on a base that execution-environment.yml names by tag (localhost/...:bookworm, made
#                     here by debootstrap) instead of by digest (name@sha256:...); without it such a build is refused
#   EE_TEMPLATE / EE_ANSWERS   the job template of awx/controller_templates.yml run at the end, and its survey answers
#                     as JSON; EE_SKIP_JOB=1 skips that job
#   PYTHON            the interpreter that creates the tools venv (default: python3)
# Work files go to .build/ee/ (tools venv, collections, wheels, build context, the job's private data dir and output).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
WORK=$ROOT/.build/ee   # execution-environment.yml's additional_build_files point here
TOOLS=$WORK/tools
TEMPLATE=${EE_TEMPLATE:-llmops stage model}
# The stage template's survey, answered for a small synthetic revision (tiny-ee@r1, 16 MiB, written below onto
# the job's shared filesystem). EE_ANSWERS= (empty) sends the survey defaults, as AWX's launch form does.
ANSWERS=${EE_ANSWERS-'{"stage_model_name": "tiny-ee", "stage_model_revision": "r1", "model_stage_verify": "sha256", "model_stage_read_streams": 2, "model_stage_keep_revisions": 2}'}

say() { printf '%s ee: %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { say "error: $*"; exit 1; }
elapsed() { echo $(( $(date +%s) - $1 )); }

PLAN=0 LOCK=0
for arg in "$@"; do
    case $arg in
        --plan) PLAN=1 ;;
        --lock) LOCK=1 ;;
        *) die "unknown argument $arg; usage: build.sh [--plan | --lock] (settings come from EE_RUNTIME, EE_TAG, EE_PUSH, ...)" ;;
    esac
done

# The container runtime: EE_RUNTIME when set (and on PATH), else podman, else docker (--lock needs none).
if [ "$LOCK" = 1 ]; then
    RT=none
elif [ -n "${EE_RUNTIME:-}" ]; then
    case $EE_RUNTIME in
        podman|docker) ;;
        *) die "EE_RUNTIME=$EE_RUNTIME is not a runtime ansible-builder drives; set EE_RUNTIME=podman or EE_RUNTIME=docker" ;;
    esac
    command -v "$EE_RUNTIME" >/dev/null || die "EE_RUNTIME=$EE_RUNTIME: $EE_RUNTIME is not on PATH; install it or set EE_RUNTIME to the other runtime"
    RT=$EE_RUNTIME
elif command -v podman >/dev/null; then
    RT=podman
elif command -v docker >/dev/null; then
    RT=docker
else
    die "neither podman nor docker is on PATH; install one (apt-get install podman) or set EE_RUNTIME"
fi

# What the repository says: the release (galaxy.yml), the base image and the pins (execution-environment.yml), the
# kubernetes.core version (requirements.yml), the ansible-builder range (requirements-test.txt).
field() { sed -n "s/^$1: *//p" "$2" | head -1 | tr -d "\"' "; }
VERSION=$(field version "$ROOT/galaxy.yml")
[ -n "$VERSION" ] || die "galaxy.yml has no version"
# The build's identity: the commit (and whether the checkout has uncommitted changes), as awx/ee/build_artifact.py
# writes it into the artifact.
COMMIT=$(git -C "$ROOT" rev-parse --short=12 HEAD 2>/dev/null) \
    || die "$ROOT is not a git checkout: make ee names the image and the artifact after the commit they are built from"
DIRTY=$([ -n "$(git -C "$ROOT" status --porcelain --untracked-files=normal)" ] && echo 1 || echo 0)
IDENT=$VERSION-$COMMIT$([ "$DIRTY" = 1 ] && echo -dirty || true)
TAG=${EE_TAG:-llmops-serving-ee:$IDENT}
PUSH=${EE_PUSH:-}
if [ -n "$PUSH" ]; then
    case ${PUSH##*/} in
        *:?*) ;;
        *) die "EE_PUSH=$PUSH has no tag; give registry/repository:tag (for example registry.example/llmops/serving-ee:$VERSION-$COMMIT)" ;;
    esac
    case ${PUSH##*:} in
        *"$COMMIT"*) ;;
        *) die "EE_PUSH=$PUSH: its tag does not name commit $COMMIT; push as ${PUSH%:*}:$VERSION-$COMMIT (a reused tag lets pull: missing run an older build)" ;;
    esac
    [ "$DIRTY" = 0 ] || die "EE_PUSH=$PUSH: the checkout has uncommitted changes, so commit $COMMIT does not describe this build; commit them (or stash them) and run make ee again"
fi
BASE=$(sed -n '/^  base_image:/,/name:/s/^ *name: *//p' "$ROOT/execution-environment.yml" | tr -d "\"' ")
CORE=$(sed -n '/^  ansible_core:/,/package_pip:/s/^ *package_pip: *//p' "$ROOT/execution-environment.yml" | tr -d "\"' ")
RUNNER=$(sed -n '/^  ansible_runner:/,/package_pip:/s/^ *package_pip: *//p' "$ROOT/execution-environment.yml" | tr -d "\"' ")
BUILDER=$(sed -n 's/^\(ansible-builder[^ #]*\).*/\1/p' "$ROOT/requirements-test.txt" | head -1)
ANSIBLE_PKG=$(sed -n 's/^\(ansible[<>=~!][^ #]*\).*/\1/p' "$ROOT/requirements-test.txt" | head -1)
KC=$(sed -n '/name: kubernetes.core/,/version:/s/^ *version: *//p' "$ROOT/requirements.yml" | tr -d "\"' ")
if [ -z "$BASE" ] || [ -z "$CORE" ] || [ -z "$RUNNER" ]; then
    die "execution-environment.yml lacks base_image.name or a package_pip pin"
fi
[ -n "$BUILDER" ] || die "requirements-test.txt names no ansible-builder"
[ -n "$KC" ] || die "requirements.yml pins no kubernetes.core version"

# The system packages of the base: what bindep.txt and the collection's meta/ee-bindep.txt declare for dpkg.
SYSTEM=$(awk '{sub(/#.*/, "")} /platform:dpkg/ {print $1}' "$ROOT/bindep.txt" "$ROOT/meta/ee-bindep.txt" | sort -u | paste -sd, -)
# The base is pinned when the definition names it by digest (name@sha256:<64 hex digits>): the same bytes on every
# build host and every build, until a commit names another digest.
case $BASE in
    *@sha256:????????????????????????????????????????????????????????????????) BASE_PINNED=1 ;;
    *) BASE_PINNED=0 ;;
esac
# The Python packages: meta/ee-requirements.lock.txt pins every wheel the build installs, with its hash.
LOCKFILE=$ROOT/meta/ee-requirements.lock.txt

if [ "$PLAN" = 1 ]; then
    printf 'runtime=%s tag=%s push=%s commit=%s dirty=%s base=%s base_pinned=%s system=%s core=%s runner=%s builder=%s kubernetes.core=%s kubernetes.core_fallback=%s tools=%s lock=%s wheels=%s\n' \
        "$RT" "$TAG" "${PUSH:-none}" "$COMMIT" "$DIRTY" "$BASE" "$BASE_PINNED" "$SYSTEM" "$CORE" "$RUNNER" "$BUILDER" "$KC" "${ANSIBLE_PKG:-none}" "$TOOLS" "$LOCKFILE" "$WORK/wheels"
    exit 0
fi

if [ "$LOCK" = 0 ]; then
    # A base named by tag is whatever image holds that name on this host: refused unless asked for.
    if [ "$BASE_PINNED" = 0 ] && [ "${EE_UNPINNED_BASE:-0}" != 1 ]; then
        die "execution-environment.yml names the base image $BASE by tag, not by digest, so two builds of one commit can start from different bases; pin it: build the base once (EE_UNPINNED_BASE=1 make ee), push it ($RT tag $BASE registry.example/llmops/ee-base:<suite>-<date>; $RT push ...), and set images.base_image.name to registry.example/llmops/ee-base@sha256:<digest> ($RT image inspect -f '{{index .RepoDigests 0}}' ...), or set EE_UNPINNED_BASE=1 to build on the local base as it is (docs/awx.md, \"A reproducible build\")"
    fi
    [ "$BASE_PINNED" = 1 ] || command -v debootstrap >/dev/null || die "debootstrap not found; install it (apt-get install debootstrap)"
    "$RT" info >/dev/null 2>&1 || die "$RT does not answer ($RT info failed); start it (the docker service) or set EE_RUNTIME to the other runtime"
fi
START=$(date +%s)
mkdir -p "$WORK"

# 0. The tools, in their own venv (reused while the pins are the same).
PIN="$CORE $RUNNER $BUILDER"
if [ "$(cat "$TOOLS/.pins" 2>/dev/null)" != "$PIN" ]; then
    say "tools venv .build/ee/tools ($PIN)"
    rm -rf "$TOOLS"
    "${PYTHON:-python3}" -m venv "$TOOLS" || die "${PYTHON:-python3} -m venv failed; install python3-venv"
    "$TOOLS/bin/python" -m pip install --quiet "$CORE" "$RUNNER" "$BUILDER" || die "pip could not install $PIN"
    echo "$PIN" > "$TOOLS/.pins"
fi
PY=$TOOLS/bin/python
BIN=$TOOLS/bin

SUITE=${EE_SUITE:-$(. /etc/os-release && echo "$VERSION_CODENAME")}
if [ -z "${EE_MIRROR:-}" ]; then
    EE_MIRROR=$(grep -hsE '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2; exit}')
    [ -n "$EE_MIRROR" ] || EE_MIRROR=$(grep -hsE '^deb ' /etc/apt/sources.list | awk '{print $2; exit}')
fi
[ "$LOCK" = 1 ] || [ "$BASE_PINNED" = 1 ] || [ -n "$EE_MIRROR" ] || die "no Debian mirror in /etc/apt; set EE_MIRROR"

# 1. The base: a minimal Debian of the host's suite with python3, pip and the system packages bindep declares for
#    dpkg (bindep.txt and the collection's meta/ee-bindep.txt). The build has no package repository: its package
#    manager (awx/ee/pkg-present) fails the build if bindep lists a package the base lacks.
if [ "$LOCK" = 1 ]; then
    :
elif [ "$BASE_PINNED" = 1 ]; then
    # named by digest: pulled once, never rebuilt here (a new base is a new digest in execution-environment.yml)
    "$RT" image inspect "$BASE" >/dev/null 2>&1 || "$RT" pull "$BASE" >/dev/null \
        || die "$RT pull $BASE failed; log in to its registry ($RT login ${BASE%%/*}) or load the image"
    say "base $BASE (pinned by digest)"
else
    say "base $BASE is named by tag, not digest (EE_UNPINNED_BASE=1): this build is not reproducible"
    if [ "${EE_REBUILD_BASE:-0}" = 1 ] || ! "$RT" image inspect "$BASE" >/dev/null 2>&1; then
        T=$(date +%s)
        rootfs=$WORK/rootfs
        rm -rf "$rootfs"
        say "debootstrap --variant=minbase $SUITE from $EE_MIRROR (python3, pip, venv, ca-certificates, $SYSTEM)"
        debootstrap --variant=minbase --include="python3,python3-pip,python3-venv,ca-certificates,$SYSTEM" \
            "$SUITE" "$rootfs" "$EE_MIRROR" > "$WORK/debootstrap.log" 2>&1 \
            || { tail -20 "$WORK/debootstrap.log" >&2; die "debootstrap failed (log: $WORK/debootstrap.log)"; }
        rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb
        tar -C "$rootfs" --numeric-owner -c . | "$RT" import -c 'CMD ["/bin/bash"]' - "$BASE" >/dev/null
        rm -rf "$rootfs"
        say "base $BASE imported in $(elapsed "$T")s"
    else
        say "base $BASE exists (EE_REBUILD_BASE=1 rebuilds it)"
    fi
fi

# 2. The two collection tarballs the definition installs: this repository's artifact (its one recipe, which writes
#    the commit into meta/build_identity.json), and kubernetes.core at requirements.yml's pin (the one a project
#    sync would install, so both paths carry the same version).
cols=$WORK/collections
mkdir -p "$cols"
rm -rf "$cols/.dist" && mkdir "$cols/.dist"
"$PY" "$ROOT/awx/ee/build_artifact.py" --galaxy "$BIN/ansible-galaxy" --output-path "$cols/.dist" >/dev/null \
    || die "the artifact build (awx/ee/build_artifact.py) failed"
mv "$cols"/.dist/llmops-serving-*.tar.gz "$cols/llmops-serving.tar.gz"
manifest_version() { tar -xzOf "$1" MANIFEST.json 2>/dev/null | "$PY" -c 'import json, sys; print(json.load(sys.stdin)["collection_info"]["version"])' 2>/dev/null || true; }
if [ "$(manifest_version "$cols/kubernetes-core.tar.gz")" != "$KC" ]; then
    say "ansible-galaxy collection download kubernetes.core:$KC"
    if "$BIN/ansible-galaxy" collection download --no-deps -p "$cols/.dist" "kubernetes.core:$KC" \
            > "$WORK/galaxy.log" 2>&1; then
        mv "$cols/.dist/kubernetes-core-$KC.tar.gz" "$cols/kubernetes-core.tar.gz"
    else
        # Galaxy did not answer: the ansible package (requirements-test.txt's range, on the package index) ships
        # the same release; awx/ee/collection_from_package.py takes it only if it is exactly $KC.
        [ -n "$ANSIBLE_PKG" ] || die "Galaxy did not answer (log: $WORK/galaxy.log) and requirements-test.txt names no ansible package range; put the kubernetes.core $KC artifact at $cols/kubernetes-core.tar.gz"
        say "Galaxy did not answer (log: $WORK/galaxy.log); taking kubernetes.core $KC from the $ANSIBLE_PKG package"
        rm -rf "$WORK/ansible-package"
        "$PY" -m pip download --quiet --no-deps --only-binary=:all: --dest "$WORK/ansible-package" "$ANSIBLE_PKG" \
            2> >(grep -v "is ignored: it is neither a file nor a directory" >&2) \
            || die "neither Galaxy nor the package index gave kubernetes.core $KC; put its artifact at $cols/kubernetes-core.tar.gz"
        "$PY" "$ROOT/awx/ee/collection_from_package.py" "$WORK"/ansible-package/ansible-*.whl kubernetes.core "$KC" \
            "$cols/kubernetes-core.tar.gz" >/dev/null \
            || die "kubernetes.core $KC could not be taken from the $ANSIBLE_PKG package; put its artifact at $cols/kubernetes-core.tar.gz"
        rm -rf "$WORK/ansible-package"
    fi
fi
rm -rf "$cols/.dist"
[ "$(manifest_version "$cols/kubernetes-core.tar.gz")" = "$KC" ] || die "$cols/kubernetes-core.tar.gz is not kubernetes.core $KC"
[ "$(manifest_version "$cols/llmops-serving.tar.gz")" = "$VERSION" ] || die "the built artifact is not llmops.serving $VERSION"
say "collections: llmops.serving $VERSION, kubernetes.core $KC"

# 3. Local wheels of everything pip installs in the build: the pins, both collections' Python requirements,
#    what ansible-builder's builder stage needs (bindep, PyYAML, packaging) and dumb-init (its final stage), exactly
#    as meta/ee-requirements.lock.txt pins them. The lock records what it was resolved from (its "# inputs:" line)
#    and for which interpreter ("# python:"), and a build whose inputs changed is refused until it is made again.
KC_REQ=$WORK/kubernetes-core-requirements.txt
tar -xzOf "$cols/kubernetes-core.tar.gz" requirements.txt > "$KC_REQ" 2>/dev/null || : > "$KC_REQ"
INPUTS=$({ printf '%s\n' "$CORE" "$RUNNER" bindep pyyaml packaging dumb-init==1.2.5
           sed 's/#.*//' "$ROOT/meta/ee-requirements.txt" "$KC_REQ"; } | tr -d ' \r' | grep -v '^$' | LC_ALL=C sort -u | paste -sd' ' -)
PYID=$("$PY" -c 'import platform, sys; print("%d.%d-%s" % (sys.version_info[0], sys.version_info[1], platform.machine()))')
if [ "$LOCK" = 1 ]; then
    T=$(date +%s)
    say "resolving $INPUTS for python $PYID"
    # shellcheck disable=SC2086  # the inputs are one requirement per word
    "$PY" -m pip install --quiet --dry-run --ignore-installed --only-binary=:all: --report "$WORK/lock-report.json" $INPUTS \
        2> >(grep -v "is ignored: it is neither a file nor a directory" >&2) || die "pip could not resolve $INPUTS"
    "$PY" - "$WORK/lock-report.json" "$LOCKFILE" "$INPUTS" "$PYID" <<'PYEOF' || die "the lock could not be written"
import json, sys
report, lock, inputs, pyid = sys.argv[1:]
with open(report, encoding="utf-8") as f:
    found = json.load(f)["install"]
lines = ["# The execution environment's Python packages, each pinned with the sha256 of its wheel. Written by",
         "# `bash awx/ee/build.sh --lock` (pip's resolution of the inputs below against the configured package index);",
         "# make ee downloads exactly these wheels (pip download --no-deps --require-hashes) into an emptied wheel",
         "# directory, and the build installs from nothing else. Edit meta/ee-requirements.txt, then run --lock again.",
         "# python: " + pyid, "# inputs: " + inputs]
for item in sorted(found, key=lambda i: i["metadata"]["name"].lower()):
    digest = item["download_info"]["archive_info"]["hashes"]["sha256"]
    lines.append("%s==%s --hash=sha256:%s" % (item["metadata"]["name"].lower().replace("_", "-"), item["metadata"]["version"], digest))
with open(lock, "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")
PYEOF
    say "wrote meta/ee-requirements.lock.txt: $(grep -c -- '--hash=' "$LOCKFILE") packages in $(elapsed "$T")s"
    exit 0
fi
[ -f "$LOCKFILE" ] || die "meta/ee-requirements.lock.txt is missing; run bash awx/ee/build.sh --lock and commit it"
[ "$(sed -n 's/^# inputs: //p' "$LOCKFILE")" = "$INPUTS" ] \
    || die "meta/ee-requirements.lock.txt was resolved from other requirements than $INPUTS; run bash awx/ee/build.sh --lock and commit it"
[ "$(sed -n 's/^# python: //p' "$LOCKFILE")" = "$PYID" ] \
    || die "meta/ee-requirements.lock.txt was resolved for python $(sed -n 's/^# python: //p' "$LOCKFILE"), this build's is $PYID; run with PYTHON=<that python> or lock again"
T=$(date +%s)
say "pip download -> .build/ee/wheels, emptied first (meta/ee-requirements.lock.txt)"
rm -rf "$WORK/wheels"
mkdir -p "$WORK/wheels"
"$PY" -m pip download --quiet --no-deps --require-hashes --only-binary=:all: --dest "$WORK/wheels" -r "$LOCKFILE" \
    2> >(grep -v "is ignored: it is neither a file nor a directory" >&2) \
    || die "pip could not download the wheels of meta/ee-requirements.lock.txt (a hash that differs names a changed upload; lock again only on purpose)"
say "$(find "$WORK/wheels" -name '*.whl' | wc -l) wheels ($(du -sh "$WORK/wheels" | cut -f1)) in $(elapsed "$T")s"

# 4. The image. --network=none: a RUN step that tried to reach a package index or a registry would fail.
T=$(date +%s)
say "ansible-builder build -t $TAG --container-runtime $RT (log: .build/ee/build.log)"
(cd "$ROOT" && "$BIN/ansible-builder" build -f execution-environment.yml -c "$WORK/context" -t "$TAG" \
    --container-runtime "$RT" --extra-build-cli-args=--network=none -v 3) > "$WORK/build.log" 2>&1 \
    || { tail -40 "$WORK/build.log" >&2; die "ansible-builder build failed (log: $WORK/build.log)"; }
BUILD_S=$(elapsed "$T")
SIZE=$("$RT" image inspect -f '{{.Size}}' "$TAG")
say "built $TAG: $((SIZE / 1000000)) MB in ${BUILD_S}s"

# 5. One job, the way AWX runs it: the private data dir is streamed to ansible-runner worker inside the EE
#    (AWX's receptor work unit: --user 1000:0, no network), and the event stream is processed on this side.
status=skipped rc=- events=- failed=0 JOB_S=0
if [ "${EE_SKIP_JOB:-0}" != 1 ]; then
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
    say "job '$TEMPLATE' ($playbook): ansible-runner transmit | $RT run -i --rm --user 1000:0 --network none $TAG ansible-runner worker | ansible-runner process"
    set +e
    "$BIN/ansible-runner" transmit "$pdd" -p "$playbook" \
        | "$RT" run -i --rm --user 1000:0 --network none "$TAG" ansible-runner worker --private-data-dir=/runner \
        | "$BIN/ansible-runner" process "$out" > "$WORK/job.log" 2>&1
    rcs="${PIPESTATUS[*]}"
    set -e
    JOB_S=$(elapsed "$T")
    read -r status rc events failed artifacts < <("$PY" "$ROOT/awx/ee/job_summary.py" "$out/artifacts")
    say "job status $status, rc $rc, $events events, $failed failed, ${JOB_S}s (transmit|worker|process exit codes: $rcs)"
    say "job artifacts (set_stats): $artifacts"
    if [ "$status" != successful ] || [ "$rc" != 0 ] || [ "$failed" != 0 ]; then
        tail -40 "$WORK/job.log" >&2
        die "the job did not succeed (log: $WORK/job.log); $TAG is not pushed"
    fi
fi

# 6. Tag and push where asked (only an image whose job passed).
if [ -n "$PUSH" ]; then
    "$RT" tag "$TAG" "$PUSH" || die "$RT tag $TAG $PUSH failed"
    "$RT" push "$PUSH" || die "$RT push $PUSH failed; log in to the registry ($RT login ${PUSH%%/*}) and run make ee again"
    say "pushed $PUSH"
fi

# Leave no build cache behind (the stage images are dangling once the EE is tagged).
if [ "$RT" = docker ]; then docker builder prune -f >/dev/null 2>&1 || true; fi
"$RT" image prune -f >/dev/null 2>&1 || true
rm -rf "$WORK/context"

printf 'ee_image=%s ee_push=%s ee_runtime=%s ee_size_bytes=%s build_s=%s job_template="%s" job_status=%s job_rc=%s job_events=%s job_s=%s total_s=%s\n' \
    "$TAG" "${PUSH:-none}" "$RT" "$SIZE" "$BUILD_S" "$TEMPLATE" "$status" "$rc" "$events" "$JOB_S" "$(elapsed "$START")"
