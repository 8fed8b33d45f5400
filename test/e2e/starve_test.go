package e2e

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// A broker user cannot starve the operator (issue 20, class 6): eight
// followed logs that nobody reads take at most requests.maxFollows slots
// (per requester: maxFollowsPerRequester), so the operator's one-shot
// logs still runs at once; and each abandoned follower ends
// "unread" after logs.unreadTimeout, while one whose reader says it reads
// (on the request's input topic) runs on. Before the bound, the eight
// filled requests.maxStreams and the operator's logs was refused "too many
// requests running" for logs.maxFollow (10 minutes).
func TestAbandonedFollowersDoNotStarveTheOperator(t *testing.T) {
	e := startPodEnv(t, func(logDir string) string {
		return verbsConfig(logDir, false) + "requests:\n  maxStreams: 8\n  maxFollows: 6\n  maxFollowsPerRequester: 4\n"
	})
	e.cleanupPods("ticker")
	e.apply(e.pod("ticker", "Always", "while true; do echo tick; sleep 0.5; done"), apiv1.Succeeded, podReadyTimeout)

	payload, _ := json.Marshal(apiv1.LogsRequest{Namespace: e.ns, Name: "ticker", Follow: true, FollowSeconds: 300})
	var follows []string
	for range 8 {
		id := e.nextID("logs")
		follows = append(follows, id)
		e.mq.Command(e.node, "logs", id, payload)
	}
	// Each follow either runs (it sends the ticker's lines) or is refused.
	var running, refused []string
	for _, id := range follows {
		r := e.mq.WaitFor(0, 60*time.Second, "a chunk or a refusal of "+id, func(m Msg) bool {
			r, err := apiv1.DecodeReply(m.Payload)
			return err == nil && m.Topic == prefix+"/"+e.node+"/reply/"+id && (r.Phase == apiv1.InProgress || r.Phase == apiv1.Failed)
		})
		rep, _ := apiv1.DecodeReply(r.Payload)
		if rep.Phase == apiv1.Failed {
			if !strings.Contains(rep.Message, "too many requests running") {
				t.Fatalf("follow %s refused for another reason: %s", id, rep.Message)
			}
			refused = append(refused, id)
			continue
		}
		running = append(running, id)
	}
	t.Logf("%d of 8 unsigned followers run, %d refused", len(running), len(refused))
	if len(running) != 4 {
		t.Fatalf("%d unsigned followers run, want maxFollowsPerRequester (4)", len(running))
	}

	// The operator's one-shot logs runs beside them.
	tail := int64(1)
	lines, _ := logLines(t, e.command("logs", apiv1.LogsRequest{Namespace: e.ns, Name: "ticker", TailLines: &tail}, verbsTimeout))
	if len(lines) != 1 || lines[0] != "tick" {
		t.Fatalf("the operator's logs beside 4 followers: %q", lines)
	}

	// Keep the first follower read; the others' readers are gone.
	kept := running[0]
	stop := make(chan struct{})
	beats := make(chan struct{})
	go func() {
		defer close(beats)
		tick := time.NewTicker(apiv1.InputInterval)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				e.mq.c.Publish(prefix+"/"+e.node+"/in/"+kept, 0, false, []byte{})
			}
		}
	}()
	defer func() { close(stop); <-beats }()
	// The default logs.unreadTimeout is 30 s.
	for _, id := range running[1:] {
		e.waitFinal(id, apiv1.Succeeded, 90*time.Second)
		f := final(t, e.replies(id), apiv1.Succeeded)
		var res apiv1.LogsResult
		_ = json.Unmarshal(f.RawResult(), &res)
		if res.Ended != "unread" {
			t.Fatalf("abandoned follower %s ended %q (%s), want unread", id, res.Ended, f.Message)
		}
	}
	for _, m := range e.mq.Messages() {
		if r, err := apiv1.DecodeReply(m.Payload); err == nil && m.Topic == prefix+"/"+e.node+"/reply/"+kept && r.Final() {
			t.Fatalf("the read follower ended: %s", r.Message)
		}
	}
	cancel := e.command("cancel", apiv1.CancelRequest{RequestID: kept}, verbsTimeout)
	final(t, cancel, apiv1.Succeeded)
	e.waitFinal(kept, apiv1.Succeeded, 30*time.Second)
	f := final(t, e.replies(kept), apiv1.Succeeded)
	var res apiv1.LogsResult
	_ = json.Unmarshal(f.RawResult(), &res)
	if res.Ended != "cancelled" {
		t.Fatalf("the read follower ended %q, want cancelled", res.Ended)
	}
}
