package restart

import (
	"sync"
	"testing"
	"time"
)

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

func TestCrashLoopDelaysDoubleToTheCap(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	tr := New(DefaultPolicy, c.now)
	const key = "uid/web"
	// Each step: the container exits right after its restart; how long must it wait?
	want := []time.Duration{0, 10, 20, 40, 80, 160, 300, 300, 300}
	for i, w := range want {
		c.add(time.Second) // it ran one second
		finished := c.now()
		in, wait := tr.InBackoff(key, finished)
		if w == 0 {
			if in {
				t.Fatalf("step %d: first exit must restart at once, got wait %v", i, wait)
			}
		} else if !in || wait != w*time.Second {
			t.Fatalf("step %d: want wait %vs, got in=%v wait=%v", i, int(w), in, wait)
		}
		c.add(wait)
		if in, _ := tr.InBackoff(key, finished); in {
			t.Fatalf("step %d: still in backoff after waiting", i)
		}
		tr.Next(key, finished)
	}
}

func TestHealthyRunResetsBackoff(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	tr := New(Policy{Base: time.Second, Max: time.Minute, ResetAfter: 10 * time.Minute}, c.now)
	for range 5 {
		tr.Next("k", c.now())
	}
	if d := tr.Delay("k"); d != 16*time.Second {
		t.Fatalf("delay after 5 restarts = %v, want 16s", d)
	}
	c.add(10 * time.Minute) // ran healthy
	if in, _ := tr.InBackoff("k", c.now()); in {
		t.Fatal("a container that ran 10 min healthy must restart at once")
	}
	tr.Next("k", c.now())
	if d := tr.Delay("k"); d != time.Second {
		t.Fatalf("delay after reset = %v, want base 1s", d)
	}
}

func TestForget(t *testing.T) {
	tr := New(DefaultPolicy, nil)
	tr.Next("a/x", time.Now())
	tr.Next("b/x", time.Now())
	tr.Forget(func(k string) bool { return k[0] == 'a' })
	if tr.Delay("a/x") != 0 || tr.Delay("b/x") == 0 {
		t.Fatal("Forget dropped the wrong keys")
	}
}

func TestConcurrentUse(t *testing.T) {
	tr := New(DefaultPolicy, nil)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				tr.Next(string(rune('a'+i)), time.Now())
				tr.InBackoff(string(rune('a'+i)), time.Now())
			}
		}()
	}
	wg.Wait()
	if tr.Delay("a") != DefaultPolicy.Max {
		t.Fatalf("after 100 restarts delay = %v, want cap", tr.Delay("a"))
	}
}
