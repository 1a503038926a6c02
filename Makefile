# Every target runs on a fresh machine with Go, gcc and the PostgreSQL server binaries
# (see .ci/run, which installs what is missing). Tests start their own throwaway Postgres
# and an in-process Kafka-protocol broker; set GOHARVEST_TEST_DSN to use an existing server.

GO ?= go
# The race detector and librdkafka make the suite slow on two cores; the timeout is a
# backstop against a hung test, not a budget. Packages run one at a time (-p 1): the fault
# suite runs real processes, and the election tests measure timings that two busy cores would blur.
TEST_TIMEOUT ?= 15m

.PHONY: test lint bench demo chaos

## test: format check, vet, then every test (integration tests included) under the race detector
test: lint
	$(GO) test -race -count=1 -p 1 -timeout $(TEST_TIMEOUT) ./...

## lint: fail on unformatted files and on go vet findings
lint:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt would change:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...

## bench: every benchmark once (about 6 minutes), against a throwaway Postgres and the in-process
## broker, then one table of their figures (BENCH=Drain runs only those whose names match)
BENCH ?= .
bench: SHELL := /bin/bash
bench:
	set -o pipefail; $(GO) test -run '^$$' -bench '$(BENCH)' -benchtime 1x -count 1 -timeout 60m . \
		| $(GO) run ./internal/benchtable

## chaos: the long variants of the fault-tolerance suite (int/); prints the figures README reports
chaos:
	rm -f chaos-figures.txt
	GOHARVEST_CHAOS=1 GOHARVEST_CHAOS_FIGURES=$(CURDIR)/chaos-figures.txt $(GO) test -count=1 -v -timeout 60m ./int
	@echo; echo "figures:"; cat chaos-figures.txt

## demo: goharvest end to end: a throwaway Postgres, an in-process broker, the reaper and the
## pump, which writes a load and verifies it arrived in order (DEMO_ARGS="-records 200000" etc.)
demo:
	$(GO) build -o bin/ ./cmd/reaper ./cmd/pump ./cmd/demo
	bin/demo -bin bin $(DEMO_ARGS)
