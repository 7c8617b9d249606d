# dynatrain.elastic — the two commands are `make demo` and `make test`.
SHELL := /bin/bash
.DEFAULT_GOAL := help
ROOT := $(abspath .)
VENV := $(ROOT)/.venv
PY := $(VENV)/bin/python
LC := $(PY) -m localcloud
STATE := $(ROOT)/.localcloud
APT_PACKAGES := podman runc debootstrap openssh-client uidmap fuse-overlayfs iproute2 rsync
export CONTAINERS_CONF := $(ROOT)/localcloud/containers.conf
export ANSIBLE_CONFIG := $(ROOT)/ansible.cfg
export PATH := $(VENV)/bin:$(PATH)

.PHONY: help setup apt venv collection image wheelhouse demo demo-down test test-unit test-e2e lint clean

help:
	@echo "make demo   - install everything, start the local cloud, bootstrap, train, resize, summarise"
	@echo "make test   - lint, unit and end-to-end tests (what CI runs)"
	@echo "make setup | lint | demo-down | clean"

setup: apt venv collection image wheelhouse

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

image: venv
	$(LC) build-image

wheelhouse: venv
	$(LC) wheelhouse

demo: setup
	$(PY) scripts/demo.py

demo-down:
	-$(LC) down

test: setup
	bash tests/run_all.sh

lint: setup
	bash tests/lint.sh

clean: demo-down
	rm -rf .collections .pytest_cache tests/output dynatrain-elastic-*.tar.gz
