package e2e

import (
	"bytes"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	apiv1 "github.com/mqlet/mqlet/api/v1"
)

// bannerListener is a host-local service: it counts connections and greets
// each with a banner that must never come back to the broker.
type bannerListener struct {
	ln    net.Listener
	conns atomic.Int64
}

const serviceBanner = "SSH-2.0-OpenSSH_9.2p1 host-local-banner-7f3a"

func startBannerListener(t *testing.T) *bannerListener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &bannerListener{ln: ln}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b.conns.Add(1)
			_, _ = c.Write([]byte(serviceBanner + "\r\n"))
			_ = c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return b
}

func (b *bannerListener) port() int { return b.ln.Addr().(*net.TCPAddr).Port }

// An image naming a host-local address is refused when the pod is applied,
// before anything connects (the listener sees no connection); by default
// loopback, localhost and numeric spellings of it are refused alike.
func TestAttackImageOnLoopbackRefusedBeforeAnyConnection(t *testing.T) {
	svc := startBannerListener(t)
	e := newPodEnv(t, "")
	for i, image := range []string{
		fmt.Sprintf("127.0.0.1:%d/probe/x:1", svc.port()),
		fmt.Sprintf("localhost:%d/probe/x:1", svc.port()),
		fmt.Sprintf("127.1:%d/probe/x:1", svc.port()),
	} {
		pod := fmt.Sprintf(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"ssrf-%d","namespace":%q},"spec":{"containers":[{"name":"main","image":%q}]}}`, i, e.ns, image)
		r := e.apply([]byte(pod), apiv1.Failed, 30*time.Second)
		text := r.Message + strings.Join(r.Errors, " ")
		if !strings.Contains(text, "images.allowedRegistries") || !strings.Contains(text, "spec.containers[0].image") {
			t.Errorf("%s: refused with %q, want spec.containers[0].image naming images.allowedRegistries", image, text)
		}
	}
	if n := svc.conns.Load(); n != 0 {
		t.Fatalf("the host-local service saw %d connections", n)
	}
}

// Allowed on purpose (an operator's explicit list), a host that is no
// registry is reached, but what it answered never comes back: the status,
// events and reply name the error's class and the registry's host only.
func TestAttackRegistryAnswerIsNeverPublished(t *testing.T) {
	svc := startBannerListener(t)
	e := newPodEnv(t, "images:\n"+allowLocalRegistries)
	image := fmt.Sprintf("127.0.0.1:%d/probe/x:1", svc.port())
	e.cleanupPods("probe")
	id := e.nextID("apply")
	e.mq.Command(e.node, "apply", id, []byte(fmt.Sprintf(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"probe","namespace":%q},"spec":{"terminationGracePeriodSeconds":1,"containers":[{"name":"main","image":%q}]}}`, e.ns, image)))
	e.waitStatus("probe", 60*time.Second, "the pull failed, naming the registry", func(p *v1.Pod) bool {
		_, msg := waitingOf(p)
		return strings.Contains(msg, "registry 127.0.0.1:"+fmt.Sprint(svc.port()))
	})
	if svc.conns.Load() == 0 {
		t.Fatal("the allowed host was never reached; the test shows nothing")
	}
	for _, m := range e.mq.Messages() {
		if bytes.Contains(m.Payload, []byte("host-local-banner")) {
			t.Fatalf("the service's answer was published on %s: %s", m.Topic, m.Payload)
		}
	}
}
