# damon-hp: one entry point for setup, builds, tests and the demo.
# `make demo` sets everything up and runs the main job; `make test` runs all three test tiers.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV   := .venv
PY     := $(VENV)/bin/python
PYTEST := $(VENV)/bin/pytest
CACHE  := .cache
STAMPS := $(CACHE)/stamps

# Debian 12 packages the project needs on the host. The test kernel comes through the private
# apt sources list of kernel-config/fetch-kernel.sh, never through /etc/apt; that script also
# provides virtiofsd (libcap-ng-dev, libseccomp-dev: to build it; see kernel-config/README.md).
# libcap2-bin: capsh, which the host tier uses to run the agent as root without a capability.
# redis-server, redis-tools, mariadb-server and sysbench: the application experiment
# (experiments/apps.toml), whose runner starts its own server instances and never the services.
APT_PACKAGES := qemu-system-x86 kmod busybox-static clang llvm libbpf-dev bpftool \
	libelf-dev zlib1g-dev linux-perf build-essential pkg-config python3-venv python3-pip \
	cpio zstd file debian-archive-keyring libcap-ng-dev libseccomp-dev time libcap2-bin \
	redis-server redis-tools mariadb-server sysbench

.PHONY: help setup demo test test-unit test-host test-vm lint workloads bpf kernel \
	go-ycsb vm-shell vm-run clean

help:
	@echo "make demo       set up everything, then run damon-hp on a bundled workload"
	@echo "make test       run the unit, host and vm test tiers (sets up first)"
	@echo "make setup      apt packages, .venv, test kernel, workloads, BPF tools, go-ycsb (idempotent)"
	@echo "make vm-shell   interactive shell in the test VM"
	@echo "make vm-run CMD='...'  run CMD in the test VM from the project root"

$(STAMPS):
	@mkdir -p $@

# Re-run apt only when the package list changes.
$(STAMPS)/apt-$(shell echo '$(APT_PACKAGES)' | sha1sum | cut -c1-12): | $(STAMPS)
	@missing=$$(dpkg-query -W -f='$${Status} $${Package}\n' $(APT_PACKAGES) 2>/dev/null \
		| awk '$$3!="installed"{print $$4}'; for p in $(APT_PACKAGES); do \
		dpkg-query -W $$p >/dev/null 2>&1 || echo $$p; done | sort -u); \
	if [ -n "$$missing" ]; then \
		echo "setup: installing Debian packages: $$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi
	@touch $@

$(STAMPS)/venv: pyproject.toml | $(STAMPS)
	@test -x $(PY) || python3 -m venv $(VENV)
	@$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]'
	@touch $@

# `make kernel` fetches both pinned test kernels (kernel-config/README.md). `make kernel PIN=latest`
# (or PIN=<debian version>) re-pins the main one, kernel-config/pinned-kernel.env; add KERNEL=lts
# for the second one, kernel-config/pinned-kernel-lts.env.
kernel: $(STAMPS)/apt-$(shell echo '$(APT_PACKAGES)' | sha1sum | cut -c1-12)
	@kernel-config/fetch-kernel.sh $(if $(KERNEL),--kernel '$(KERNEL)') $(if $(PIN),--repin '$(PIN)')

workloads: $(STAMPS)/apt-$(shell echo '$(APT_PACKAGES)' | sha1sum | cut -c1-12)
	@$(MAKE) -s -C workloads

bpf: $(STAMPS)/apt-$(shell echo '$(APT_PACKAGES)' | sha1sum | cut -c1-12)
	@$(MAKE) -s -C bpf

# go-ycsb (the app experiment's YCSB client), pinned in workloads/go-ycsb/pin.env, built with
# the machine's Go into .cache/go-ycsb/; the script does nothing once it is built.
go-ycsb: $(STAMPS)/apt-$(shell echo '$(APT_PACKAGES)' | sha1sum | cut -c1-12)
	@workloads/go-ycsb/build.sh

# The agent's bytecode is compiled here, not at each start: where PYTHONDONTWRITEBYTECODE is set
# (as in the shells damon-hp is developed in) every damon-hp command would otherwise compile the
# modules it imports again, about 0.1 s of CPU per start (docs/cost.md). A module changed since is
# compiled again in memory, as without this step.
setup: $(STAMPS)/apt-$(shell echo '$(APT_PACKAGES)' | sha1sum | cut -c1-12) $(STAMPS)/venv \
	kernel workloads bpf go-ycsb
	@$(PY) -m compileall -q agent

demo: setup
	@experiments/demo.sh

lint: $(STAMPS)/venv
	$(VENV)/bin/ruff check agent tests experiments

# --durations: the suite must stay under 40 minutes (README); CI's log shows where it goes.
test: setup
	$(PYTEST) -ra --durations=25 tests/unit tests/host tests/vm

# A single tier with no tests yet (pytest exit 5) is not a failure.
test-unit: $(STAMPS)/venv
	$(PYTEST) -ra tests/unit || [ $$? -eq 5 ]

test-host: setup
	$(PYTEST) -ra tests/host || [ $$? -eq 5 ]

test-vm: setup
	$(PYTEST) -ra tests/vm || [ $$? -eq 5 ]

# MEM=6G gives the VM more memory (default 4G). make itself exits 2 when CMD fails; the
# command's own exit code is printed (`.venv/bin/damon-hp vm run -- CMD` returns it as is).
vm-shell: setup
	@$(VENV)/bin/damon-hp vm shell $(if $(MEM),--mem $(MEM)) $(if $(KERNEL),--kernel $(KERNEL))

vm-run: setup
	@$(if $(strip $(CMD)),true,echo "usage: make vm-run CMD='command args' [MEM=6G] [KERNEL=lts]" >&2; exit 2)
	@$(VENV)/bin/damon-hp vm run $(if $(MEM),--mem $(MEM)) $(if $(KERNEL),--kernel $(KERNEL)) -- $(CMD) || { rc=$$?; \
		echo "vm-run: the command exited with $$rc" >&2; exit $$rc; }

clean:
	@$(MAKE) -s -C workloads clean || true
	@$(MAKE) -s -C bpf clean || true
