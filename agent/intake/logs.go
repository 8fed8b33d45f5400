package intake

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"golang.org/x/time/rate"
	v1 "k8s.io/api/core/v1"

	"github.com/mqlet/mqlet/agent/manifest"
	"github.com/mqlet/mqlet/agent/streams"
	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/cri"
	"github.com/mqlet/mqlet/internal/redact"
)

// Bounds of the numbers of a logs request.
const (
	maxTailLines    = 1 << 20
	maxSinceSeconds = 10 * 365 * 24 * 3600
	// followFlush is how long a followed line may wait to be sent with others.
	followFlush = 200 * time.Millisecond
	// backlogPoll is how often a held-back chunk looks at the outbox again.
	backlogPoll = 20 * time.Millisecond
)

func (in *Intake) handleLogs(r request) {
	id, payload := r.id, r.payload
	const verb = "logs"
	v := in.opts.Verbs
	if v.Runtime == nil || v.Streams == nil {
		in.fail(id, verb, errors.New("verb \"logs\" is not supported by this mqlet"))
		return
	}
	var args apiv1.LogsRequest
	if err := manifest.DecodeArgs(payload, &args); err != nil {
		in.fail(id, verb, fmt.Errorf("decoding logs request: %w", err))
		return
	}
	pod, req, follow, err := in.logRequest(args)
	if err != nil {
		in.fail(id, verb, err)
		return
	}
	in.startStream(id, verb, follow > 0, &pod.ObjectMeta, func(in *Intake, ctx context.Context) { in.runLogs(ctx, id, req, follow) })
}

// logRequest checks args against the limits and turns them into the
// runtime's request; follow is how long to follow (0: not).
func (in *Intake) logRequest(args apiv1.LogsRequest) (*v1.Pod, cri.LogRequest, time.Duration, error) {
	lim := in.opts.Verbs.Logs
	var req cri.LogRequest
	pod, err := in.findPod(args.Namespace, args.Name)
	if err != nil {
		return pod, req, 0, err
	}
	container, err := pickContainer(pod, args.Container, true)
	if err != nil {
		return pod, req, 0, err
	}
	req = cri.LogRequest{Pod: podKey(pod), Container: container, Previous: args.Previous, Timestamps: args.Timestamps}
	if t := args.TailLines; t != nil {
		if *t < 0 || *t > maxTailLines {
			return pod, req, 0, fmt.Errorf("tailLines %d: must be 0 to %d", *t, maxTailLines)
		}
		req.TailLines = t
	}
	switch {
	case args.SinceSeconds != nil && args.SinceTime != "":
		return pod, req, 0, errors.New("sinceSeconds and sinceTime: give at most one")
	case args.SinceSeconds != nil:
		if s := *args.SinceSeconds; s < 1 || s > maxSinceSeconds {
			return pod, req, 0, fmt.Errorf("sinceSeconds %d: must be 1 to %d", s, maxSinceSeconds)
		}
		req.Since = in.now().Add(-time.Duration(*args.SinceSeconds) * time.Second)
	case args.SinceTime != "":
		t, err := time.Parse(time.RFC3339, args.SinceTime)
		if err != nil {
			return pod, req, 0, fmt.Errorf("sinceTime %q: not an RFC 3339 time", args.SinceTime)
		}
		req.Since = t
	}
	limit := lim.MaxBytes
	if b := args.LimitBytes; b != nil {
		if *b < 1 || *b > lim.MaxBytes {
			return pod, req, 0, fmt.Errorf("limitBytes %d: must be 1 to %d (logs.maxBytes)", *b, lim.MaxBytes)
		}
		limit = *b
	}
	if !args.Follow {
		req.LimitBytes = &limit
		if args.FollowSeconds != 0 {
			return pod, req, 0, errors.New("followSeconds: only with follow")
		}
		return pod, req, 0, nil
	}
	if args.Previous {
		return pod, req, 0, errors.New("follow and previous: a terminated container's log does not grow")
	}
	if args.LimitBytes != nil {
		req.LimitBytes = &limit
	}
	req.Follow = true
	follow := lim.MaxFollow
	if s := args.FollowSeconds; s != 0 {
		if s < 1 || s > int64(lim.MaxFollow/time.Second) {
			return pod, req, 0, fmt.Errorf("followSeconds %d: must be 1 to %d (logs.maxFollow)", s, int64(lim.MaxFollow/time.Second))
		}
		follow = time.Duration(s) * time.Second
	}
	return pod, req, follow, nil
}

func (in *Intake) runLogs(ctx context.Context, id string, req cri.LogRequest, follow time.Duration) {
	const verb = "logs"
	lim := in.opts.Verbs.Logs
	budget := chunkBudget(lim.MaxChunkBytes)
	burst := max(budget, int(min(lim.BytesPerSecond, 1<<30)))
	ch := &chunker{budget: budget, stream: redact.NewStream(in.scrubberOf(req.Pod.Namespace, req.Pod.Name)), limiter: rate.NewLimiter(rate.Limit(lim.BytesPerSecond), burst), backlog: lim.Backlog, maxBacklog: lim.MaxBacklog,
		send: func(seq int, text string) error {
			return in.sendChunk(apiv1.Reply{RequestID: id, Verb: verb, Phase: apiv1.InProgress, Seq: seq,
				Message: fmt.Sprintf("log chunk %d", seq), Result: apiv1.LogsChunk{Lines: splitLines(text)}})
		}}
	readCtx := ctx
	var flushDone sync.WaitGroup
	if follow > 0 {
		var cancel context.CancelFunc
		readCtx, cancel = context.WithTimeout(ctx, follow)
		defer cancel()
		// Lines of a followed log go out within followFlush.
		stopFlush := make(chan struct{})
		flushDone.Add(1)
		go func() {
			defer flushDone.Done()
			t := time.NewTicker(followFlush)
			defer t.Stop()
			for {
				select {
				case <-stopFlush:
					return
				case <-t.C:
					_ = ch.flush(ctx)
				}
			}
		}()
		defer func() { close(stopFlush); flushDone.Wait() }()
	}
	// Sending is paced on ctx, not readCtx: the lines read before
	// followSeconds ended are still sent.
	ch.ctx = ctx
	err := in.opts.Verbs.Runtime.ContainerLogs(readCtx, req, ch)
	res := apiv1.LogsResult{}
	unread := errors.Is(context.Cause(ctx), streams.ErrUnread)
	switch {
	case follow > 0 && unread:
		res.Ended = "unread"
	case follow > 0 && ctx.Err() != nil:
		res.Ended = "cancelled"
	case follow > 0 && readCtx.Err() != nil:
		res.Ended = "followSeconds"
	case follow > 0 && err == nil:
		res.Ended = "containerExited"
	}
	if err != nil && readCtx.Err() == nil {
		in.fail(id, verb, in.scrubberOf(req.Pod.Namespace, req.Pod.Name).Error(err))
		return
	}
	if ch.err != nil && !errors.Is(ch.err, context.Canceled) && !errors.Is(ch.err, context.DeadlineExceeded) {
		in.fail(id, verb, fmt.Errorf("sending log chunks: %w", ch.err))
		return
	}
	// The rest goes in the final reply when nothing was sent before it;
	// else as the last chunk (the flush is not bound to readCtx, which may
	// have ended).
	rest, seq := ch.finish()
	res.Bytes = ch.total
	if seq == 0 && follow == 0 {
		res.Lines = splitLines(rest)
	} else if rest != "" && !unread {
		if err := ch.emit(context.WithoutCancel(ctx), rest); err != nil {
			in.fail(id, verb, fmt.Errorf("sending log chunks: %w", err))
			return
		}
	}
	res.Chunks, res.LineCount = ch.seq, ch.lines+len(res.Lines)
	res.Truncated = follow == 0 && req.LimitBytes != nil && *req.LimitBytes == lim.MaxBytes && ch.total >= lim.MaxBytes
	msg := fmt.Sprintf("%d bytes of container %s", res.Bytes, req.Container)
	if res.Chunks > 0 {
		msg += fmt.Sprintf(" in %d chunks", res.Chunks)
	}
	if res.Ended != "" {
		msg += "; follow ended: " + res.Ended
	}
	if unread {
		msg += fmt.Sprintf(" (its requester sent nothing on %s for logs.unreadTimeout)", in.opts.Topics.Input(id))
	}
	if res.Truncated {
		msg += fmt.Sprintf("; cut at logs.maxBytes (%d): ask with limitBytes, tailLines or sinceSeconds", lim.MaxBytes)
	}
	_ = in.replies.Send(apiv1.Reply{RequestID: id, Verb: verb, Phase: apiv1.Succeeded, Message: msg, Result: res})
}

// chunkBudget is how many JSON-escaped log bytes one chunk may carry: the
// message bound less its envelope, and room for the scrubber's marks.
func chunkBudget(maxChunk int) int {
	return max(maxChunk*7/8-1024, 1024)
}

// chunker gathers log text and sends it in chunks whose JSON-escaped size
// stays within budget, cut at a line end where one is near, paced by the
// limiter; flush sends what there is (a followed log's latest lines).
type chunker struct {
	budget int
	// stream scrubs the container's text as it goes out, a value split
	// across two chunks included.
	stream  *redact.Stream
	limiter *rate.Limiter
	// backlog, when set, holds a chunk back while more than maxBacklog
	// bytes wait to be published.
	backlog    func() int64
	maxBacklog int64
	send       func(seq int, text string) error
	ctx        context.Context

	mu     sync.Mutex
	buf    []byte
	cost   int // JSON-escaped size of buf
	lastNL int // length of buf up to and with its last newline
	seq    int
	lines  int // lines sent in chunks
	total  int64
	err    error // the first failure to send; writes fail after it
}

func (c *chunker) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return 0, c.err
	}
	n := len(p)
	c.total += int64(n)
	for len(p) > 0 {
		r, size := utf8.DecodeRune(p)
		cost := escapedCost(r, size)
		if r == '\n' {
			cost = 3 // a line ends as `","` between JSON strings
		}
		if c.cost+cost > c.budget {
			if err := c.cutLocked(c.ctx); err != nil {
				return n - len(p), err
			}
		}
		c.buf = append(c.buf, p[:size]...)
		c.cost += cost
		if r == '\n' {
			c.lastNL = len(c.buf)
		}
		p = p[size:]
	}
	return n, nil
}

// cutLocked sends buf up to its last newline (all of it when there is
// none) and keeps the rest.
func (c *chunker) cutLocked(ctx context.Context) error {
	cut := c.lastNL
	if cut == 0 {
		cut = len(c.buf)
	}
	text := string(c.buf[:cut])
	rest := append([]byte(nil), c.buf[cut:]...)
	c.buf, c.lastNL, c.cost = rest, 0, lineCost(rest)
	if err := c.emitLocked(ctx, text); err != nil {
		c.err = err
		return err
	}
	return nil
}

// flush sends everything gathered (a followed log's latest lines).
func (c *chunker) flush(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil || len(c.buf) == 0 {
		return c.err
	}
	text := string(c.buf)
	c.buf, c.lastNL, c.cost = c.buf[:0], 0, 0
	if err := c.emitLocked(ctx, text); err != nil {
		c.err = err
	}
	return c.err
}

// finish returns what is left unsent, scrubbed (with what the stream held
// back), and how many chunks went before.
func (c *chunker) finish() (string, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	rest := c.scrub(string(c.buf)) + c.flushStream()
	c.buf, c.lastNL, c.cost = nil, 0, 0
	return rest, c.seq
}

func (c *chunker) scrub(text string) string {
	if c.stream == nil {
		return text
	}
	return c.stream.Next(text)
}

func (c *chunker) flushStream() string {
	if c.stream == nil {
		return ""
	}
	return c.stream.Flush()
}

// emit sends text already scrubbed (finish's).
func (c *chunker) emit(ctx context.Context, text string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sendLocked(ctx, text)
}

// emitLocked scrubs and sends the container's text; an end that may begin
// a secret value waits for the next chunk.
func (c *chunker) emitLocked(ctx context.Context, text string) error {
	text = c.scrub(text)
	if text == "" {
		return nil
	}
	return c.sendLocked(ctx, text)
}

func (c *chunker) sendLocked(ctx context.Context, text string) error {
	if err := c.limiter.WaitN(ctx, min(len(text), c.limiter.Burst())); err != nil {
		return err
	}
	for c.backlog != nil && c.backlog() > c.maxBacklog {
		t := time.NewTimer(backlogPoll)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
	c.seq++
	c.lines += len(splitLines(text))
	return c.send(c.seq, text)
}

// escapedCost is how many bytes r (size bytes of the input) takes in a
// JSON string as encoding/json writes it.
func escapedCost(r rune, size int) int {
	switch {
	case r == utf8.RuneError && size == 1:
		return 6 // \ufffd
	case r == '"' || r == '\\' || r == '\n' || r == '\r' || r == '\t':
		return 2
	case r < 0x20 || r == '<' || r == '>' || r == '&' || r == '\u2028' || r == '\u2029':
		return 6
	default:
		return size
	}
}

// lineCost is the JSON size of p as a list of lines.
func lineCost(p []byte) int {
	n := 0
	for len(p) > 0 {
		r, size := utf8.DecodeRune(p)
		if r == '\n' {
			n += 3
		} else {
			n += escapedCost(r, size)
		}
		p = p[size:]
	}
	return n
}

// splitLines is text as lines without their line ends; a last line cut
// short (by a chunk bound) is a line too.
func splitLines(text string) []string {
	if text == "" {
		return nil
	}
	return strings.Split(strings.TrimSuffix(text, "\n"), "\n")
}
