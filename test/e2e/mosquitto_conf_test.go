package e2e

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"testing"
	"time"
)

// freeLoopbackPort returns a TCP port on 127.0.0.1 that was free just now.
func freeLoopbackPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// runMosquitto starts mosquitto with conf (plus a `user` line so it can run
// as this user), waits until every port answers, and stops it at the end of
// the test, printing its log if the test failed.
func runMosquitto(t *testing.T, conf string, ports ...int) {
	t.Helper()
	self, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "mosquitto.conf")
	if err := os.WriteFile(file, []byte(conf+"\nuser "+self.Username+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/usr/sbin/mosquitto", "-c", file)
	var logs syncBuffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting mosquitto (is it installed?): %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("mosquitto log:\n%s", logs.String())
		}
	})
	Eventually(t, 10*time.Second, fmt.Sprintf("mosquitto listening on %v", ports), func() bool {
		for _, p := range ports {
			c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", p))
			if err != nil {
				return false
			}
			c.Close()
		}
		return true
	})
}
