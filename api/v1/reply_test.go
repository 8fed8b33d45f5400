package apiv1

import (
	"encoding/json"
	"testing"
)

func TestDecodeReplyKeepsTheResultRaw(t *testing.T) {
	in := Reply{RequestID: "g1", Verb: VerbGet, Phase: Succeeded, Result: GetResult{Pods: nil}}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	r, err := DecodeReply(b)
	if err != nil || !r.Final() || r.RequestID != "g1" {
		t.Fatalf("decoded %+v, %v", r, err)
	}
	if got := string(r.RawResult()); got != `{"pods":null,"configMaps":null,"secrets":null}` {
		t.Fatalf("raw result %s", got)
	}
	// Re-encoding a decoded reply gives back the same result bytes.
	again, _ := json.Marshal(r)
	if r2, _ := DecodeReply(again); string(r2.RawResult()) != string(r.RawResult()) {
		t.Fatalf("round trip changed the result: %s", again)
	}
	none, err := DecodeReply([]byte(`{"requestId":"a","phase":"accepted","ts":"2026-01-01T00:00:00Z","future":1}`))
	if err != nil || none.Result != nil || none.RawResult() != nil {
		t.Fatalf("a reply without a result (and a field of a newer agent): %+v, %v", none, err)
	}
	if _, err := DecodeReply([]byte(`{"phase":`)); err == nil {
		t.Fatal("a truncated reply decoded")
	}
}

func TestPhaseRankOrdersThePhases(t *testing.T) {
	if !(PhaseRank(Accepted) < PhaseRank(InProgress) && PhaseRank(InProgress) < PhaseRank(Succeeded) &&
		PhaseRank(Succeeded) == PhaseRank(Failed) && PhaseRank("done") == 0) {
		t.Fatal("phase ranks out of order")
	}
}
