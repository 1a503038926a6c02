# Every target runs on a fresh machine with Go, gcc and the PostgreSQL server binaries
# (see .ci/run, which installs what is missing). Tests start their own throwaway Postgres
# and an in-process Kafka-protocol broker; set GOHARVEST_TEST_DSN to use an existing server.

GO ?= go
# The race detector and librdkafka make the suite slow on two cores; the timeout is a
# backstop against a hung test, not a budget.
TEST_TIMEOUT ?= 15m

.PHONY: test lint bench demo

## test: format check, vet, then every test (integration tests included) under the race detector
test: lint
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) ./...

## lint: fail on unformatted files and on go vet findings
lint:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt would change:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...

## bench: the benchmarks, against a throwaway Postgres and the in-process broker
bench:
	$(GO) test -run '^$$' -bench . -benchtime 1x -count 1 ./...

## demo: the reaper and the pump end to end (not built yet)
demo:
	@echo "make demo needs the reaper sidecar and the pump load generator, which are not built yet" >&2
	@exit 1
