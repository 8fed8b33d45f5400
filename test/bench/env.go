package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/rs/zerolog"
	internalapi "k8s.io/cri-api/pkg/apis"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	criclient "k8s.io/cri-client/pkg"
	"k8s.io/klog/v2"
)

const (
	topicPrefix  = "mqlet/v1"
	busyboxImage = "docker.io/mqlet/busybox:test"
	podTimeout   = 3 * time.Minute
	stopTimeout  = 20 * time.Second
)

// env is what every step shares: the broker, a recording operator client,
// one running mqlet and a direct CRI connection for checking and sweeping.
type env struct {
	opts    options
	log     zerolog.Logger
	workDir string
	run     string // unique suffix of this run's names

	broker *mosquittoBroker
	mq     *recorder
	cri    internalapi.RuntimeService

	node     string
	t        topics
	ns       string
	agent    *process
	stateDir string
	ids      atomic.Int64
}

func newEnv(ctx context.Context, opts options, log zerolog.Logger) (*env, error) {
	workDir, err := os.MkdirTemp(opts.workDir, "run-")
	if err != nil {
		return nil, fmt.Errorf("make work dir under %s: %w", opts.workDir, err)
	}
	run := strings.ToLower(fmt.Sprintf("%x", time.Now().UnixNano()%0xffffffff))
	e := &env{opts: opts, log: log, workDir: workDir, run: run, node: "bench-" + run, ns: "bench-" + run}
	e.t = topics{prefix: topicPrefix, node: e.node}
	if e.broker, err = startMosquitto(ctx, opts.mosquitto, workDir, opts.brokerNoDelay); err != nil {
		return nil, err
	}
	if e.mq, err = connect(ctx, e.broker.url, "bench-operator-"+run); err != nil {
		e.close()
		return nil, err
	}
	if err := e.mq.subscribe(ctx, e.t.all()); err != nil {
		e.close()
		return nil, err
	}
	criCtx, cancel := context.WithTimeout(quietCtx(ctx), 10*time.Second)
	defer cancel()
	e.cri, err = criclient.NewRemoteRuntimeServiceBuilder().WithEndpoint(opts.criEndpoint).
		WithConnectionTimeout(10 * time.Second).WithTracerProvider(nil).Build(criCtx)
	if err != nil {
		e.close()
		return nil, fmt.Errorf("connect to CRI %s: %w", opts.criEndpoint, err)
	}
	if _, err := e.cri.Version(criCtx, "v1"); err != nil {
		e.close()
		return nil, fmt.Errorf("CRI %s does not answer (start it with test/env/containerd-up.sh): %w", opts.criEndpoint, err)
	}
	return e, nil
}

// quietCtx keeps the CRI client's klog output out of the report.
func quietCtx(ctx context.Context) context.Context { return klog.NewContext(ctx, logr.Discard()) }

// mqletConfig is the agent's config: defaults, except that pod logs go to
// the bench's scratch directory.
func (e *env) mqletConfig(dir string) (string, error) {
	logDir := filepath.Join(dir, "pod-logs")
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return "", fmt.Errorf("make pod log dir: %w", err)
	}
	file := filepath.Join(dir, "mqlet.yaml")
	conf := fmt.Sprintf("runtime:\n  podLogDir: %s\n", logDir)
	if e.opts.maxBacklog > 0 {
		conf += fmt.Sprintf("requests:\n  maxBacklog: %d\n", e.opts.maxBacklog)
	}
	if e.opts.workers > 0 {
		conf += fmt.Sprintf("pods:\n  workers: %d\n", e.opts.workers)
	}
	if err := os.WriteFile(file, []byte(conf), 0o600); err != nil {
		return "", fmt.Errorf("write mqlet config: %w", err)
	}
	return file, nil
}

// startMqlet starts an mqlet for node with state in stateDir and returns it
// with the moment just before the process was started.
func (e *env) startMqlet(node, stateDir string) (*process, time.Time, error) {
	return e.startMqletOn(e.broker.url, node, stateDir)
}

// startMqletOn is startMqlet with another broker.
func (e *env) startMqletOn(broker, node, stateDir string) (*process, time.Time, error) {
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return nil, time.Time{}, fmt.Errorf("make state dir: %w", err)
	}
	conf, err := e.mqletConfig(stateDir)
	if err != nil {
		return nil, time.Time{}, err
	}
	args := []string{"--node", node, "--broker", broker, "--state-dir", stateDir,
		"--cri-endpoint", e.opts.criEndpoint, "--log-level", e.opts.logLevel, "--config", conf}
	start := time.Now()
	p, err := startProcess("mqlet", filepath.Join(e.workDir, "mqlet-"+node+".log"), e.opts.mqlet, args...)
	return p, start, err
}

// waitOnline waits for an "online" state of node recorded at or after from.
func (e *env) waitOnline(ctx context.Context, rec *recorder, node string, from int, proc *process) (time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	t := topics{prefix: topicPrefix, node: node}
	var at time.Time
	exited := make(chan struct{})
	go func() { // end the wait early when mqlet dies instead of timing out
		select {
		case <-proc.exited:
			cancel()
		case <-exited:
		}
	}()
	defer close(exited)
	err := rec.scan(ctx, from, node+" online", func(m msg) (bool, error) {
		if m.Topic != t.state() {
			return false, nil
		}
		var s struct {
			State string `json:"state"`
		}
		if json.Unmarshal(m.Payload, &s) == nil && s.State == "online" {
			at = m.At
			return true, nil
		}
		return false, nil
	})
	if err != nil && !proc.alive() {
		return at, fmt.Errorf("mqlet exited before it was online (see %s): %w", proc.log.Name(), err)
	}
	return at, err
}

// bringUp starts the mqlet used by the intake, pod and idle steps.
func (e *env) bringUp(ctx context.Context) error {
	e.stateDir = filepath.Join(e.workDir, "state-main")
	from := e.mq.mark()
	p, _, err := e.startMqlet(e.node, e.stateDir)
	if err != nil {
		return err
	}
	e.agent = p
	if _, err := e.waitOnline(ctx, e.mq, e.node, from, p); err != nil {
		return err
	}
	return nil
}

func (e *env) nextID(verb string) string {
	return fmt.Sprintf("%s-%s-%d", verb, e.run, e.ids.Add(1))
}

// checkAgent fails a step early when mqlet is gone.
func (e *env) checkAgent() error {
	if e.agent == nil || !e.agent.alive() {
		return errors.New("mqlet is not running")
	}
	return nil
}

// sandboxesOf lists this run's sandboxes of pod name (all pods when name is empty).
func (e *env) sandboxesOf(ctx context.Context, name string) ([]*runtimeapi.PodSandbox, error) {
	ctx, cancel := context.WithTimeout(quietCtx(ctx), 10*time.Second)
	defer cancel()
	labels := map[string]string{"io.kubernetes.pod.namespace": e.ns}
	if name != "" {
		labels["io.kubernetes.pod.name"] = name
	}
	list, err := e.cri.ListPodSandbox(ctx, &runtimeapi.PodSandboxFilter{LabelSelector: labels})
	if err != nil {
		return nil, fmt.Errorf("list sandboxes of %s/%s: %w", e.ns, name, err)
	}
	return list, nil
}

// sweep removes whatever of this run is left in containerd.
func (e *env) sweep(ctx context.Context) error {
	sbs, err := e.sandboxesOf(ctx, "")
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(quietCtx(ctx), 2*time.Minute)
	defer cancel()
	var errs []error
	for _, sb := range sbs {
		errs = append(errs, e.cri.StopPodSandbox(ctx, sb.Id), e.cri.RemovePodSandbox(ctx, sb.Id))
	}
	if len(sbs) > 0 {
		e.log.Warn().Int("sandboxes", len(sbs)).Msg("swept sandboxes mqlet left behind")
	}
	return errors.Join(errs...)
}

// close stops mqlet and the broker and removes this run's leftovers.
func (e *env) close() error {
	ctx := context.Background()
	var errs []error
	if e.agent != nil {
		errs = append(errs, e.agent.stop(stopTimeout))
	}
	if e.mq != nil {
		e.mq.close()
	}
	if e.cri != nil {
		errs = append(errs, e.sweep(ctx))
		_ = e.cri.Close(ctx)
	}
	if e.broker != nil {
		errs = append(errs, e.broker.stop(5*time.Second))
	}
	if !e.opts.keep {
		errs = append(errs, os.RemoveAll(e.workDir))
	}
	return errors.Join(errs...)
}
