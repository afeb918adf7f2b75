# Projector's everyday commands. `make demo` and `make test` are the two a
# newcomer needs; both find a PostgreSQL or start a throwaway one.

GO       ?= go
PKGS     ?= ./...
# The packages whose tests take longest, named first when the whole suite
# runs: go test starts test binaries in the order it is given packages, as
# many at once as there are cores, and a long package started last runs
# alone at the end while the other cores idle (stores/postgres, last of
# ./..., ran 90 s alone on two cores). Longest first, the short ones fill
# in at the end. Only the order changes: ./... still names every package once.
SLOW_PKGS ?= ./projection ./rebuild ./cli ./stores/jetstream ./search ./stores/postgres ./console ./saga ./cmd/projector ./internal/benchmark ./live
TEST_PKGS := $(if $(filter ./...,$(PKGS)),$(SLOW_PKGS) )$(PKGS)
# Set by scripts/test-database-url when a local server answers; empty means
# the test harness starts a throwaway cluster from the local binaries.
TEST_DB  := $(shell scripts/test-database-url)
STATICCHECK_VERSION ?= v0.8.2
# The test targets build with -trimpath (through GOFLAGS, so the builds the
# tests run themselves, such as the docs' snippets, do too): the build
# cache's keys then leave out the checkout's directory, and a second clone
# on the same machine (CI's clean checkout) reuses what an earlier run
# compiled instead of compiling every package of this module again, vet
# included (about two minutes of a two-core machine).
TEST_GOFLAGS := $(strip $(GOFLAGS) -trimpath)

.PHONY: all demo test test-soak test-short bench fuzz lint build clean

all: build test

## demo: run the helpdesk example end to end (finds or starts PostgreSQL)
demo:
	$(GO) run ./cmd/projector demo

## build: build the projector binary into bin/
build:
	$(GO) build -o bin/projector ./cmd/projector

## test: vet, then the whole suite with the race detector against real PostgreSQL
## (the timeout covers a binary waiting for its turn in the connection budget)
# vet runs with -race too: the dependencies it compiles to check a package
# are then the ones the race-built tests link, so the suite finds them in the
# build cache (on an empty cache, building projection's and rebuild's tests
# after vet took 39 s instead of 150 s). A file only built without -race
# (race_off_test.go) is vetted by `make lint`.
test:
	GOFLAGS="$(TEST_GOFLAGS)" $(GO) vet -race $(PKGS)
	GOFLAGS="$(TEST_GOFLAGS)" PROJECTOR_TEST_DATABASE_URL="$(TEST_DB)" $(GO) test -race -count=1 -timeout 30m $(TEST_PKGS)

## test-soak: the suite with the race detector and the crash and concurrency
## tests at their full sizes (PROJECTOR_SOAK=1: more kills and rounds), before a release
test-soak:
	GOFLAGS="$(TEST_GOFLAGS)" PROJECTOR_SOAK=1 PROJECTOR_TEST_DATABASE_URL="$(TEST_DB)" $(GO) test -race -count=1 -timeout 60m $(TEST_PKGS)

## test-short: the suite without -race, for a quick loop
test-short:
	GOFLAGS="$(TEST_GOFLAGS)" PROJECTOR_TEST_DATABASE_URL="$(TEST_DB)" $(GO) test -count=1 $(TEST_PKGS)

## bench: benchmarks, each printed beside its raw-PostgreSQL baseline (about 10 minutes)
bench:
	PROJECTOR_TEST_DATABASE_URL="$(TEST_DB)" $(GO) test -run '^$$' -bench . -benchtime 3s -timeout 30m ./stores/postgres ./aggregate
	PROJECTOR_TEST_DATABASE_URL="$(TEST_DB)" $(GO) test -run '^$$' -bench 'AppendInline' -benchtime 3s ./projection
	PROJECTOR_TEST_DATABASE_URL="$(TEST_DB)" $(GO) test -run '^$$' -bench 'CatchUp|Latency' -benchtime 1x -timeout 30m ./projection
	PROJECTOR_TEST_DATABASE_URL="$(TEST_DB)" $(GO) test -run '^$$' -bench 'Rebuild|SyncCommitOff' -benchtime 1x -timeout 30m ./rebuild
	# Needs NATS with JetStream at $$NATS_URL (default nats://127.0.0.1:4222).
	PROJECTOR_TEST_DATABASE_URL="$(TEST_DB)" $(GO) test -run '^$$' -bench 'Relay|ClaimsConsumer' -benchtime 1x -timeout 30m ./stores/jetstream

## fuzz: run each fuzz target for FUZZTIME (default 20s)
FUZZTIME ?= 20s
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzDecode$$' -fuzztime $(FUZZTIME) .
	$(GO) test -run '^$$' -fuzz '^FuzzParsePosition$$' -fuzztime $(FUZZTIME) .
	$(GO) test -run '^$$' -fuzz '^FuzzStreamRefValidate$$' -fuzztime $(FUZZTIME) .
	$(GO) test -run '^$$' -fuzz '^FuzzMetadataValidate$$' -fuzztime $(FUZZTIME) .
	$(GO) test -run '^$$' -fuzz '^FuzzEncodeStorable$$' -fuzztime $(FUZZTIME) .
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeEnvelope$$' -fuzztime $(FUZZTIME) ./stores/postgres

## lint: gofmt, go.mod tidy, vet and staticcheck
lint:
	@test -z "$$(gofmt -l .)" || (gofmt -l . && echo "gofmt needed" && exit 1)
	@$(GO) mod tidy -diff || (echo "go.mod/go.sum not tidy: run go mod tidy" && exit 1)
	$(GO) vet $(PKGS)
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) $(PKGS)

clean:
	rm -rf bin
