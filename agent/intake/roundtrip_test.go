package intake

import (
	"encoding/json"
	"strings"
	"testing"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// get shows a Secret's values as "<redacted: N bytes>"; applying that
// output must be refused naming the key, and the stored value kept.
func TestSecretRoundTripThroughGetIsRefused(t *testing.T) {
	r := newRig(t)
	secret := `{"apiVersion":"v1","kind":"Secret","metadata":{"name":"creds"},"stringData":{"pw":"hunter2-hunter2"}}`
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/apply/s1", Payload: []byte(secret)})
	if got := r.sender.last("s1"); got.Phase == apiv1.Failed {
		t.Fatalf("apply secret: %+v", got)
	}
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/get/g1", Payload: []byte(`{"kind":"Secret","name":"creds"}`)})
	res, ok := r.sender.last("g1").Result.(apiv1.GetResult)
	if !ok || len(res.Secrets) != 1 || string(res.Secrets[0].Data["pw"]) != "<redacted: 15 bytes>" {
		t.Fatalf("get secret: %+v", r.sender.last("g1"))
	}
	out, err := json.Marshal(res.Secrets[0])
	if err != nil {
		t.Fatal(err)
	}
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/apply/s2", Payload: out})
	got := r.sender.last("s2")
	if got.Phase != apiv1.Failed || !strings.Contains(got.Message, "data[pw]") || !strings.Contains(got.Message, "placeholder") {
		t.Fatalf("apply of get's output: %+v", got)
	}
	stored, err := r.st.ListSecrets()
	if err != nil || len(stored) != 1 || string(stored[0].Data["pw"]) != "hunter2-hunter2" {
		t.Fatalf("stored secret changed: %v %v", stored, err)
	}
}

func TestPlaceholdersAreRefusedNamingTheKey(t *testing.T) {
	cases := map[string]struct{ payload, want string }{
		"secret stringData": {`{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s"},"stringData":{"token":"<redacted: 3 bytes>","ok":"fine"}}`, "data[token]"},
		"configmap listing": {`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c"},"data":{"a":"1","big":"<omitted: 921600 bytes>"}}`, "data[big]"},
		"configmap binary":  {`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c"},"binaryData":{"bin":"PG9taXR0ZWQ6IDQgYnl0ZXM+"}}`, "binaryData[bin]"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			r := newRig(t)
			r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/apply/p1", Payload: []byte(c.payload)})
			got := r.sender.last("p1")
			if got.Phase != apiv1.Failed || !strings.Contains(got.Message, c.want) {
				t.Fatalf("want failed naming %s, got %+v", c.want, got)
			}
		})
	}
	// A value that only mentions a placeholder is data like any other.
	r := newRig(t)
	r.in.Handle(Command{Topic: "mqlet/v1/n1/cmd/apply/p2", Payload: []byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c"},"data":{"doc":"get shows <redacted: 3 bytes> for secrets"}}`)})
	if got := r.sender.last("p2"); got.Phase == apiv1.Failed {
		t.Fatalf("a value mentioning a placeholder was refused: %+v", got)
	}
}
