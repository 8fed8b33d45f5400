//go:build heapprofile

package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"syscall"
)

// A build with -tags heapprofile (test/size/idle-heap.sh) writes a heap
// profile to $MQLET_HEAPPROFILE on each SIGUSR1. Release builds leave it
// out: runtime/pprof would cost the binary about 0.5 MB.
func init() {
	heapProfiler = func(ctx context.Context) (stop func()) {
		file := os.Getenv("MQLET_HEAPPROFILE")
		if file == "" {
			return func() {}
		}
		ctx, cancel := context.WithCancel(ctx)
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGUSR1)
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				select {
				case <-ctx.Done():
					return
				case <-sig:
					if err := writeHeapProfile(file); err != nil {
						fmt.Fprintln(os.Stderr, "mqlet: heap profile:", err)
					}
				}
			}
		}()
		return func() {
			signal.Stop(sig)
			cancel()
			<-done
		}
	}
}

func writeHeapProfile(file string) error {
	runtime.GC() // the profile shows what the last GC found live
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
