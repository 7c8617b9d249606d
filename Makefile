# dynatrain.elastic — the two commands are `make demo` and `make test`.
SHELL := /bin/bash
.DEFAULT_GOAL := help
ROOT := $(abspath .)
VENV := $(ROOT)/.venv
PY := $(VENV)/bin/python
LC := $(PY) -m localcloud
STATE := $(ROOT)/.localcloud
WHEELHOUSE := $(STATE)/wheelhouse
NODE_VENV := $(STATE)/node-venv
APT_PACKAGES := podman runc debootstrap openssh-client uidmap fuse-overlayfs iproute2 rsync
export CONTAINERS_CONF := $(ROOT)/localcloud/containers.conf
export ANSIBLE_CONFIG := $(ROOT)/ansible.cfg
export PATH := $(VENV)/bin:$(PATH)
export DT_NODE_PYTHON ?= $(NODE_VENV)/bin/python

.PHONY: help setup apt venv collection commands image wheelhouse runtime node-venv demo demo-down test lint clean

help:
	@echo "make demo   - install everything, start the local cloud, bootstrap, train, resize, summarise"
	@echo "              (make demo ENGINE=torch: the same on the PyTorch engine)"
	@echo "make test   - lint, unit and end-to-end tests (what CI runs)"
	@echo "make setup | lint | demo-down | clean"

setup: apt venv collection commands image wheelhouse runtime node-venv

# System packages, installed only when one is missing (idempotent, no root-less sudo games).
apt:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "apt: installing$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	else echo "apt: all of $(APT_PACKAGES) present"; fi

venv: $(VENV)/.stamp
$(VENV)/.stamp: requirements.txt constraints.txt
	test -x $(PY) || python3.11 -m venv $(VENV) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade 'pip==26.3'
	$(PY) -m pip install -q -r requirements.txt -c constraints.txt
	touch $@

# dynatrain.elastic resolves to this checkout (ansible.cfg collections_path).
collection:
	@mkdir -p .collections/ansible_collections/dynatrain
	@ln -sfn $(ROOT) .collections/ansible_collections/dynatrain/elastic

# ansible-playbook & co. in a plain shell (no `source .venv/bin/activate`): /usr/local/bin scripts that
# run the checkout's .venv, where no other command of the name exists (scripts/install_commands.sh).
commands: venv
	@bash scripts/install_commands.sh

image: venv
	$(LC) build-image

wheelhouse: venv
	$(LC) wheelhouse

# The torch engine's node wheels (dt_engine=torch: PyTorch's CPU build, 192 MB, and its pins), beside
# the wheelhouse's: only for what asks for them (a torch cluster, the torch molecule scenario),
# so make setup's MXNet path does not grow. Idempotent (nothing is downloaded twice).
.PHONY: wheelhouse-torch
wheelhouse-torch: venv
	$(LC) wheelhouse --engine torch

# The node runtime wheel (runtime/build.py; rebuilt when its sources change), put in
# the wheelhouse the nodes install from and into the controller venv (its pure parts
# are unit-tested there).
RUNTIME_SRC := $(shell find runtime -name '*.py' -o -name pyproject.toml) plugins/module_utils/shared_volume.py galaxy.yml
runtime: $(STATE)/runtime.stamp
$(STATE)/runtime.stamp: $(RUNTIME_SRC) $(VENV)/.stamp
	$(PY) runtime/build.py --out $(WHEELHOUSE)
	$(PY) -m pip install -q --no-deps --force-reinstall $(WHEELHOUSE)/dynatrain_runtime-*.whl
	touch $@

# A node venv on the controller (MXNet from the wheelhouse, PyTorch's CPU build + the runtime): the
# launcher's unit tests and the benchmarks run real MXNet and torch jobs with it on 127.x addresses.
# torch is pinned exactly (requirements-node-torch.txt: torch==2.13.0+cpu, 192 MB; an unpinned torch is
# the ~3 GB CUDA build), taken from the wheelhouse when it has it, else from pip's configured sources;
# a second run installs nothing.
node-venv: $(NODE_VENV)/.stamp
$(NODE_VENV)/.stamp: requirements-node.txt requirements-node-torch.txt $(STATE)/runtime.stamp
	test -x $(NODE_VENV)/bin/python || python3.11 -m venv $(NODE_VENV) || python3 -m venv $(NODE_VENV)
	$(NODE_VENV)/bin/python -m pip install -q --no-index --find-links $(WHEELHOUSE) -r requirements-node.txt
	$(NODE_VENV)/bin/python -m pip install -q --find-links $(WHEELHOUSE) -r requirements-node-torch.txt
	$(NODE_VENV)/bin/python -m pip install -q --no-deps --force-reinstall $(WHEELHOUSE)/dynatrain_runtime-*.whl
	touch $@

# make demo ENGINE=torch: the same demo on the PyTorch engine (a cluster of its own, dtdemo-torch); its node
# wheels are built on demand by the playbooks' preflight (seconds: make setup has PyTorch's CPU wheel).
ENGINE ?= mxnet
demo: setup
	$(PY) scripts/demo.py --engine $(ENGINE)

demo-down:
	-$(LC) down

test: setup
	bash tests/run_all.sh

lint: setup
	bash tests/lint.sh

clean: demo-down
	rm -rf .collections .pytest_cache tests/output dynatrain-elastic-*.tar.gz
