# mqlet — see README.md. Every target runs as root on Debian 12.
export PATH := /usr/local/go/bin:$(PATH)
GO      ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X github.com/mqlet/mqlet/internal/version.Version=$(VERSION)

.PHONY: build test unit bench demo fmt vet fuzz clean

build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/mqlet ./cmd/mqlet
	@if [ -d cmd/mqletctl ]; then CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o bin/mqletctl ./cmd/mqletctl; fi

# Everything: installs what the tests need, starts a private containerd and
# runs unit, integration and end-to-end tests, then stops what it started.
test:
	test/run-tests.sh

# Unit tests only (no broker, no containerd needed).
unit:
	$(GO) test -count=1 ./config/... ./logging/... ./agent/... ./mqtt/topic/...

bench:
	test/run-bench.sh

# A single-box demo: containerd, mqlet with its embedded broker, a sample pod.
demo:
	test/demo.sh

fmt:
	gofmt -l -w .

vet:
	$(GO) vet ./...

fuzz:
	$(GO) test -run '^$$' -fuzz FuzzDecode$$ -fuzztime 60s ./agent/manifest
	$(GO) test -run '^$$' -fuzz FuzzDecodeRef -fuzztime 60s ./agent/manifest
	$(GO) test -run '^$$' -fuzz FuzzHandle -fuzztime 60s ./agent/intake

clean:
	rm -rf bin
