package cri

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func TestCheckTerminationMessagePath(t *testing.T) {
	for _, ok := range []string{"/dev/termination-log", "/tmp/msg", "/a/b/c", "/" + strings.Repeat("x", MaxTerminationMessagePathBytes-1), "/procfs/x", "/system"} {
		if err := CheckTerminationMessagePath(ok); err != nil {
			t.Errorf("%q refused: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "dev/termination-log", "/", "/a/../b", "/a/./b", "/a//b", "/a/", "/proc", "/proc/self/attr/current",
		"/sys/kernel/x", "/a\x00b", "/" + strings.Repeat("x", MaxTerminationMessagePathBytes)} {
		if err := CheckTerminationMessagePath(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func messagePod(t *testing.T, m *Manager) *v1.Pod {
	pod := volumePod()
	pod.Spec.Containers[0].TerminationMessagePath = v1.TerminationMessagePathDefault
	if err := m.createPodDirs(pod); err != nil {
		t.Fatal(err)
	}
	return pod
}

// Each attempt gets a fresh, empty, world-writable file beneath the pod
// directory, mounted at the path; what it holds (its last 4096 bytes)
// is read back through the recorded name only.
func TestTerminationMessageFile(t *testing.T) {
	m := testManager(t)
	pod := messagePod(t, m)
	c := &pod.Spec.Containers[0]
	mount, name, err := m.terminationMessageMount(pod, c)
	if err != nil {
		t.Fatal(err)
	}
	dir, _ := m.podDir(testUID)
	if want := filepath.Join(dir, "containers", "main", name); mount.HostPath != want || mount.ContainerPath != "/dev/termination-log" {
		t.Fatalf("mount %+v, want %s at /dev/termination-log", mount, want)
	}
	st, err := os.Lstat(mount.HostPath)
	if err != nil || !st.Mode().IsRegular() || st.Mode().Perm() != 0o666 || st.Size() != 0 {
		t.Fatalf("message file: %v %v", st, err)
	}
	_, second, err := m.terminationMessageMount(pod, c)
	if err != nil || second == name {
		t.Fatalf("a second attempt got file %q (%v), the first %q", second, err, name)
	}

	if err := os.WriteFile(mount.HostPath, []byte("bye\n"), 0o666); err != nil {
		t.Fatal(err)
	}
	got, err := m.readTerminationFile(testUID, "main", name)
	if err != nil || string(got) != "bye\n" {
		t.Fatalf("read %q, %v", got, err)
	}
	// Longer than the cap: the last 4096 bytes, as the kubelet's tail.
	long := strings.Repeat("a", 1000) + strings.Repeat("b", MaxTerminationMessageBytes)
	if err := os.WriteFile(mount.HostPath, []byte(long), 0o666); err != nil {
		t.Fatal(err)
	}
	if got, err := m.readTerminationFile(testUID, "main", name); err != nil || string(got) != strings.Repeat("b", MaxTerminationMessageBytes) {
		t.Fatalf("read %d bytes (%v), want the last %d", len(got), err, MaxTerminationMessageBytes)
	}
	// Names not of mqlet's form are never opened.
	for _, bad := range []string{"../../etc/passwd", "x", strings.Repeat("g", 32), strings.ToUpper(name)} {
		if _, err := m.readTerminationFile(testUID, "main", bad); err == nil {
			t.Errorf("name %q read", bad)
		}
	}
	if _, err := m.readTerminationFile(testUID, "../x", name); err == nil {
		t.Error("container name ../x read")
	}
}

// A symlink or a FIFO planted where the message file is (or where its
// directory is) is not followed, nor read.
func TestTerminationMessageFileIsNotFollowed(t *testing.T) {
	m := testManager(t)
	pod := messagePod(t, m)
	_, name, err := m.terminationMessageMount(pod, &pod.Spec.Containers[0])
	if err != nil {
		t.Fatal(err)
	}
	dir, _ := m.podDir(testUID)
	file := filepath.Join(dir, "containers", "main", name)
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("host secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, file); err != nil {
		t.Fatal(err)
	}
	if got, err := m.readTerminationFile(testUID, "main", name); err == nil {
		t.Fatalf("read through a symlink: %q", got)
	}
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	if err := mkfifo(file); err != nil {
		t.Fatal(err)
	}
	if _, err := m.readTerminationFile(testUID, "main", name); err == nil {
		t.Fatal("a FIFO was read")
	}
	// The container directory swapped for a symlink: creating the next
	// attempt's file refuses to go through it.
	cdir := filepath.Join(dir, "containers", "main")
	if err := os.RemoveAll(cdir); err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	if err := os.Symlink(out, cdir); err != nil {
		t.Fatal(err)
	}
	if _, _, err := m.terminationMessageMount(pod, &pod.Spec.Containers[0]); err == nil {
		t.Fatal("the message file was made through a symlinked directory")
	}
	if entries, _ := os.ReadDir(out); len(entries) != 0 {
		t.Fatalf("files made outside the pod directory: %v", entries)
	}
}

// The message of an exited attempt: the file, else with
// FallbackToLogsOnError and a failed exit the log's last 80 lines and
// 2048 bytes, else nothing.
func TestTerminationMessageFallsBackToTheLog(t *testing.T) {
	m := testManager(t)
	pod := messagePod(t, m)
	_, name, err := m.terminationMessageMount(pod, &pod.Spec.Containers[0])
	if err != nil {
		t.Fatal(err)
	}
	logDir, _ := m.podLogDir(pod.Namespace, pod.Name, testUID)
	if err := os.MkdirAll(filepath.Join(logDir, "main"), 0o755); err != nil {
		t.Fatal(err)
	}
	var log strings.Builder
	for i := range 100 {
		fmt.Fprintf(&log, "2026-01-01T00:00:00.000000000Z stdout F line %d\n", i)
	}
	if err := os.WriteFile(filepath.Join(logDir, "main", "0.log"), []byte(log.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	container := func(policy v1.TerminationMessagePolicy) *runtimeapi.Container {
		return &runtimeapi.Container{Annotations: map[string]string{AnnotationTerminationFile: name, AnnotationTerminationPolicy: string(policy)}}
	}
	exited := func(code int32) *ContainerStatus {
		return &ContainerStatus{ID: "c1", Name: "main", State: ContainerExited, ExitCode: code}
	}
	ctx := context.Background()
	msg := func(policy v1.TerminationMessagePolicy, code int32) string {
		return m.terminationMessage(ctx, nil, testUID, pod.Namespace, pod.Name, container(policy), exited(code))
	}
	if got := msg(v1.TerminationMessageReadFile, 1); got != "" {
		t.Errorf("File policy, empty file: %q", got)
	}
	if got := msg(v1.TerminationMessageFallbackToLogsOnError, 0); got != "" {
		t.Errorf("fallback after a success: %q", got)
	}
	got := msg(v1.TerminationMessageFallbackToLogsOnError, 1)
	lines := strings.Split(strings.TrimSuffix(got, "\n"), "\n")
	if len(got) > MaxTerminationMessageLogBytes || !strings.HasSuffix(got, "line 99\n") || len(lines) > MaxTerminationMessageLogLines {
		t.Errorf("fallback: %d bytes, %d lines, ending %q", len(got), len(lines), got[max(0, len(got)-20):])
	}
	// 80 short lines fit in 2048 bytes: exactly the last 80.
	var short strings.Builder
	for i := range 100 {
		fmt.Fprintf(&short, "2026-01-01T00:00:00.000000000Z stderr F %d\n", i)
	}
	if err := os.WriteFile(filepath.Join(logDir, "main", "0.log"), []byte(short.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	got = msg(v1.TerminationMessageFallbackToLogsOnError, 2)
	if lines := strings.Split(strings.TrimSuffix(got, "\n"), "\n"); len(lines) != MaxTerminationMessageLogLines || lines[0] != "20" {
		t.Errorf("fallback on short lines: %d lines from %q", len(lines), lines[0])
	}
	// A file that holds something wins over the log.
	dir, _ := m.podDir(testUID)
	if err := os.WriteFile(filepath.Join(dir, "containers", "main", name), []byte("bye"), 0o666); err != nil {
		t.Fatal(err)
	}
	if got := msg(v1.TerminationMessageFallbackToLogsOnError, 1); got != "bye" {
		t.Errorf("file and fallback: %q", got)
	}
}

func TestTailBufferKeepsTheLastBytes(t *testing.T) {
	b := newTailBuffer(5)
	for _, w := range []string{"ab", "cd", "efg", "", "h"} {
		_, _ = b.Write([]byte(w))
	}
	if got := b.String(); got != "defgh" {
		t.Errorf("got %q", got)
	}
	_, _ = b.Write([]byte("0123456789"))
	if got := b.String(); got != "56789" {
		t.Errorf("got %q", got)
	}
}

func mkfifo(path string) error { return unix.Mkfifo(path, 0o666) }
