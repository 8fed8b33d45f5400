package main

import (
	"strings"
	"testing"

	"github.com/mqlet/mqlet/mqtt/broker"
	"github.com/mqlet/mqlet/mqtt/broker/testcert"
)

func TestMutualTLS(t *testing.T) {
	certs := testcert.Generate(t)
	url := startBroker(t, broker.Options{TLS: certs.ServerTLS(t, true)})
	vars := map[string]string{envBroker: url, envNode: "n1"}

	res := runCLIEnv(t, vars, "", "status", "--retained-wait", "100ms",
		"--ca-file", certs.CA, "--cert-file", certs.ClientCert, "--key-file", certs.ClientKey)
	// No agent publishes here: connecting works, the state is unknown.
	if res.code != 1 || !strings.Contains(res.stdout, "unknown (no retained state message") {
		t.Fatalf("status over mTLS: %v", res)
	}

	res = runCLIEnv(t, vars, "", "status", "--ca-file", certs.CA, "--timeout", "5s")
	if res.code != 1 || !strings.Contains(res.stderr, "cannot reach broker") {
		t.Fatalf("status without a client certificate on an mTLS broker: %v", res)
	}

	res = runCLIEnv(t, vars, "", "status", "--cert-file", certs.ClientCert)
	if res.code != 1 || !strings.Contains(res.stderr, "certificate and key must be given together") {
		t.Fatalf("status with a certificate and no key: %v", res)
	}
}
