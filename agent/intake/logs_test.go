package intake

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"golang.org/x/time/rate"
)

// Every chunk fits the budget once JSON-escaped, the chunks join to the
// input, and short lines are never cut in the middle.
func TestChunkerFitsBudgetKeepsOrderAndLines(t *testing.T) {
	const budget = 4096
	var chunks []string
	c := &chunker{budget: budget, limiter: rate.NewLimiter(rate.Inf, budget), ctx: context.Background(),
		send: func(seq int, text string) error {
			if seq != len(chunks)+1 {
				t.Fatalf("chunk %d sent after %d", seq, len(chunks))
			}
			chunks = append(chunks, text)
			return nil
		}}
	var in strings.Builder
	for i := range 2000 {
		// Quotes, tabs, HTML characters and a control byte all grow in JSON.
		line := fmt.Sprintf("line %d \"<&>\"\t\x01 é\n", i)
		in.WriteString(line)
		if _, err := c.Write([]byte(line)); err != nil {
			t.Fatal(err)
		}
	}
	rest, _ := c.finish()
	joined := strings.Join(chunks, "") + rest
	if joined != in.String() {
		t.Fatalf("chunks do not join to the input: %d bytes, want %d", len(joined), in.Len())
	}
	if len(chunks) < 10 {
		t.Fatalf("%d chunks for %d bytes with a budget of %d", len(chunks), in.Len(), budget)
	}
	for i, ch := range chunks {
		b, _ := json.Marshal(ch)
		if len(b)-2 > budget {
			t.Errorf("chunk %d: %d escaped bytes, budget %d", i+1, len(b)-2, budget)
		}
		if !strings.HasSuffix(ch, "\n") {
			t.Errorf("chunk %d cut inside a line: ends %q", i+1, ch[max(0, len(ch)-10):])
		}
	}
}

// A line longer than a chunk is cut at rune boundaries.
func TestChunkerCutsALongLine(t *testing.T) {
	const budget = 1024
	var chunks []string
	c := &chunker{budget: budget, limiter: rate.NewLimiter(rate.Inf, budget), ctx: context.Background(),
		send: func(_ int, text string) error { chunks = append(chunks, text); return nil }}
	line := strings.Repeat("ü", 3000) + "\n"
	if _, err := c.Write([]byte(line)); err != nil {
		t.Fatal(err)
	}
	rest, _ := c.finish()
	if got := strings.Join(chunks, "") + rest; got != line {
		t.Fatalf("joined %d bytes, want %d", len(got), len(line))
	}
	for i, ch := range chunks {
		if !utf8.ValidString(ch) || len(ch) > budget {
			t.Errorf("chunk %d: %d bytes, valid UTF-8 %v", i+1, len(ch), utf8.ValidString(ch))
		}
	}
}

func TestCapOutputCountsEscapes(t *testing.T) {
	s, cut := capOutput([]byte("hi\n"), 100)
	if s != "hi\n" || cut {
		t.Fatalf("short output: %q cut=%v", s, cut)
	}
	s, cut = capOutput([]byte(strings.Repeat("\x01", 100)), 60)
	if !cut || len(s) != 10 {
		t.Fatalf("control bytes: kept %d (cut=%v), want 10 (6 escaped bytes each)", len(s), cut)
	}
}

// A chunk waits while the outbox holds more than the bound, and goes once
// it drained.
func TestChunkerWaitsForTheOutbox(t *testing.T) {
	var backlog atomic.Int64
	backlog.Store(1 << 30)
	sent := make(chan string, 4)
	c := &chunker{budget: 1024, limiter: rate.NewLimiter(rate.Inf, 1024), ctx: context.Background(),
		backlog: backlog.Load, maxBacklog: 1 << 20,
		send: func(_ int, text string) error { sent <- text; return nil }}
	done := make(chan error, 1)
	go func() { done <- c.flushText("held back\n") }()
	select {
	case <-sent:
		t.Fatal("a chunk was sent while the outbox was over its bound")
	case <-time.After(200 * time.Millisecond):
	}
	backlog.Store(0)
	select {
	case got := <-sent:
		if got != "held back\n" {
			t.Fatalf("sent %q", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the chunk was not sent after the outbox drained")
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// flushText gathers text and flushes it, as a followed log does.
func (c *chunker) flushText(text string) error {
	if _, err := c.Write([]byte(text)); err != nil {
		return err
	}
	return c.flush(c.ctx)
}
