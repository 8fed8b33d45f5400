# mqlet — see README.md. Every target runs as root on Debian 12.
export PATH := /usr/local/go/bin:$(PATH)
GO      ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X github.com/mqlet/mqlet/internal/version.Version=$(VERSION)
# grpcnotrace keeps grpc from linking golang.org/x/net/trace (the
# /debug/requests pages, which mqlet never serves): 6.9 MB of a 33.9 MB
# mqlet, 4 MiB of its idle RSS (docs/benchmarks.md).
TAGS    := grpcnotrace
GOBUILD := CGO_ENABLED=0 $(GO) build -trimpath -tags '$(TAGS)'

.PHONY: build test unit bench demo fmt vet fuzz clean release deb release-test chaos size size-record fleet-bench

build:
	$(GOBUILD) -ldflags '$(LDFLAGS)' -o bin/mqlet ./cmd/mqlet
	@if [ -d cmd/mqletctl ]; then $(GOBUILD) -ldflags "$(LDFLAGS)" -o bin/mqletctl ./cmd/mqletctl; fi

# The size guard: fails when a stripped binary grew more than 5 % past
# test/size/sizes.txt (test/run-tests.sh runs it; make release-test checks
# every architecture). What grew: go run ./test/size report on a build
# without -s -w.
size: build
	$(GO) run ./test/size check bin/mqlet bin/mqletctl

# A deliberate change of size: record the binaries of every architecture.
size-record: release
	$(GO) run ./test/size record dist/mqlet-linux-* dist/mqletctl-linux-*

# Everything: installs what the tests need, starts a private containerd and
# runs unit, integration and end-to-end tests, then stops what it started.
test:
	test/run-tests.sh

# The long fault-injection run: 20 minutes, at least 100 kills of the agent,
# a report of every invariant (test/run-chaos.sh).
chaos:
	test/run-chaos.sh

# Unit tests only (no broker, no containerd needed).
unit:
	$(GO) test -count=1 ./config/... ./logging/... ./agent/... ./api/...

bench:
	test/run-bench.sh

# The fleet simulator at 100 and 1,000 hollow agents in one process against
# a real mosquitto it starts itself (test/fleet; docs/benchmarks.md). The
# descriptor limit raised to the hard limit (20,000 here) is for mosquitto's and the agents' 1,000 sockets.
fleet-bench:
	ulimit -n $$(ulimit -Hn) && MQLET_FLEET_N=100 $(GO) test -count=1 -timeout 30m -run TestFleetBench -v ./test/fleet/
	ulimit -n $$(ulimit -Hn) && MQLET_FLEET_N=1000 $(GO) test -count=1 -timeout 30m -run TestFleetBench -v ./test/fleet/

# A single-box demo: containerd, mqlet with its embedded broker, a sample pod.
demo:
	test/demo.sh

fmt:
	gofmt -l -w .

vet:
	$(GO) vet ./...

fuzz:
	$(GO) test -run '^$$' -fuzz FuzzDecode$$ -fuzztime 300000x ./agent/manifest
	$(GO) test -run '^$$' -fuzz FuzzDecodeRef -fuzztime 300000x ./agent/manifest
	$(GO) test -run '^$$' -fuzz FuzzHandle -fuzztime 300000x ./agent/intake

# Static binaries of mqlet and mqletctl for every gateway architecture, with
# SHA256SUMS, into dist/. The Debian architecture names follow each binary.
RELEASE_ARCHES := amd64:amd64: arm64:arm64: arm:armhf:7
release:
	@rm -rf dist && mkdir -p dist
	@set -e; for spec in $(RELEASE_ARCHES); do \
		goarch=$${spec%%:*}; rest=$${spec#*:}; deb=$${rest%%:*}; goarm=$${rest#*:}; \
		for cmd in mqlet mqletctl; do \
			GOOS=linux GOARCH=$$goarch GOARM=$$goarm $(GOBUILD) \
				-ldflags '$(LDFLAGS)' -o dist/$$cmd-linux-$$deb ./cmd/$$cmd; \
		done; \
	done
	@cd dist && sha256sum mqlet* >SHA256SUMS
	@echo "version $(VERSION)"; cd dist && stat -c '%n %s bytes' mqlet*

# Debian packages (amd64, arm64, armhf) from the release binaries, with nfpm
# run from packaging/tools (its own go.mod; the Go proxy is the only source).
deb: release
	packaging/build-debs.sh "$(VERSION)"

# Release checks: cross builds run under qemu, the .deb installed on this
# machine with a pod on its containerd, an upgrade that keeps pods running.
release-test:
	test/release-tests.sh

clean:
	rm -rf bin dist
