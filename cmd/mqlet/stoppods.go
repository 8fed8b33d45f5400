package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/mqlet/mqlet/config"
	"github.com/mqlet/mqlet/cri"
	"github.com/mqlet/mqlet/logging"
)

// runSubcommand runs `mqlet init` and `mqlet stop-pods`; ok is false for
// any other command line, which then starts the agent.
func runSubcommand(args []string) (code int, ok bool) {
	if len(args) == 0 {
		return 0, false
	}
	switch args[0] {
	case "init":
		return runInit(args[1:], os.Stdout, os.Stderr), true
	case "stop-pods":
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
		defer stop()
		return runStopPods(ctx, args[1:], os.Stdout, os.Stderr), true
	}
	return 0, false
}

// runStopPods stops and removes every pod mqlet created on the configured
// CRI endpoint (sandboxes and containers labelled io.mqlet.managed), with
// each container's own grace period, and nothing else. The package's purge
// runs it before it deletes mqlet's state: no pod is left running without
// the agent that would manage it. Takes the agent's flags (--config,
// --cri-endpoint, --state-dir).
func runStopPods(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	flags, err := config.ParseFlags("mqlet stop-pods", args, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "mqlet stop-pods:", err)
		return exitConfigInvalid
	}
	cfg, err := config.Load(flags, os.Getenv)
	if err != nil {
		fmt.Fprintln(stderr, "mqlet stop-pods:", err)
		return exitConfigInvalid
	}
	// No scrubber: stop-pods never opens the store, so it holds no secret values.
	log, err := logging.New(os.Stderr, cfg.LogLevel, cfg.LogFormat, nil)
	if err != nil {
		fmt.Fprintln(stderr, "mqlet stop-pods:", err)
		return exitConfigInvalid
	}
	rt := cri.NewManager(cri.Config{
		Endpoint:       cfg.Runtime.CRIEndpoint,
		PodLogDir:      cfg.Runtime.PodLogDir,
		PodDir:         filepath.Join(cfg.StateDir, "pods"),
		CgroupRoot:     cfg.Runtime.CgroupRoot,
		RequestTimeout: cfg.Runtime.RequestTimeout.Duration,
	}, log)
	runCtx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	done := make(chan struct{})
	go func() { defer close(done); rt.Run(runCtx) }()
	defer func() { cancel(); <-done }()

	for !rt.Ready() {
		select {
		case <-runCtx.Done():
			fmt.Fprintf(stderr, "mqlet stop-pods: the runtime at %s did not answer: %v\n", cfg.Runtime.CRIEndpoint, runCtx.Err())
			return 1
		case <-rt.Changes():
		case <-time.After(30 * time.Second):
			fmt.Fprintf(stderr, "mqlet stop-pods: the runtime at %s did not answer within 30s\n", cfg.Runtime.CRIEndpoint)
			return 1
		}
	}
	pods, err := rt.ListPods(runCtx)
	if err != nil {
		fmt.Fprintln(stderr, "mqlet stop-pods:", err)
		return 1
	}
	failed := 0
	for _, p := range pods {
		if err := rt.KillPodByRef(runCtx, p, nil); err != nil {
			fmt.Fprintf(stderr, "mqlet stop-pods: %s/%s: %v\n", p.Namespace, p.Name, err)
			failed++
			continue
		}
		fmt.Fprintf(stdout, "stopped pod %s/%s\n", p.Namespace, p.Name)
	}
	if failed > 0 {
		return 1
	}
	fmt.Fprintf(stdout, "%d pods stopped and removed\n", len(pods))
	return 0
}
