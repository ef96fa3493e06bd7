# Conveyor: the two commands are `make demo` and `make test`.
SHELL := /bin/bash
CARGO ?= cargo

.PHONY: demo test test-setup check lint local-aws stop-local-aws browser moto fauxqs bench chaos simulate flow-soak

## Runs the example application end to end on the local AWS stack (installed on first use).
demo: local-aws
	$(CARGO) build -p conveyor-examples -p conveyor-cli -p conveyor-demo --bins
	./target/debug/demo

## Runs every test: formatting, clippy, unit, conformance, end to end (starts the local AWS stack), the
## console in headless Chromium (installed with apt-get on first use, see localstack/install-chromium.sh),
## doctests, and the API docs with broken links denied. The installs and the emulators' start (network
## and disk) overlap clippy (CPU); the test binaries run three at a time, the doctests and the docs beside
## them (scripts/test_binaries.py; CONVEYOR_TEST_JOBS=1 runs them one after another, as cargo test does).
test:
	$(MAKE) --no-print-directory -j2 lint test-setup
	$(CARGO) build -p conveyor-examples -p conveyor-cli -p conveyor-demo --bins
	CARGO=$(CARGO) python3 scripts/test_binaries.py \
		--also '$(CARGO) test --workspace --doc && RUSTDOCFLAGS="-D warnings" $(CARGO) doc --workspace --no-deps' \
		--workspace --all-targets

## What `make test` needs besides the build, one after the other (the first two may use apt-get).
test-setup:
	$(MAKE) --no-print-directory local-aws browser moto fauxqs

## The fast tier for day-to-day work, no emulators needed: formatting, clippy, unit tests, the in-memory
## doubles and their conformance suites, both runtimes on them, the small examples, doctests, and the
## simulator's fixed seeds (a fifth of each simulation's seeds here, every once-failed seed; `make test` runs
## them all). `make test` runs all of this and everything that needs LocalStack.
CHECK_SEEDS = FIXED_SEEDS=300 DELAY_SEEDS=40 TIMER_SEEDS=60 OUTBOX_SEEDS=80 SCHEDULE_SEEDS=60 FLOW_SEEDS=8 \
	TENANT_SEEDS=40
CHECK_TESTS = --test memory --test batch --test request_shape --test http --test skip_while_running \
	--test doubles --test simulations
check: lint
	$(CHECK_SEEDS) $(CARGO) test --workspace --lib --bins --examples $(CHECK_TESTS) --no-fail-fast
	$(CARGO) test --workspace --doc

lint:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

## Starts LocalStack (SQS) on 127.0.0.1:4566, DynamoDB Local on 127.0.0.1:8000 and Postgres (the outbox's
## Postgres tests; Debian's package, installed on first use) on 127.0.0.1:55432; harmless when running.
local-aws:
	./localstack/start.sh

stop-local-aws:
	./localstack/stop.sh

## Installs Debian's chromium and chromium-driver for the console's browser tests (once; says how otherwise).
browser:
	./localstack/install-chromium.sh

## Installs moto's server (PyPI, pinned, into .local/moto/venv; once) for the console's fair-queue test
## (CloudWatch in the SDK's current protocol, which LocalStack 4.8.1 does not speak) and the fidelity
## matrix. The tests install it too.
moto:
	./localstack/install-moto.sh >/dev/null

## Installs fauxqs 2.4.1 and the Node 22 it needs (npm, pinned, into .local/fauxqs; once), the third SQS
## implementation of the fidelity matrix (docs/running.md, "Emulator fidelity"). The test installs it too.
fauxqs:
	./localstack/install-fauxqs.sh >/dev/null

## The chaos run: 10,000 example jobs through 3 workers and the Lambda runner while workers are SIGKILLed
## and the emulators slowed down; fails unless every effect happened once. CHAOS_ARGS="--seed N" replays.
chaos: local-aws
	$(CARGO) build -p conveyor-examples -p conveyor-cli -p conveyor-demo --bins
	./target/debug/chaos --jobs 10000 $(CHAOS_ARGS)

## Prints the benchmark figures quoted in the README.
bench: local-aws
	$(CARGO) run --release -p conveyor-worker --example bench
	$(CARGO) build --release -p conveyor-cli --bin conveyor
	$(CARGO) build --release -p conveyor-lambda --example probe_function
	$(CARGO) run --release -p conveyor-worker --example bench_idempotent
	$(CARGO) run --release -p conveyor-worker --example batch_bench
	$(CARGO) run --release -p conveyor-dynamodb --example claim_bench
	$(CARGO) run --release -p conveyor-lambda --example overhead
	$(CARGO) run --release -p conveyor-lambda --example managed_instances
	$(CARGO) run --release -p conveyor-sqs --example send_bench
	$(CARGO) run --release -p conveyor-sim --example tenant_bench
	$(CARGO) run --release -p conveyor-outbox --example backlog_bench -- 10000
	$(CARGO) run --release -p conveyor-otel --example trace_cost
	$(CARGO) build --profile dist -p conveyor-examples --bin bootstrap --bin worker
	@for binary in bootstrap worker; do \
		stat -c '%s' target/dist/$$binary | awk -v name=$$binary '{ printf "stripped dist-profile %s: %.2f MiB (%d bytes)\n", name, $$1 / 1048576, $$1 }'; \
	done

## Runs SEEDS seeds of the simulator (crates/conveyor-sim) in parallel, with progress; a failing seed
## prints the command that replays it with a trace.
SEEDS ?= 10000
simulate:
	$(CARGO) run --release -p conveyor-sim --bin simulate -- --seeds $(SEEDS)

## The large flow end to end at 10,000 children (3 workers, one SIGKILLed, 3 children dead-lettered by
## SQS's redrive); prints creation and counting rates, requests per child and the jobs index's spread.
flow-soak: local-aws
	$(CARGO) build -p conveyor-examples -p conveyor-cli -p conveyor-demo --bins
	CONVEYOR_E2E_FLOW_CHILDREN=10000 $(CARGO) test -p conveyor-e2e --test flows a_large_flow -- --nocapture
