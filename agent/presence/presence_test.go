package presence

import (
	"encoding/json"
	"errors"
	"testing"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

type counter struct {
	n   uint64
	err error
}

func (c *counter) NextSeq() (uint64, error) { c.n++; return c.n, c.err }

func TestOnlineSeqIncreasesAndOfflineSharesBootID(t *testing.T) {
	c := &counter{n: 41}
	p := New("mqlet/v1/n/state", "v1.2.3", "age1example", c, nil)
	var first, second, off apiv1.NodeState
	m1, err := p.Online()
	if err != nil {
		t.Fatal(err)
	}
	m2, _ := p.Online()
	if err := json.Unmarshal(m1.Payload, &first); err != nil {
		t.Fatal(err)
	}
	_ = json.Unmarshal(m2.Payload, &second)
	_ = json.Unmarshal(p.Offline().Payload, &off)
	if first.State != "online" || first.Seq != 42 || second.Seq != 43 {
		t.Fatalf("seq not increasing: %+v %+v", first, second)
	}
	if first.SealingKey != "age1example" || off.SealingKey != "age1example" {
		t.Fatalf("sealing key not in online %+v or offline %+v", first, off)
	}
	if off.State != "offline" || off.BootID != first.BootID || len(first.BootID) != 36 {
		t.Fatalf("offline %+v vs online %+v", off, first)
	}
	if !m1.Retained || m1.QoS != 1 || m1.Topic != "mqlet/v1/n/state" {
		t.Fatalf("envelope %+v", m1)
	}
	if New("t", "v", "", c, nil).BootID() == p.BootID() {
		t.Fatal("boot id must be new per process start")
	}
}

func TestOnlineFailsWhenSeqCannotBePersisted(t *testing.T) {
	p := New("t", "v", "", &counter{err: errors.New("disk full")}, nil)
	if _, err := p.Online(); err == nil {
		t.Fatal("want error")
	}
}

// The online state names the groups and the generation of each group
// document applied, as they are when it is made.
func TestOnlineNamesGroupGenerations(t *testing.T) {
	p := New("mqlet/v1/n1/state", "v1", "", &counter{}, nil)
	gens := map[string]uint64{"line-1": 4}
	p.SetGroups(func() []string { return []string{"line-1"} })
	p.SetGenerations(func() map[string]uint64 { return gens })
	m, err := p.Online()
	if err != nil {
		t.Fatal(err)
	}
	var s apiv1.NodeState
	if err := json.Unmarshal(m.Payload, &s); err != nil {
		t.Fatal(err)
	}
	if s.GroupGenerations["line-1"] != 4 || len(s.Groups) != 1 {
		t.Fatalf("state %s", m.Payload)
	}
	gens = map[string]uint64{"line-1": 5}
	m, _ = p.Online()
	if err := json.Unmarshal(m.Payload, &s); err != nil || s.GroupGenerations["line-1"] != 5 {
		t.Fatalf("second state %s", m.Payload)
	}
}
