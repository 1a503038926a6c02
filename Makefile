# Every target runs on a fresh machine with Go, gcc, Java 17 with Maven, the PostgreSQL server
# binaries, Prometheus (server and promtool) and Chromium (see .ci/run, which installs what is
# missing). Tests start their own throwaway Postgres
# and Apache Kafka clusters (internal/testkit/kafkacluster: the broker's jars from Maven Central, cached
# after the first fetch); set GOHARVEST_TEST_DSN to use an existing Postgres server.

GO ?= go
# The race detector and librdkafka make the suite slow on two cores; the timeout is a
# backstop against a hung test, not a budget.
TEST_TIMEOUT ?= 30m

# The packages whose tests time elections and Kafka's answers run one at a time (-p 1): two busy
# cores would blur their timings. The rest, which mostly wait on Postgres, Kafka nodes starting,
# builds and processes, run two at a time. The fault suite (int) runs alone.
MODULE := github.com/goharvest/goharvest
TIMED_PACKAGES := ./driver/franz ./driver/librdkafka ./neli ./int/embed ./internal/app/reaper

.PHONY: test lint bench demo dev chaos soak image image-binary kafka kafka-versions monitoring status-page-screenshot

# Modules inside this one, which ./... does not reach: the Kubernetes example's manifest test
# has a module of its own, so that goharvest does not depend on Kubernetes packages.
NESTED_MODULES := examples/kubernetes

# The engine (internal/engine/owner, internal/engine/epoch), its seams and the contract suites import no driver:
# their tests run without cgo, librdkafka or Postgres, which make test checks first; the engine's
# tests run once with each claim strategy (read, the default, and mark).
ENGINE_PACKAGES := ./driver ./driver/memory ./driver/drivertest ./event ./internal/engine/...

# The fault suite's scenarios that make test also runs with the librdkafka client (the reapers'
# default is franz): a failover, split brain, broker faults and the shard scenarios whose shards
# move between reapers (the election's part), and those that exist for librdkafka's own ways (a
# commit resumed after its call ran out of time, a member evicted when it stops polling). The shard
# scenarios whose faults are the whole cluster's or the database's, and the scenario at Kafka's
# default timings (a broker crash), run with franz here; make chaos runs every scenario with each
# client.
LIBRDKAFKA_SCENARIOS := ^(TestFailover|TestSplitBrainFrozenLeaderResumes|TestBrokerFaults|TestShardsReaper.*|TestSlowTransactionCommits|TestDatabaseHangsDuringEpochStart)$$

# What the pure-Go Kafka driver's cgo-free run proves: the package and its tests build without
# cgo, no dependency of it has cgo files, and a producer and an election keep their contracts (on
# kfake) in a binary without librdkafka. Its other kfake tests run under the race detector with
# the rest of the package; they test the same Go code, which no build tag varies.
FRANZ_NOCGO_TESTS := ^(TestNeedsNoCgo|TestCallsOutOfOrderAreRefused|TestFranzProducerContractOnKfake|TestFranzElectorContractOnKfake)$$

## test: format check, vet, the engine's tests and the pure-Go Kafka driver's (on kfake) without
## cgo, then every test (integration tests included) under the race detector, but the fault
## suite's, and the fault suite, with the franz client and then some of its scenarios again with
## the librdkafka client
# The fault suite runs its reapers as processes of their own, built without the race detector,
# so under the detector it would watch only the suite's own writers and checkers, and take about
# a tenth longer; the code those processes run is raced in its own packages' tests.
test: lint kafka
	CGO_ENABLED=0 $(GO) test -count=1 $(ENGINE_PACKAGES)
	GOHARVEST_TEST_CLAIM=mark CGO_ENABLED=0 $(GO) test -count=1 ./internal/engine/owner
	CGO_ENABLED=0 $(GO) test -count=1 -run '$(FRANZ_NOCGO_TESTS)' ./driver/franz
	$(GO) test -race -count=1 -p 2 -timeout $(TEST_TIMEOUT) $$($(GO) list ./... | grep -v -x -e '$(MODULE)/int' $(foreach p,$(TIMED_PACKAGES),-e '$(MODULE)/$(p:./%=%)'))
	$(GO) test -race -count=1 -p 1 -timeout $(TEST_TIMEOUT) $(TIMED_PACKAGES)
	$(GO) test -count=1 -timeout $(TEST_TIMEOUT) ./int
	GOHARVEST_TEST_KAFKA_CLIENT=librdkafka $(GO) test -count=1 -timeout $(TEST_TIMEOUT) -run '$(LIBRDKAFKA_SCENARIOS)' ./int
	for m in $(NESTED_MODULES); do (cd $$m && $(GO) test -race -count=1 ./...) || exit 1; done

## kafka: fetch the pinned Apache Kafka broker (internal/testkit/kafkacluster.DefaultVersion) from Maven
## Central into the tests' cache, once (GOHARVEST_KAFKA_VERSION picks another version)
kafka:
	$(GO) run ./internal/testkit/kafkacluster/fetchjars

## kafka-versions: the tests of Kafka's semantics (the election, the harvester on Kafka, the
## fixture) on each Kafka version docs/operations.md lists as tested: the oldest and the newest 4.x served
KAFKA_VERSIONS ?= 4.0.1 4.4.0
kafka-versions:
	$(GO) run ./internal/testkit/kafkacluster/fetchjars $(KAFKA_VERSIONS)
	for v in $(KAFKA_VERSIONS); do \
		echo "== Kafka $$v"; \
		GOHARVEST_KAFKA_VERSION=$$v $(GO) test -count=1 -p 1 -timeout $(TEST_TIMEOUT) ./internal/testkit/kafkacluster ./neli ./driver/franz ./int/embed || exit 1; \
	done

## lint: fail on unformatted files and on go vet findings
lint:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt would change:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	for m in $(NESTED_MODULES); do (cd $$m && $(GO) vet ./...) || exit 1; done

## bench: every benchmark once with each Kafka client in CLIENTS (about 6 minutes each), against
## a throwaway Postgres and Apache Kafka, then a table of each client's figures (BENCH=Drain runs
## only those whose names match; BENCH is taken as written, so that a regular expression's $ is
## not read as one of make's variables). BROKER=kafka3 runs them on a 3-node cluster, BROKER=kfake
## on the fake broker; CLIENTS=franz on the franz client only. IDLE_WINDOW=10m measures
## BenchmarkIdleOutboxes' idle reaper for that long rather than a minute, printing each minute's CPU.
BENCH ?= .
IDLE_WINDOW ?=
BROKER ?= kafka
CLIENTS ?= librdkafka franz
bench: SHELL := /bin/bash
bench: kafka
	set -o pipefail; for client in $(CLIENTS); do echo "== Kafka client: $$client"; \
		GOHARVEST_BENCH_CLIENT=$$client GOHARVEST_BENCH_BROKER=$(BROKER) GOHARVEST_BENCH_IDLE_WINDOW=$(IDLE_WINDOW) $(GO) test -run '^$$' -bench '$(value BENCH)' -benchtime 1x -count 1 -timeout 60m ./bench \
		| $(GO) run ./internal/testkit/benchtable || exit 1; done

## chaos: the long variants of the fault-tolerance suite (int/), once with each Kafka client in
## CLIENTS (about 28 minutes each), and a writing transaction held open for ten minutes; prints the
## figures docs/reliability.md reports
chaos:
	rm -f chaos-figures-*.txt
	for client in $(CLIENTS); do echo "== Kafka client: $$client"; \
		GOHARVEST_TEST_KAFKA_CLIENT=$$client GOHARVEST_CHAOS=1 GOHARVEST_CHAOS_FIGURES=$(CURDIR)/chaos-figures-$$client.txt \
		$(GO) test -count=1 -v -timeout 60m ./int || exit 1; done
	GOHARVEST_CHAOS=1 $(GO) test -count=1 -v -timeout 30m -run '^TestLongTransactionDelaysOnlyItsOwnRows$$' ./int/embed
	@for client in $(CLIENTS); do echo; echo "figures, Kafka client $$client:"; cat chaos-figures-$$client.txt; done

## soak: the randomized soaks, SOAK each (default 30m): int/TestSoak, 3 reapers on 8 shards under load,
## every kind of fault chosen at random on a schedule it prints first; then int/TestSoakProduction,
## the production settings' rig (3 nodes at Kafka's default timings, heartbeatTimeout 5s) with
## random nodes restarted (SIGTERM) or crashed (SIGKILL) one after another. Each ends with the
## checker and a figures summary. SOAK_SEED=n replays a run's choices; raise SOAK_TIMEOUT past
## twice SOAK plus 10m. The reapers run the default Kafka client, franz;
## GOHARVEST_TEST_KAFKA_CLIENT=librdkafka make soak soaks the other.
SOAK ?= 30m
SOAK_SEED ?=
SOAK_TIMEOUT ?= 3h
soak:
	GOHARVEST_SOAK=$(SOAK) SOAK_SEED=$(SOAK_SEED) $(GO) test -count=1 -v -run '^TestSoak(Production)?$$' -timeout $(SOAK_TIMEOUT) ./int

## monitoring: write monitoring/goharvest-rules.yaml (reaper rules for the default settings) and
## examples/kubernetes/prometheusrule.yaml (for its ConfigMap's settings) anew, after changing the rules
monitoring:
	GOHARVEST_UPDATE_MONITORING=1 $(GO) test -count=1 -run '^TestRulesFileIsCurrent$$' ./internal/app/reaper
	cd examples/kubernetes && GOHARVEST_UPDATE_MONITORING=1 $(GO) test -count=1 -run '^TestPrometheusRuleFollowsTheReaperConfig$$' .

## status-page-screenshot: run the status page's browser test and keep its screenshot as
## docs/status-page.png, which docs/monitoring.md shows (needs chromium, Postgres and Kafka like make test)
status-page-screenshot: kafka
	GOHARVEST_STATUS_SCREENSHOT=$(CURDIR)/docs/status-page.png $(GO) test -count=1 -run '^TestStatusPageInABrowser$$' ./internal/app/reaper

## demo: goharvest end to end: a throwaway Postgres, an in-process broker, the reaper and the
## pump, which writes a load and verifies it arrived in order (DEMO_ARGS="-records 200000" etc.)
demo:
	$(GO) build -o bin/ ./cmd/reaper ./cmd/pump ./cmd/demo
	bin/demo -bin bin $(DEMO_ARGS)

## dev: a throwaway PostgreSQL and one Apache Kafka node (the tests' KRaft node, from the cached
## jars) to try the reaper on: builds reaper, pump and devstack into bin/, prints what to export
## (also written to bin/dev.env, with a reaper configuration in bin/dev-reaper.yaml) and runs
## until Ctrl-C, which stops both and deletes their data. docs/getting-started.md walks from it
## to a message read back from Kafka. DEV_ARGS="-database app" etc.
dev: kafka
	$(GO) build -o bin/ ./cmd/reaper ./cmd/pump ./cmd/devstack
	bin/devstack $(DEV_ARGS)

## image: the reaper's container image, with podman (or docker when podman is missing):
## FROM scratch, one static binary (image-binary), CA certificates, user 65532.
## `make image IMAGE=registry.example.com/reaper:v1 VERSION=v1` names it; KAFKA_CLIENT=franz
## builds the binary without cgo or musl, with the franz client only (see image-binary).
VERSION ?= $(shell sed -n 's/^const Version = "\(.*\)"$$/\1/p' version.go)
IMAGE ?= goharvest/reaper:$(VERSION)
CONTAINER_ENGINE ?= $(shell command -v podman || command -v docker)
CA_CERTS ?= /etc/ssl/certs/ca-certificates.crt
IMAGE_DIR ?= bin/image
KAFKA_CLIENT ?= librdkafka
# bin/image is the build context: all the image holds. BUILDAH_LAYERS keeps podman from storing an
# intermediate image per step: each build's binary differs, so they would only pile up (docker
# ignores it).
image:
	@test -n "$(CONTAINER_ENGINE)" || { echo "make image needs podman or docker"; exit 1; }
	@test -r $(CA_CERTS) || { echo "make image needs $(CA_CERTS) (Debian: apt-get install ca-certificates)"; exit 1; }
	$(MAKE) --no-print-directory image-binary
	cp $(CA_CERTS) $(IMAGE_DIR)/ca-certificates.crt
	printf 'root:x:0:0:root:/:/sbin/nologin\nreaper:x:65532:65532:reaper:/:/sbin/nologin\n' >$(IMAGE_DIR)/passwd
	printf 'root:x:0:\nreaper:x:65532:\n' >$(IMAGE_DIR)/group
	BUILDAH_LAYERS=false $(CONTAINER_ENGINE) build --build-arg VERSION=$(VERSION) -t $(IMAGE) -f Containerfile $(IMAGE_DIR)
	@echo "$(IMAGE): $$($(CONTAINER_ENGINE) image inspect --format '{{.Size}}' $(IMAGE) | awk '{printf "%.1f MB", $$1/1e6}')"

## image-binary: the image's reaper alone, static, in IMAGE_DIR (bin/image); needs no container
## engine. KAFKA_CLIENT=librdkafka (the default): with cgo and musl (Debian: musl-tools), both
## Kafka clients (franz the default, librdkafka a line of YAML away). KAFKA_CLIENT=franz:
## CGO_ENABLED=0, no C compiler or musl, the franz client only (librdkafka refused).
# The build tag musl selects confluent-kafka-go's static librdkafka for musl; netgo and osusergo
# keep the Go side's name and user lookups in Go (a build without cgo has nothing else); the
# linker stamps the version that reaper --version prints.
REAPER_LDFLAGS = -s -w -X github.com/goharvest/goharvest/internal/app/reaper.version=$(VERSION)
image-binary:
	rm -rf $(IMAGE_DIR) && mkdir -p $(IMAGE_DIR)
ifeq ($(KAFKA_CLIENT),franz)
	CGO_ENABLED=0 $(GO) build -trimpath -o $(IMAGE_DIR)/reaper -ldflags '$(REAPER_LDFLAGS)' ./cmd/reaper
else ifeq ($(KAFKA_CLIENT),librdkafka)
	@command -v musl-gcc >/dev/null || { echo "KAFKA_CLIENT=librdkafka needs musl-gcc (Debian: apt-get install musl-tools); KAFKA_CLIENT=franz needs none"; exit 1; }
	CGO_ENABLED=1 CC=musl-gcc $(GO) build -tags musl,netgo,osusergo -trimpath -o $(IMAGE_DIR)/reaper \
		-ldflags '$(REAPER_LDFLAGS) -linkmode external -extldflags -static' ./cmd/reaper
else
	$(error KAFKA_CLIENT is "$(KAFKA_CLIENT)": must be librdkafka or franz)
endif
