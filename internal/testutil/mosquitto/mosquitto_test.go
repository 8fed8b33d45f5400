package mosquitto

import (
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestStartStopRestart(t *testing.T) {
	b := Start(t)
	if err := dial(b.Addr()); err != nil {
		t.Fatalf("broker not reachable after Start: %v", err)
	}
	b.Stop()
	if err := dial(b.Addr()); err == nil {
		t.Fatal("broker still reachable after Stop")
	}
	b.Restart()
	if err := dial(b.Addr()); err != nil {
		t.Fatalf("broker not reachable after Restart: %v", err)
	}
	if b.URL() != "tcp://"+b.Addr() {
		t.Fatalf("URL() = %q", b.URL())
	}
}

func dial(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	return c.Close()
}

func TestPersistenceIsWritable(t *testing.T) {
	b := Start(t)
	b.Stop()
	if _, err := os.Stat(filepath.Join(b.dir, "mosquitto.db")); err != nil {
		t.Fatalf("mosquitto did not save its persistence on stop: %v\nlog:\n%s", err, b.Log())
	}
}
