package main

import (
	"os"
	"testing"
	"time"
)

func TestSummariseNearestRank(t *testing.T) {
	var ds []time.Duration
	for i := 100; i >= 1; i-- { // unsorted input: summarise must sort
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	s := summarise(ds)
	if s.N != 100 || s.MinMs != 1 || s.P50Ms != 50 || s.P99Ms != 99 || s.MaxMs != 100 || s.MeanMs != 50.5 {
		t.Fatalf("summary of 1..100 ms: %+v", s)
	}
	if ds[0] != 100*time.Millisecond {
		t.Fatal("summarise reordered its input")
	}
	few := summarise([]time.Duration{3 * time.Millisecond, time.Millisecond, 2 * time.Millisecond})
	if few.P50Ms != 2 || few.P99Ms != 3 {
		t.Fatalf("summary of 1,2,3 ms: %+v", few)
	}
	if (summarise(nil) != latencies{}) {
		t.Fatal("empty input must give an empty summary")
	}
}

func TestParseStatTicks(t *testing.T) {
	// Field 14 utime=250, 15 stime=75; the name holds spaces and a ')'.
	stat := "1234 (my (weird) name) S 1 1234 1234 0 -1 4194560 500 0 0 0 250 75 0 0 20 0 8 0 100 1000 200"
	got, err := parseStatTicks(stat)
	if err != nil || got != 325 {
		t.Fatalf("parseStatTicks = %d, %v; want 325", got, err)
	}
	if _, err := parseStatTicks("1234 (x) S 1"); err == nil {
		t.Fatal("a short stat line must be an error")
	}
}

func TestProcOfSelf(t *testing.T) {
	rss, err := procRSS(os.Getpid())
	if err != nil || rss < 1<<20 {
		t.Fatalf("RSS of the test process = %d, %v", rss, err)
	}
	if _, err := procCPUTicks(os.Getpid()); err != nil {
		t.Fatal(err)
	}
}
