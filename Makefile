# Two commands matter: `make demo` and `make test` (`make check` is its fast lane). Everything else is what they are made of.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
REQS   := requirements.txt requirements-dev.txt requirements-peers.txt
STAMP  := $(VENV)/.installed-$(shell cat $(REQS) | cksum | cut -d' ' -f1)
MANAGE := $(BIN)/python manage.py
# Write bytecode even where the environment says not to (PYTHONDONTWRITEBYTECODE=1 on these
# machines): without it every pytest worker recompiles and rewrites every test module, and every
# pod's gunicorn every project module, on each start. Four runs of `make check` from empty caches:
# 70.2 and 77.0 s with it set, 64.6 (writing) and 57.7 s without. __pycache__/ is ignored by git.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: demo test check lint-and-services serve serve-check venv system services static nodes-start nodes-stop migrate seed lockbench twins clean

# The spike of every strategy (and its floor, measured on each row's own pods) on two pods, the
# shoppers spread over them directly: on two shared cores HAProxy's own CPU costs the floor 0.55-0.72x
# (docs/distributed.md; --balancer haproxy for it); then one hot SKU at the speed of its database:
# db and redis with each purchase alone in its section and with up to 64 sharing one (docs/batching.md).
# --steadiness first times one fixed CPU job a few times: the machine's own noise, which any two
# runs' ×floor share (docs/burst.md, "The instrument on two cores").
demo: services migrate seed static
	$(MANAGE) flashsale --scenario spike --strategies all --requests 5000 --stock 100 --pods 2 --steadiness \
		--json artifacts/burst.json --report artifacts/report.html
	$(MANAGE) flashsale --scenario deep --strategies db,redis --requests 1000 --batch 1,64 \
		--json artifacts/batching.json --report artifacts/batching.html

# What both lanes run first: lint and format check (pyproject.toml), the import contract
# (.importlinter), the machine's PostgreSQL and Redis, static files. The suite starts (and stops)
# its own Redlock nodes, etcd and ZooKeeper on its own ports; pytest-django makes test_flashsale.
lint-and-services: venv system
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	@bash scripts/ensure-services.sh
	$(MANAGE) preflight --no-nodes
	$(MANAGE) collectstatic --noinput -v0

# Four pytest-xdist workers, each in its own slot (tests/slots.py: ports, Redis and PostgreSQL
# databases, run dir); the bursts share one worker (xdist_group "burst") so two never compete.
# With two the suite's CPU was half of two cores' (7 min 22 s of wall, 7 min 44 s of CPU, 2026-12-05):
# its tests wait on servers, clusters and timeouts. Three took 5 min 33 s and 5 min 51 s the same hour.
# On 2026-12-07 (1,787 tests) three took 7 min 47 s and pytest used 128 % of the two cores; four took
# 7 min 8 s at 142 %, every worker busy 405-409 s, the burst group's 398 s of them on one.
TEST_WORKERS ?= 4
# The fast lane has no burst, and its tests wait on the real services about half the time (pytest's
# CPU was 69 s in 69 s of wall on two cores): three workers fill those waits. On 2026-12-03, two
# alternated pairs of `make check`: 60.2 and 58.1 s with two workers, 52.7 and 48.2 s with three.
# Four were no faster (47-54 s) and showed a try-lock's cold first round missing its 50 ms once (its
# test now warms first); on 2026-12-02 a failover test's Redis timed out once with four, and six were
# slower (106 s) with five timing tests failed. On 2026-12-06's VM (slower round trips, 1,247 tests),
# alternated: three 55.2, 51.5 and 50.4 s, four 47.4, 47.6 and 46.6 s, every run passing.
CHECK_WORKERS ?= 4

test: lint-and-services
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup

# The fast lane, while working: the tests not marked slow or browser.
check: lint-and-services
	$(BIN)/python -m pytest -n $(CHECK_WORKERS) --dist loadgroup -m "not slow and not browser" -q --reuse-db

venv: $(STAMP)

$(STAMP): $(REQS)
	@command -v $(PYTHON) >/dev/null || \
		{ echo "$(PYTHON) not found: install Python 3.11 or run make PYTHON=/path/to/python3.11"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements-dev.txt -r requirements-peers.txt
	rm -f $(VENV)/.installed-*
	touch $@

# System packages the project needs and the machine may lack (installed only as root on Debian).
system:
	@bash scripts/ensure-system.sh

services: venv system
	@bash scripts/ensure-services.sh
	$(MANAGE) preflight

# gunicorn serves static files through whitenoise from STATIC_ROOT, with DEBUG off, so they are
# collected with DEBUG off: the manifest storage's hashed names and staticfiles.json. Collected with
# DEBUG on (the development default) the plain storage wrote no manifest, and under gunicorn every
# page was a 500 ("Missing staticfiles manifest entry for 'shop/shop.css'").
static: venv
	DJANGO_DEBUG=0 $(MANAGE) collectstatic --noinput -v0

# gunicorn's settings checked and the application loaded once (gunicorn.conf.py refuses a bad
# GUNICORN_* or SHOP_SERVER in one line), before serve starts or changes anything: serve seeded
# first, and a bad setting was refused only after the demo sale's orders were gone.
serve-check: static
	$(BIN)/gunicorn -c gunicorn.conf.py --check-config

# The shop under gunicorn on 127.0.0.1:8000 (DEBUG off), with the strategy from INVENTORY_STRATEGY.
# Only the demo products that are missing are created: the others, their stock and orders are kept
# (make seed, or make demo, resets them).
serve: serve-check services migrate
	$(MANAGE) seed --missing-only
	$(BIN)/gunicorn -c gunicorn.conf.py

nodes-start: venv
	$(MANAGE) redlock_nodes start

nodes-stop: venv
	$(MANAGE) redlock_nodes stop

migrate: services
	$(MANAGE) migrate --noinput

seed: migrate
	$(MANAGE) seed

lockbench: services
	$(MANAGE) lockbench --json artifacts/lockbench.json

# locks/_sync/{locks,base}.py are generated from the asyncio source in locks/_async/; a test fails when stale.
twins: venv
	$(BIN)/python scripts/unasync_locks.py

clean:
	-$(MANAGE) redlock_nodes stop
	rm -rf .run artifacts staticfiles
