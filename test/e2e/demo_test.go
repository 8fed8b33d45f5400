package e2e

import (
	"bufio"
	"context"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// `make demo`, then Ctrl-C as a terminal sends it (SIGINT to the whole
// foreground process group): nothing of the demo is left — no network
// namespace or veth of its pods, no mount under its dirs, no pod log
// directory, no process (issue 22: containerd died with the group before
// the cleanup could list the sandboxes, so every pod's netns and veth, and
// its log directory, stayed behind).
//
// It runs the real demo (containerd, mqlet, the sample pod) on the demo's
// own dir, bridge and subnet: MQLET_TEST_DEMO_DIR, _BRIDGE and _SUBNET
// (default the demo's own defaults), which no other containerd may use.
func TestDemoCtrlCLeavesNothing(t *testing.T) {
	dir := envOr("MQLET_TEST_DEMO_DIR", "/run/mqlet-demo")
	bridge := envOr("MQLET_TEST_DEMO_BRIDGE", "mqletdemo0")
	subnet := envOr("MQLET_TEST_DEMO_SUBNET", "10.88.78.0/24")
	_, cidr, err := net.ParseCIDR(subnet)
	if err != nil {
		t.Fatalf("MQLET_TEST_DEMO_SUBNET %q: %v", subnet, err)
	}
	port := strconv.Itoa(freeTCPPort(t))
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	logsBefore := podLogDirs(t)

	// A test binary that a non-interactive shell started in the background
	// (the suite's e2e shards) has SIGINT ignored, and an ignored signal
	// stays ignored across exec: the demo would never see the Ctrl-C, nor
	// could its trap catch it. With a handler here, exec gives the demo
	// SIGINT's default disposition, as a terminal's foreground job has.
	sigint := make(chan os.Signal, 1)
	signal.Notify(sigint, os.Interrupt)
	defer signal.Stop(sigint)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "make", "-s", "demo")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "DEMO_DIR="+dir, "DEMO_BRIDGE="+bridge, "DEMO_SUBNET="+subnet, "PORT="+port, "NODE=demo")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // a foreground job of its own
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("make demo: %v", err)
	}
	pgid := cmd.Process.Pid
	ended := make(chan error, 1)
	running := make(chan struct{})
	var out syncBuffer
	go func() {
		sc := bufio.NewScanner(stdout)
		signalled := false
		for sc.Scan() {
			out.Write([]byte(sc.Text() + "\n"))
			if !signalled && strings.HasPrefix(sc.Text(), "demo: running.") {
				signalled = true
				close(running)
			}
		}
		ended <- cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		// The demo's mqlet runs in a session of its own: a demo that never
		// ran its cleanup leaves it holding the demo's state store.
		state := dir + "-state"
		_ = exec.Command("pkill", "-KILL", "-f", "--", "--state-dir "+state+" ").Run()
		// The demo's own containerd only: the environment names the
		// suite's shared one (MQLET_TEST_DIR), which must keep running.
		down := exec.Command(filepath.Join(root, "test/env/containerd-down.sh"))
		down.Env = append(os.Environ(), "MQLET_TEST_DIR="+dir, "MQLET_TEST_BRIDGE="+bridge, "MQLET_TEST_SUBNET="+subnet)
		_ = down.Run()
		if mounts, err := os.ReadFile("/proc/mounts"); err == nil {
			for _, l := range strings.Split(string(mounts), "\n") {
				if f := strings.Fields(l); len(f) > 1 && strings.HasPrefix(f[1], state+"/") {
					_ = syscall.Unmount(f[1], syscall.MNT_DETACH)
				}
			}
		}
		_ = os.RemoveAll(state)
	})
	select {
	case <-running:
	case err := <-ended:
		t.Fatalf("the demo ended before it ran (%v):\n%s\n%s", err, out.String(), stderr.String())
	case <-time.After(8 * time.Minute):
		t.Fatalf("the demo did not say it runs:\n%s\n%s", out.String(), stderr.String())
	}

	// What the demo's pod made: its netns (holding an address of the demo
	// subnet), its veth on the demo bridge, its log directory.
	var netns []string
	for _, ns := range lines(t, "ip", "netns", "list") {
		name := strings.Fields(ns)[0]
		addrs, _ := exec.Command("ip", "-n", name, "-o", "-4", "addr").Output() // another test's netns may go meanwhile
		for _, a := range strings.Split(string(addrs), "\n") {
			if f := strings.Fields(a); len(f) > 3 {
				if ip, _, err := net.ParseCIDR(f[3]); err == nil && cidr.Contains(ip) {
					netns = append(netns, name)
				}
			}
		}
	}
	var veths []string
	for _, l := range lines(t, "ip", "-o", "link", "show", "master", bridge) {
		if f := strings.Fields(l); len(f) > 1 {
			veths = append(veths, strings.SplitN(strings.TrimSuffix(f[1], ":"), "@", 2)[0])
		}
	}
	var logs []string
	for d := range podLogDirs(t) {
		if !logsBefore[d] && strings.HasPrefix(filepath.Base(d), "default_hello_") {
			logs = append(logs, d)
		}
	}
	if len(netns) == 0 || len(veths) == 0 || len(logs) == 0 {
		t.Fatalf("the demo's pod is not there to clean up: netns %v, veths %v, log dirs %v", netns, veths, logs)
	}

	// Ctrl-C, as the terminal sends it.
	if err := syscall.Kill(-pgid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ended:
	case <-time.After(3 * time.Minute):
		// What each process of the demo's group is doing (a script that never
		// ran its trap shows where it waits).
		all, _ := exec.Command("ps", "-eo", "pgid,pid,ppid,stat,wchan:24,args").CombinedOutput()
		var ps strings.Builder
		for _, l := range strings.Split(string(all), "\n") {
			if f := strings.Fields(l); len(f) > 0 && f[0] == strconv.Itoa(pgid) {
				ps.WriteString(l + "\n")
			}
		}
		t.Fatalf("the demo did not end after SIGINT:\n--- stderr:\n%s--- stdout:\n%s--- its process group:\n%s", stderr.String(), out.String(), ps.String())
	}
	if !strings.Contains(stderr.String(), "demo: cleaned up") {
		t.Errorf("the cleanup did not finish:\n%s", stderr.String())
	}
	for _, name := range netns {
		if _, err := os.Stat("/run/netns/" + name); err == nil {
			t.Errorf("network namespace %s of the demo's pod left", name)
		}
	}
	for _, v := range veths {
		if exec.Command("ip", "link", "show", v).Run() == nil {
			t.Errorf("veth %s of the demo's pod left", v)
		}
	}
	if exec.Command("ip", "link", "show", bridge).Run() == nil {
		t.Errorf("bridge %s left", bridge)
	}
	for _, d := range logs {
		if _, err := os.Stat(d); err == nil {
			t.Errorf("pod log directory %s left", d)
		}
	}
	mounts, err := os.ReadFile("/proc/mounts")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(mounts), "\n") {
		if f := strings.Fields(l); len(f) > 1 && strings.HasPrefix(f[1], dir) {
			t.Errorf("mount left: %s", l)
		}
	}
	for _, pattern := range []string{dir, "--state-dir " + dir + "-state"} {
		if pids, _ := exec.Command("pgrep", "-f", pattern).Output(); len(strings.TrimSpace(string(pids))) > 0 {
			t.Errorf("processes of the demo left (%s): %s", pattern, pids)
		}
	}
	for _, d := range []string{dir, dir + "-state"} {
		if _, err := os.Stat(d); err == nil {
			t.Errorf("directory %s left", d)
		}
	}
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func freeTCPPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// lines runs a command and returns its non-empty output lines.
func lines(t *testing.T, name string, args ...string) []string {
	t.Helper()
	out, err := exec.Command(name, args...).Output()
	if err != nil {
		t.Fatalf("%s %v: %v", name, args, err)
	}
	var ls []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.TrimSpace(l) != "" {
			ls = append(ls, l)
		}
	}
	return ls
}

// podLogDirs are the directories under the host's pod log dir.
func podLogDirs(t *testing.T) map[string]bool {
	t.Helper()
	entries, err := os.ReadDir("/var/log/pods")
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, e := range entries {
		out[filepath.Join("/var/log/pods", e.Name())] = true
	}
	return out
}
