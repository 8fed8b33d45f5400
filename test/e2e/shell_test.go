package e2e

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

const shellConfig = "exec:\n  enabled: true\nruntime:\n  podLogDir: %s\n"

// tmuxSession is a tmux server of its own (-L) running one command.
type tmuxSession struct {
	t      *testing.T
	socket string
}

func (s *tmuxSession) run(args ...string) string {
	s.t.Helper()
	out, err := exec.Command("tmux", append([]string{"-L", s.socket, "-f", "/dev/null"}, args...)...).CombinedOutput()
	if err != nil {
		s.t.Fatalf("tmux %v: %v: %s", args, err, out)
	}
	return string(out)
}

func (s *tmuxSession) screen() string {
	return s.run("capture-pane", "-p", "-J", "-t", "sh", "-S", "-200")
}

// waitScreen waits for re on the screen and returns the screen.
func (s *tmuxSession) waitScreen(what string, re *regexp.Regexp) string {
	s.t.Helper()
	var screen string
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		screen = s.screen()
		if re.MatchString(screen) {
			return screen
		}
		time.Sleep(50 * time.Millisecond) // polling a screen: nothing to wait on
	}
	s.t.Fatalf("no %s on the screen within 30s:\n%s", what, screen)
	return ""
}

// TestShellInteractiveThroughTmux drives `mqletctl exec -it` in a real
// terminal (tmux) into a pod on real containerd through real mosquitto:
// it types a command and reads its output, resizes the terminal and sees
// the pod's stty size follow, presses Ctrl-C to interrupt a sleep, and
// exits the shell with code 3, which becomes mqletctl's exit code.
func TestShellInteractiveThroughTmux(t *testing.T) {
	if _, err := exec.LookPath("tmux"); err != nil {
		t.Skip("tmux is not installed")
	}
	e := startPodEnv(t, func(logDir string) string { return fmt.Sprintf(shellConfig, logDir) })
	name := "shell"
	defer e.cleanupPods(name)
	e.apply(e.pod(name, "Always", "sleep 3600"), "succeeded", podReadyTimeout)

	dir := t.TempDir()
	exitFile := filepath.Join(dir, "exit")
	script := filepath.Join(dir, "run.sh")
	// The shell in the pod runs in mqletctl's terminal; mqletctl's exit code
	// is written where the test reads it, and the pane stays for capture.
	body := fmt.Sprintf("#!/bin/sh\nMQLETCTL_SIGN_KEY= %s --broker %s --node %s exec -it -n %s %s -- sh\necho $? > %s.tmp && mv %s.tmp %s\nexec sleep 600\n",
		mqletctlBin(t), e.broker.URL(), e.node, e.ns, name, exitFile, exitFile, exitFile)
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	s := &tmuxSession{t: t, socket: "mqlet-e2e-" + e.node}
	s.run("new-session", "-d", "-s", "sh", "-x", "100", "-y", "30", script)
	t.Cleanup(func() { _ = exec.Command("tmux", "-L", s.socket, "kill-server").Run() })
	s.run("set-option", "-g", "status", "off")
	s.waitScreen("the pod's shell prompt", regexp.MustCompile(`(?m)^/ # `))

	// Typed input reaches the shell and its output comes back.
	s.run("send-keys", "-t", "sh", "echo hel''lo-from-the-pod", "Enter")
	s.waitScreen("the command's output", regexp.MustCompile(`(?m)^hello-from-the-pod`))

	// The pod's terminal has the pane's size, and follows a resize.
	size := func() string {
		return strings.TrimSpace(s.run("display-message", "-p", "-t", "sh", "#{pane_height} #{pane_width}"))
	}
	s.run("send-keys", "-t", "sh", "stty size", "Enter")
	s.waitScreen("stty size "+size(), regexp.MustCompile(`(?m)^`+size()+`\s*$`))
	s.run("resize-window", "-t", "sh", "-x", "120", "-y", "40")
	if got := size(); got != "40 120" {
		t.Fatalf("the pane is %s after resize-window, want 40 120", got)
	}
	// The resize travels as a numbered input message: a stty size typed after
	// it sees it.
	time.Sleep(300 * time.Millisecond) // SIGWINCH reaches mqletctl asynchronously
	s.run("send-keys", "-t", "sh", "clear; stty size", "Enter")
	s.waitScreen("stty size 40 120", regexp.MustCompile(`(?m)^40 120\s*$`))

	// Ctrl-C goes to the pod (raw mode): it interrupts the sleep, not mqletctl.
	s.run("send-keys", "-t", "sh", "clear; sleep 100", "Enter")
	s.waitScreen("the sleep typed", regexp.MustCompile(`sleep 100`))
	time.Sleep(300 * time.Millisecond) // let the sleep start
	start := time.Now()
	s.run("send-keys", "-t", "sh", "C-c")
	s.run("send-keys", "-t", "sh", "echo after-interrupt-$?", "Enter")
	s.waitScreen("the shell back after Ctrl-C", regexp.MustCompile(`(?m)^after-interrupt-130`))
	if took := time.Since(start); took > 20*time.Second {
		t.Fatalf("Ctrl-C took %s to interrupt the sleep", took)
	}
	if _, err := os.Stat(exitFile); err == nil {
		t.Fatal("mqletctl exited at Ctrl-C")
	}

	// exit 3 ends the shell; mqletctl exits with 3.
	s.run("send-keys", "-t", "sh", "exit 3", "Enter")
	Eventually(t, 30*time.Second, "mqletctl to exit", func() bool { _, err := os.Stat(exitFile); return err == nil })
	got, _ := os.ReadFile(exitFile)
	if strings.TrimSpace(string(got)) != "3" {
		t.Fatalf("mqletctl exited with %q, want 3; screen:\n%s", got, s.screen())
	}
	// The node saw the session end: no exec stream left running.
	if strings.Contains(e.agent.Logs(), `"level":"error"`) && strings.Contains(e.agent.Logs(), "shell") {
		t.Errorf("the agent logged errors about the session:\n%s", tail(e.agent.Logs(), 20))
	}
}

// lockedBuffer collects a process's output for a reader polling it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
	n   int
	got chan struct{}
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	b.buf.Write(p)
	b.n += len(p)
	b.mu.Unlock()
	select {
	case b.got <- struct{}{}:
	default:
	}
	return len(p), nil
}

func (b *lockedBuffer) snapshot() (string, int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String(), b.n
}

// TestShellLatencyAndThroughput measures an interactive exec through
// mosquitto on loopback: keystroke → echo round trips (the pod's terminal
// echoes each byte) and the throughput of cat of a 10 MB file. It runs
// only with MQLET_SHELL_BENCH=1 and reports the figures with t.Log.
func TestShellLatencyAndThroughput(t *testing.T) {
	if os.Getenv("MQLET_SHELL_BENCH") != "1" {
		t.Skip("set MQLET_SHELL_BENCH=1 to measure")
	}
	e := startPodEnv(t, func(logDir string) string { return fmt.Sprintf(shellConfig, logDir) })
	name := "shellbench"
	defer e.cleanupPods(name)
	e.apply(e.pod(name, "Always", "head -c 7500000 /dev/urandom | base64 > /tmp/f; sleep 3600"), "succeeded", podReadyTimeout)

	cmd := exec.Command(mqletctlBin(t), "--broker", e.broker.URL(), "--node", e.node, "exec", "-it", "-n", e.ns, name, "--", "sh")
	cmd.Env = append(os.Environ(), "MQLETCTL_SIGN_KEY=")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out := &lockedBuffer{got: make(chan struct{}, 1)}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	waitOut := func(what string, from int, cond func(string) bool) {
		t.Helper()
		deadline := time.After(120 * time.Second)
		for {
			s, _ := out.snapshot()
			if cond(s[min(from, len(s)):]) {
				return
			}
			select {
			case <-out.got:
			case <-deadline:
				t.Fatalf("no %s; output tail %q", what, tail(s, 5))
			}
		}
	}
	waitOut("prompt", 0, func(s string) bool { return strings.Contains(s, "/ # ") })
	// The file is written before the pod counts as running? Not
	// necessarily: wait for it to be whole.
	_, _ = io.WriteString(stdin, "while [ $(wc -c < /tmp/f) -lt 10000000 ]; do sleep 0.2; done; echo fi''le-ready\n")
	waitOut("the file", 0, func(s string) bool { return strings.Contains(s, "file-ready") })

	// Keystrokes: each byte's echo awaited before the next is typed.
	var rtts []time.Duration
	for i := 0; i < 300; i++ {
		_, n := out.snapshot()
		c := string(rune('a' + i%26))
		start := time.Now()
		_, _ = io.WriteString(stdin, c)
		waitOut("echo of "+c, n, func(s string) bool { return strings.Contains(s, c) })
		rtts = append(rtts, time.Since(start))
	}
	_, _ = io.WriteString(stdin, "\x15") // Ctrl-U: drop the typed line
	sort.Slice(rtts, func(i, j int) bool { return rtts[i] < rtts[j] })
	p := func(q float64) time.Duration { return rtts[int(q*float64(len(rtts)-1))] }
	t.Logf("keystroke → echo round trip over %d keys: p50 %s, p99 %s, max %s", len(rtts), p(0.5), p(0.99), rtts[len(rtts)-1])

	// Throughput: cat of the 10 MB file, until a marker after it.
	_, n := out.snapshot()
	start := time.Now()
	_, _ = io.WriteString(stdin, "cat /tmp/f; echo ca''t-done\n")
	waitOut("the end of the cat", n, func(s string) bool { return strings.Contains(s, "cat-done") })
	took := time.Since(start)
	_, n2 := out.snapshot()
	t.Logf("cat of a 10 MB file: %d bytes through the terminal in %s: %.1f MB/s", n2-n, took, float64(n2-n)/1e6/took.Seconds())
	_, _ = io.WriteString(stdin, "exit 0\n")
	if err := cmd.Wait(); err != nil {
		t.Fatalf("mqletctl: %v", err)
	}
}

// TestShellSignedAndRequesterGone: on a node that takes only signed
// commands, an unsigned exec -it is refused and a signed one opens a
// terminal; a requester killed with SIGKILL (no cancel sent) is noticed by
// the node, which ends the session once it has heard nothing for
// logs.unreadTimeout.
func TestShellSignedAndRequesterGone(t *testing.T) {
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "ops.key")
	code, out, errOut := ctl(t, "keys", "generate", "--out", keyFile)
	m := regexp.MustCompile(`(?m)^keyId: (\S+) publicKey: (\S+)$`).FindStringSubmatch(out)
	if code != 0 || m == nil {
		t.Fatalf("keys generate: exit %d: %s%s", code, out, errOut)
	}
	e := startPodEnv(t, func(logDir string) string {
		return fmt.Sprintf("exec:\n  enabled: true\nlogs:\n  unreadTimeout: 15s\nsecurity:\n  commands: signed-only\n  trustedKeys:\n  - publicKey: %s\n    verbs: [\"*\"]\nruntime:\n  podLogDir: %s\n", m[2], logDir)
	})
	name := "signedshell"
	file := filepath.Join(dir, "pod.yaml")
	if err := os.WriteFile(file, e.pod(name, "Always", "sleep 3600"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{"--broker", e.broker.URL(), "--node", e.node}
	if code, out, errOut := ctl(t, append(base, "--sign-key", keyFile, "--timeout", "90s", "apply", "-f", file)...); code != 0 {
		t.Fatalf("signed apply: exit %d\n%s%s", code, out, errOut)
	}
	// Unsigned: refused, nothing opened.
	code, out, errOut = ctl(t, append(base, "exec", "-it", "-n", e.ns, name, "--", "sh")...)
	if code != 1 || !strings.Contains(errOut, "signature required") {
		t.Fatalf("unsigned exec -it: exit %d, want 1 with signature required\n%s%s", code, out, errOut)
	}
	// Signed: a terminal.
	cmd := exec.Command(mqletctlBin(t), append(base, "--sign-key", keyFile, "exec", "-it", "-n", e.ns, name, "--", "sh")...)
	cmd.Env = append(os.Environ(), "MQLETCTL_SIGN_KEY=")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	outBuf := &lockedBuffer{got: make(chan struct{}, 1)}
	cmd.Stdout, cmd.Stderr = outBuf, outBuf
	mark := e.mq.Mark()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	_, _ = io.WriteString(stdin, "echo sig''ned-shell\n")
	Eventually(t, 60*time.Second, "the signed shell's output", func() bool {
		s, _ := outBuf.snapshot()
		return strings.Contains(s, "signed-shell")
	})
	opened := e.mq.WaitFor(mark, 10*time.Second, "the terminal-open reply", func(msg Msg) bool {
		return strings.Contains(msg.Topic, "/reply/") && strings.Contains(string(msg.Payload), "terminal open")
	})
	id := opened.Topic[strings.LastIndex(opened.Topic, "/")+1:]
	// Gone without a word: no cancel, no more heartbeats.
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	gone := time.Now()
	r := e.mq.WaitReply(e.node, id, "failed", 60*time.Second)
	if !strings.Contains(r.Message, "sent nothing") {
		t.Fatalf("the abandoned session ended %q, want its requester named as gone", r.Message)
	}
	if took := time.Since(gone); took > 40*time.Second {
		t.Fatalf("the node noticed the requester gone after %s (logs.unreadTimeout 15s)", took)
	}

	// Another broker user who knows the request id types into a signed
	// session: its message lacks the session key's MAC, so the node ends
	// the session instead of running it.
	cmd = exec.Command(mqletctlBin(t), append(base, "--sign-key", keyFile, "exec", "-it", "-n", e.ns, name, "--", "sh")...)
	cmd.Env = append(os.Environ(), "MQLETCTL_SIGN_KEY=")
	if stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	outBuf = &lockedBuffer{got: make(chan struct{}, 1)}
	cmd.Stdout, cmd.Stderr = outBuf, outBuf
	mark = e.mq.Mark()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill() }()
	opened = e.mq.WaitFor(mark, 60*time.Second, "the second terminal-open reply", func(msg Msg) bool {
		return strings.Contains(msg.Topic, "/reply/") && strings.Contains(string(msg.Payload), "terminal open")
	})
	id = opened.Topic[strings.LastIndex(opened.Topic, "/")+1:]
	e.mq.Publish(prefix+"/"+e.node+"/in/"+id, []byte(`{"seq":1,"data":"ZXhpdCA1Cg=="}`), false) // "exit 5\n"
	r = e.mq.WaitReply(e.node, id, "failed", 30*time.Second)
	if !strings.Contains(r.Message, "MAC") {
		t.Fatalf("the forged input ended the session %q, want a MAC refusal", r.Message)
	}
	err = cmd.Wait()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		s, _ := outBuf.snapshot()
		t.Fatalf("mqletctl after a forged input: %v, want exit 1 (not the forged exit 5)\n%s", err, s)
	}
}
