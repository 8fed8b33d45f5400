package intake

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/mqlet/mqlet/agent/validate"
	apiv1 "github.com/mqlet/mqlet/api/v1"
)

func hostPortPod(name string, port int, hostIP string) string {
	return fmt.Sprintf(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":%q},"spec":{"containers":[{"name":"c","image":"i",
	  "ports":[{"containerPort":80,"hostPort":%d,"hostIP":%q}]}]}}`, name, port, hostIP)
}

// A hostPort another desired pod holds is refused (the kubelet's
// HostPortConflict): the DNAT rules of two pods on one port decide by
// order, so the newcomer would take the first pod's clients once its
// sandbox is made again.
func TestHostPortConflictRefused(t *testing.T) {
	r := newRig(t)
	r.in.opts.Policy.AllowedHostPorts = []validate.PortRange{{First: 18080, Last: 18081}}
	r.in.Handle(cmd("apply", "victim", hostPortPod("victim", 18080, "")))
	if got := r.sender.last("victim").Phase; got != apiv1.InProgress {
		t.Fatalf("victim: %+v", r.sender.last("victim"))
	}
	for id, pod := range map[string]string{
		"thief":    hostPortPod("thief", 18080, ""),
		"thief-ip": hostPortPod("thief-ip", 18080, "127.0.0.1"),
	} {
		r.in.Handle(cmd("apply", id, pod))
		last := r.sender.last(id)
		if last.Phase != apiv1.Failed || !strings.Contains(last.Message, "HostPortConflict: hostPort 18080/TCP of pod default/"+id+" is held by pod default/victim") {
			t.Fatalf("%s: %+v", id, last)
		}
	}
	if !slices.Contains(r.events.reasons, ReasonHostPortConflict) {
		t.Fatalf("events %v", r.events.reasons)
	}
	// Two pods of one command conflict too; the victim may update itself;
	// another port is free; a sync that drops the victim frees its port.
	r.in.Handle(cmd("apply", "pair", `{"apiVersion":"v1","kind":"List","items":[`+hostPortPod("a", 18081, "")+","+hostPortPod("b", 18081, "")+`]}`))
	if last := r.sender.last("pair"); last.Phase != apiv1.Failed || !strings.Contains(last.Message, "HostPortConflict") {
		t.Fatalf("pair: %+v", last)
	}
	for id, pod := range map[string]string{"update": hostPortPod("victim", 18080, ""), "other": hostPortPod("other", 18081, "")} {
		r.in.Handle(cmd("apply", id, pod))
		if got := r.sender.last(id).Phase; got != apiv1.InProgress {
			t.Fatalf("%s: %+v", id, r.sender.last(id))
		}
	}
	r.in.Handle(cmd("sync", "takeover", `{"apiVersion":"v1","kind":"List","items":[`+hostPortPod("thief", 18080, "")+`]}`))
	if got := r.sender.last("takeover").Phase; got != apiv1.InProgress {
		t.Fatalf("sync replacing the holder: %+v", r.sender.last("takeover"))
	}
}
