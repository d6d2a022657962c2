# dgx_spark.cluster: tooling, the simulated pair, and the test suite.
# Everything runs from the project-local virtualenv, made on first use.

VENV    ?= .venv
PY      := $(VENV)/bin/python
BIN     := $(VENV)/bin
export PATH := $(CURDIR)/$(BIN):$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
# The sim inventory keeps the nodes' sudo password vaulted, as owners keep theirs; this is the
# sim's vault password (sim only). The demo names it on its command line.
SIM_VAULT := $(CURDIR)/inventories/sim/vault-password
export ANSIBLE_VAULT_PASSWORD_FILE ?= $(SIM_VAULT)
# Each long step of demo and test is a timed phase (a line every 30 s while it runs, its
# seconds at the end); the table of phases closes the run. Standard library only.
PHASES  := python3 tools/phases.py
export DGX_SPARK_PHASES ?= $(CURDIR)/.cache/phases.log

.PHONY: help bootstrap venv lint unit sanity checks sim-up sim-down sim-clean sim-test molecule test test-drills demo teardown build timed-unit timed-sim-up molecule-scenarios test-lint-sanity test-on-the-pair

help:
	@echo "make demo      bring the simulated pair up and run deploy.yml on it"
	@echo "make test      lint, unit tests, tests and molecule scenarios on the simulated pair"
	@echo "make test-drills the fault drills and failed starts' rollbacks on the simulated pair"
	@echo "make teardown  remove what demo started on the simulated pair"
	@echo "make sim-up    start (or refresh) the simulated pair"
	@echo "make sim-down  remove the pair's containers, networks and volumes"
	@echo "make sim-clean sim-down plus the sim's images and keys"
	@echo "make bootstrap install and start what a fresh Debian/Ubuntu machine lacks (asks first)"

# Docker Engine (running), debootstrap, the OpenSSH client, rsync, Python's venv.
bootstrap:
	tools/bootstrap.sh

# pip would byte-compile every file it installs, one at a time: two thirds of them are the
# ansible package's collections, which nothing here imports but community.docker's and
# ansible.posix's plugins. Compiled on every core instead, those collections' others left out
# (Python compiles a file it imports when no bytecode is there).
$(VENV)/.installed: requirements.txt
	python3 -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check --no-compile -r requirements.txt
	$(PY) -m compileall -q -j0 -x '/ansible_collections/(?!community/docker/|ansible/posix/)' $(VENV)/lib >/dev/null
	touch $@

venv: $(VENV)/.installed

lint: venv
	$(BIN)/yamllint -s .
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/ansible-lint

# On every core: many unit tests wait on an ansible-playbook child or a timed server.
unit: venv
	$(BIN)/pytest -q -n auto tests/unit

# ansible-test sanity on the collection's own code, with no ignore file (tools/sanity.sh).
sanity: venv
	VENV=$(VENV) tools/sanity.sh

sim-up: venv
	$(PY) sim/simctl.py up

sim-down: venv
	$(PY) sim/simctl.py down

sim-clean: venv
	$(PY) sim/simctl.py down --purge

# The sim tests but the drills (tests marked `drill`: faults and failed starts, each a restart
# or two of the group); test-drills runs those alone, on the pair whatever it serves.
# An assertion's message is printed whole (pytest shortens it to 240 characters otherwise:
# a failed start's phase and last log line sit in the middle of a long one).
SIM_TESTS := $(BIN)/pytest -q --durations=40 -o verbosity_assertions=2 tests/sim

sim-test: sim-up
	$(SIM_TESTS) -m "not drill"

test-drills:
	@$(PHASES) begin
	$(PHASES) run venv -- $(MAKE) --no-print-directory venv
	$(PHASES) run sim-up -- $(PY) sim/simctl.py up
	$(PHASES) run drills -- $(SIM_TESTS) -m drill
	@$(PHASES) table

build: venv
	$(BIN)/ansible-galaxy collection build --force --output-path .cache/dist .

# The scenario runs against the simulated pair.
molecule: sim-up molecule-scenarios

# On a pair that has never served, default's converge is the pair's first deploy, and the sim
# tests after molecule find the pair serving as that converge left it (a no-op) instead of
# deploying it again. The seed design's overlay (an older base and the donor's vLLM) is
# test_profiles' switch: built once, shipped and served across both nodes.
molecule-scenarios:
	$(BIN)/molecule test -s default

checks: lint unit sanity

# lint and sanity (CPU only, nothing that times itself) at the lowest CPU priority, in their own
# session, beside everything on the pair: they take the CPU that the pair's start and tests
# leave idle (waits on downloads, loads, SSH and vLLM) instead of slowing them. -k: one side
# failing does not stop the other, and make fails at the end.
test:
	@$(PHASES) begin
	$(PHASES) run bootstrap -- tools/bootstrap.sh
	$(PHASES) run venv -- $(MAKE) --no-print-directory venv
	$(MAKE) --no-print-directory -k -j2 test-lint-sanity test-on-the-pair
	@$(PHASES) table

# Each one's output whole, once it ends.
test-lint-sanity:
	$(PHASES) run --lowest-priority lint+sanity -- $(MAKE) --no-print-directory -j2 --output-sync=target lint sanity

# The unit tests beside the pair's start (which waits on Docker and downloads), at equal
# priority: some of them time a child process. The pair's start prints its steps as they come.
test-on-the-pair:
	$(PHASES) run unit+sim-up -- $(MAKE) --no-print-directory -j2 timed-unit timed-sim-up
	$(PHASES) run molecule -- $(MAKE) --no-print-directory molecule-scenarios
	$(PHASES) run sim-test -- $(SIM_TESTS) -m "not drill"

timed-unit:
	$(PHASES) run unit -- $(MAKE) --no-print-directory -j2 --output-sync=target unit

# With the monitoring image (promtool for test_alert_rules, Prometheus for test_monitoring),
# made during the pair's start instead of in the sim tests' time. The demo does without it.
timed-sim-up:
	$(PHASES) run sim-up -- $(PY) sim/simctl.py up --monitoring-image

demo:
	@$(PHASES) begin
	$(PHASES) run bootstrap -- tools/bootstrap.sh
	$(PHASES) run venv -- $(MAKE) --no-print-directory venv
	$(PHASES) run sim-up -- $(PY) sim/simctl.py up
	$(PHASES) run deploy -- env ANSIBLE_CALLBACKS_ENABLED=ansible.posix.profile_roles $(BIN)/ansible-playbook -i inventories/sim deploy.yml --vault-password-file $(SIM_VAULT)
	@echo "Note: the simulated pair serves a tiny model trained at sim-up on a few scripted conversations: its answers below are known ones, proving the path through both nodes, the chat template and the parsers, not a model's knowledge."
	$(PHASES) run chat -- $(PY) sim/chat.py
	@$(PHASES) table

teardown: venv
	$(BIN)/ansible-playbook -i inventories/sim playbooks/teardown.yml --vault-password-file $(SIM_VAULT)
