package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"

	"github.com/rs/zerolog"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/mqlet/mqlet/agent"
	"github.com/mqlet/mqlet/agent/eventlog"
	"github.com/mqlet/mqlet/agent/eviction"
	"github.com/mqlet/mqlet/agent/inflight"
	"github.com/mqlet/mqlet/agent/intake"
	"github.com/mqlet/mqlet/agent/liveconfig"
	"github.com/mqlet/mqlet/agent/nodestatus"
	"github.com/mqlet/mqlet/agent/restart"
	"github.com/mqlet/mqlet/agent/store"
	"github.com/mqlet/mqlet/agent/streams"
	"github.com/mqlet/mqlet/agent/telemetry"
	"github.com/mqlet/mqlet/agent/validate"
	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/config"
	"github.com/mqlet/mqlet/cri"
	"github.com/mqlet/mqlet/internal/crashout"
	"github.com/mqlet/mqlet/internal/imagepolicy"
	"github.com/mqlet/mqlet/internal/lsm"
	"github.com/mqlet/mqlet/internal/redact"
	"github.com/mqlet/mqlet/internal/runtimeclass"
	"github.com/mqlet/mqlet/internal/version"
	"github.com/mqlet/mqlet/logging"
	"github.com/mqlet/mqlet/mqtt/broker"
	"github.com/mqlet/mqlet/mqtt/outbox"
	"github.com/mqlet/mqlet/mqtt/session"
	"github.com/mqlet/mqlet/sealing"
)

// runAgent opens the node's state, builds the agent and runs it until ctx
// ends (see agent.Run for the shutdown order). Deferred closes run after
// Run has returned, when no part writes any more: stores and broker last.
func runAgent(ctx context.Context, cfg *config.Config, sources map[string]string, log zerolog.Logger, level *logging.Level, secrets *redact.Live) error {
	log = log.With().Str("node", cfg.Node).Logger()
	log.Info().Str("version", version.Version).Str("stateDir", cfg.StateDir).Msg("mqlet starting")
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return fmt.Errorf("creating state dir: %w", err)
	}
	// Settings changed over MQTT (the config verb) outlive a restart.
	live, dropped, err := liveconfig.Open(cfg, sources, cfg.StateDir)
	if err != nil {
		return err
	}
	if len(dropped) > 0 {
		log.Warn().Strs("settings", dropped).Msg("remote settings no longer tunable or valid were dropped")
	}
	effective := live.Effective()
	cfg = &effective
	if err := level.Set(cfg.LogLevel); err != nil {
		return err
	}
	state, err := openState(cfg, log)
	if err != nil {
		return err
	}
	defer state.close()
	state.live = live
	secrets.Bind(state.store)
	defer secrets.Bind(nil)
	if cfg.EmbeddedBroker.Enabled {
		// Not tied to ctx: the agent says goodbye through it after the signal.
		b, err := startEmbeddedBroker(context.WithoutCancel(ctx), cfg, log)
		if err != nil {
			return err
		}
		defer b.Close()
	}
	opts, err := agentOptions(cfg, state)
	if err != nil {
		return err
	}
	if _, ok := opts.Allocatable[v1.ResourceMemory]; !ok {
		log.Warn().Msg("the node's memory could not be read: memory requests of pods are not checked against it")
	}
	log.Info().Str("commands", string(cfg.Security.Commands)).Strs("signedVerbs", cfg.Security.SignedVerbs).Int("trustedKeys", len(cfg.Security.TrustedKeys)).Msg("signed commands")
	log.Info().Str("sealingKey", opts.Unsealer.Recipient()).Bool("requireSealedSecrets", cfg.Security.RequireSealedSecrets).Msg("sealed secrets")
	rt := cri.NewManager(criConfig(cfg, secrets), log)
	opts.LogLevel = level
	a, err := agent.New(ctx, opts, agent.Deps{Store: state.store, Outbox: state.box, Runtime: rt, ScrubPod: secrets.ForPod}, log)
	if err != nil {
		return err
	}
	brokers := brokerURLs(cfg)
	for i := range brokers {
		brokers[i] = redacted(brokers[i])
	}
	log.Info().Str("bootId", a.BootID()).Strs("brokers", brokers).Str("cri", cfg.Runtime.CRIEndpoint).Msg("mqlet running")
	return a.Run(ctx)
}

// nodeState is what mqlet keeps on disk: the desired-state store, the
// outbox, the in-flight marks and the nonces of signed commands.
type nodeState struct {
	store                   *store.Store
	box                     *outbox.Outbox
	commandMarks, syncMarks *inflight.File
	crash                   crashout.Report // the previous process's Go crash report
	nonces                  io.Closer
	events                  *eventlog.Log        // the events history (get Event)
	live                    *liveconfig.Settings // the settings the config verb changes
	closers                 []io.Closer          // in opening order
}

// openState opens everything under cfg.StateDir; on an error what was
// opened is closed again.
func openState(cfg *config.Config, log zerolog.Logger) (_ *nodeState, err error) {
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("creating state dir: %w", err)
	}
	s := &nodeState{}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	if s.store, err = store.OpenWith(filepath.Join(cfg.StateDir, "state.db"), storeOptions(cfg)); err != nil {
		return nil, fmt.Errorf("opening desired-state store: %w", err)
	}
	s.closers = append(s.closers, s.store)
	if m := s.store.Schema(); m.Migrated() {
		log.Warn().Int("from", m.From).Int("to", m.To).Str("backup", m.Backup).Int("objectsGivenNodeSource", m.Sourced).Msg("state store migrated to a new schema; the old store was copied first")
		if m.From < store.SchemaSecretsEncrypted {
			log.Warn().Str("backup", m.Backup).Msg("the backup of the old store holds its Secrets in clear (the store now encrypts them): delete it once this version is kept")
		}
	}
	if m := s.store.MigratedUIDs(); len(m) > 0 {
		log.Warn().Strs("objects", m).Msg("stored uids that were not UUIDs were replaced; those pods are re-created")
	}
	if s.box, err = outbox.Open(filepath.Join(cfg.StateDir, "outbox.db"), cfg.MQTT.OutboxMaxBytes, log, outbox.WithMaxInflight(cfg.MQTT.MaxInflight)); err != nil {
		return nil, fmt.Errorf("opening outbox: %w", err)
	}
	s.closers = append(s.closers, s.box)
	if s.commandMarks, err = inflight.Open(filepath.Join(cfg.StateDir, "inflight-command"), 1); err != nil {
		return nil, fmt.Errorf("opening command marks: %w", err)
	}
	s.closers = append(s.closers, s.commandMarks)
	if s.syncMarks, err = inflight.Open(filepath.Join(cfg.StateDir, "inflight-syncs"), max(cfg.Pods.Workers, 1)); err != nil {
		return nil, fmt.Errorf("opening pod sync marks: %w", err)
	}
	s.closers = append(s.closers, s.syncMarks)
	// Armed before any pod is synced: a Go crash in a sync is then told
	// apart from an external kill at the next start.
	if s.crash, err = crashout.Arm(filepath.Join(cfg.StateDir, "crash-output")); err != nil {
		return nil, err
	}
	if s.events, err = eventlog.Open(filepath.Join(cfg.StateDir, "events.jsonl"), cfg.Events.History, log.With().Str("component", "eventlog").Logger()); err != nil {
		return nil, err
	}
	s.closers = append(s.closers, s.events)
	return s, nil
}

// close closes in the reverse order of opening.
func (s *nodeState) close() {
	for i := len(s.closers) - 1; i >= 0; i-- {
		_ = s.closers[i].Close()
	}
	s.closers = nil
}

// criConfig takes the runtime manager's settings from the configuration.
func criConfig(cfg *config.Config, secrets *redact.Live) cri.Config {
	return cri.Config{
		Endpoint:            cfg.Runtime.CRIEndpoint,
		PodLogDir:           cfg.Runtime.PodLogDir,
		PodDir:              filepath.Join(cfg.StateDir, "pods"),
		CgroupRoot:          cfg.Runtime.CgroupRoot,
		PodPidsLimit:        cfg.Pods.PidsLimit,
		RequestTimeout:      cfg.Runtime.RequestTimeout.Duration,
		ExitEvents:          cfg.Runtime.ExitEvents,
		EventedRelistPeriod: cfg.Runtime.PLEGPeriodWithEvents.Duration,
		// The runtime re-checks hostPaths on their resolved path and scrubs
		// secret values from what it reports.
		AllowedHostPaths: cfg.Admission.AllowedHostPaths,
		ScrubPod:         secrets.ForPod,
		PullParallelism:  cfg.Images.PullParallelism,
		PullTimeout:      cfg.Images.PullTimeout.Duration,
		PullBackoffBase:  cfg.Images.PullBackoffBase.Duration,
		PullBackoffMax:   cfg.Images.PullBackoffMax.Duration,
		NodeCredentials:  cfg.Images.CredentialsFile,
		HostIPs:          hostIPs(),
		Registries:       registries(cfg),
		RuntimeClasses:   runtimeClasses(cfg),
	}
}

// runtimeClasses are runtime.classes (validated with the config).
func runtimeClasses(cfg *config.Config) runtimeclass.Set {
	classes := make([]runtimeclass.Class, 0, len(cfg.Runtime.Classes))
	for _, c := range cfg.Runtime.Classes {
		overhead := v1.ResourceList{}
		for name, q := range config.RuntimeClassOverhead(c) {
			overhead[v1.ResourceName(name)] = q
		}
		classes = append(classes, runtimeclass.Class{Name: c.Name, Handler: c.Handler, Overhead: overhead, NodeSelector: c.NodeSelector})
	}
	set, err := runtimeclass.New(classes)
	if err != nil {
		return runtimeclass.Set{} // unreachable after config.Validate (names are unique)
	}
	return set
}

// registries is the policy of images.allowedRegistries (validated with the
// config, so it parses).
func registries(cfg *config.Config) *imagepolicy.Policy {
	p, err := imagepolicy.New(cfg.Images.AllowedRegistries)
	if err != nil {
		p, _ = imagepolicy.New([]string{}) // the default; unreachable after config.Validate
	}
	return p
}

func startEmbeddedBroker(ctx context.Context, cfg *config.Config, log zerolog.Logger) (*broker.Broker, error) {
	opts := broker.Options{Listen: cfg.EmbeddedBroker.Listen, PasswordFile: cfg.EmbeddedBroker.PasswordFile, AllowAnonymous: cfg.EmbeddedBroker.AllowAnonymous}
	if cfg.EmbeddedBroker.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(cfg.EmbeddedBroker.CertFile, cfg.EmbeddedBroker.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("loading embedded broker certificate: %w", err)
		}
		opts.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	b, err := broker.Start(ctx, opts, log)
	if err != nil {
		return nil, fmt.Errorf("starting embedded broker: %w", err)
	}
	log.Info().Str("listen", b.Addr()).Msg("embedded MQTT broker started")
	return b, nil
}

// brokerURLs are the brokers to try in turn: the embedded broker when it
// runs and no other broker was configured, else mqtt.brokers (or
// mqtt.broker, its one-element case).
func brokerURLs(cfg *config.Config) []string {
	if cfg.EmbeddedBroker.Enabled && len(cfg.MQTT.Brokers) == 0 && cfg.MQTT.Broker == config.Default().MQTT.Broker {
		scheme := "tcp"
		if cfg.EmbeddedBroker.CertFile != "" {
			scheme = "ssl"
		}
		return []string{scheme + "://" + cfg.EmbeddedBroker.Listen}
	}
	return slices.Clone(cfg.MQTT.BrokerList())
}

func tlsFor(cfg *config.Config) (*tls.Config, error) {
	if cfg.MQTT.CAFile == "" && cfg.MQTT.CertFile == "" && !cfg.MQTT.InsecureSkipVerify {
		return nil, nil
	}
	t, err := session.TLSConfig(cfg.MQTT.CAFile, cfg.MQTT.CertFile, cfg.MQTT.KeyFile, cfg.MQTT.InsecureSkipVerify)
	if err != nil {
		return nil, fmt.Errorf("loading MQTT TLS material: %w", err)
	}
	return t, nil
}

// policyFrom maps a validated config.Admission into the admission policy.
func policyFrom(a config.Admission) validate.Policy {
	namespaces := make(map[string]validate.Profile, len(a.Namespaces))
	for ns, p := range a.Namespaces {
		namespaces[ns] = validate.Profile(p)
	}
	ports := make([]validate.PortRange, 0, len(a.AllowedHostPorts))
	for _, r := range a.AllowedHostPorts {
		first, last, _ := config.ParsePortRange(r) // config.Validate has checked it
		ports = append(ports, validate.PortRange{First: first, Last: last})
	}
	return validate.Policy{
		Profile:             validate.Profile(a.Profile),
		Namespaces:          namespaces,
		AllowedHostPorts:    ports,
		AllowPrivileged:     a.AllowPrivileged,
		AllowHostNetwork:    a.AllowHostNetwork,
		AllowHostPID:        a.AllowHostPID,
		AllowHostIPC:        a.AllowHostIPC,
		AllowedHostPaths:    a.AllowedHostPaths,
		AllowedCapabilities: a.AllowedCapabilities,
		Host:                hostSecurity(lsm.Host{Sysfs: "/sys"}),
	}
}

func policyWithRegistries(p validate.Policy, r *imagepolicy.Policy) validate.Policy {
	p.Registries = r
	return p
}

// hostSecurity is which security modules the kernel enforces, for the
// kubelet's admission rules on AppArmor profiles and SELinux options.
func hostSecurity(h lsm.Host) validate.HostSecurity {
	return validate.HostSecurity{AppArmor: h.AppArmorEnabled(), SELinux: h.SELinuxEnabled()}
}

// hostIPs lists the node's non-loopback addresses, skipping container bridges.
func hostIPs() []string {
	ifaces, err := net.Interfaces()
	if err != nil {
		return nil
	}
	var ips []string
	for _, ifc := range ifaces {
		if ifc.Flags&net.FlagUp == 0 || ifc.Flags&net.FlagLoopback != 0 || strings.HasPrefix(ifc.Name, "veth") || strings.HasPrefix(ifc.Name, "cni") || strings.HasPrefix(ifc.Name, "mqlet") || strings.HasPrefix(ifc.Name, "docker") {
			continue
		}
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil {
				ips = append(ips, ipn.IP.String())
			}
		}
	}
	return ips
}

// agentOptions takes the agent's settings from the configuration, with
// the in-flight marks of state and the signed-command checks.
func agentOptions(cfg *config.Config, state *nodeState) (agent.Options, error) {
	topics := apiv1.Scheme{Prefix: cfg.MQTT.TopicPrefix, Node: cfg.Node}
	if err := topics.Validate(); err != nil {
		return agent.Options{}, fmt.Errorf("topic scheme: %w", err)
	}
	groups := func() []string { return cfg.Groups }
	if state.live != nil {
		groups = state.live.Groups
	}
	verifier, nonces, err := verifierFrom(cfg, groups)
	if err != nil {
		return agent.Options{}, fmt.Errorf("setting up signed commands: %w", err)
	}
	state.nonces = nonces
	state.closers = append(state.closers, nonces)
	tlsConfig, err := tlsFor(cfg)
	if err != nil {
		return agent.Options{}, err
	}
	sealKey, err := sealing.LoadOrCreateIdentity(filepath.Join(cfg.StateDir, "seal.key"))
	if err != nil {
		return agent.Options{}, fmt.Errorf("setting up sealed secrets: %w", err)
	}
	opts := agent.Options{
		Topics:          topics,
		MaxPayloadBytes: cfg.MQTT.MaxPayloadBytes,
		Policy:          policyWithRegistries(policyFrom(cfg.Admission), registries(cfg)),
		Workers:         cfg.Pods.Workers,
		PodResync:       cfg.Pods.Resync.Duration,
		Restart:         restart.Policy{Base: cfg.Pods.BackoffBase.Duration, Max: cfg.Pods.BackoffMax.Duration, ResetAfter: cfg.Pods.BackoffResetAfter.Duration},
		ApplyDeadline:   cfg.Pods.ApplyDeadline.Duration,
		PLEGPeriod:      cfg.Runtime.PLEGPeriod.Duration,
		GCInterval:      cfg.GC.Interval.Duration,
		GCPolicy: cri.GCPolicy{
			MinAge:                      cfg.GC.MinDeadAge.Duration,
			MaxPerPodContainer:          cfg.GC.MaxDeadPerContainer,
			ImageGCHighThresholdPercent: cfg.GC.ImageGCHighPercent,
			ImageGCLowThresholdPercent:  cfg.GC.ImageGCLowPercent,
		},
		PodStatusResync: cfg.Telemetry.PodStatusResync.Duration,
		HostIPs:         hostIPs(),
		Opener:          verifier,
		ProfilePolicy: func(node validate.Policy, namespace, profile string) validate.Policy {
			return node.LoosenedFor(namespace, validate.Profile(profile))
		},
		Unsealer:             sealKey,
		RequireSealedSecrets: cfg.Security.RequireSealedSecrets,
		MaxPods:              cfg.Pods.MaxPods,
		NodeLabels:           nodeLabels(cfg),
		Allocatable:          nodeAllocatable(cfg),
		RuntimeClasses:       runtimeClasses(cfg),
		LogRotation:          cri.LogRotation{MaxBytes: cfg.Runtime.ContainerLogMaxBytes, MaxFiles: cfg.Runtime.ContainerLogMaxFiles},
		LogRotationPeriod:    cfg.Runtime.LogRotationPeriod.Duration,
		MaxReplyBytes:        cfg.Requests.MaxReplyBytes,
		MaxBacklog:           cfg.Requests.MaxBacklog,
		MaxBacklogBytes:      cfg.Requests.MaxBacklogBytes,
		Streams: streams.Limits{Max: cfg.Requests.MaxStreams, MaxFollows: cfg.Requests.MaxFollows,
			MaxFollowsPerRequester: cfg.Requests.MaxFollowsPerRequester, Unread: cfg.Logs.UnreadTimeout.Duration,
			MaxInteractivePerRequester: cfg.Exec.MaxSessionsPerRequester},
		Logs: intake.LogLimits{MaxChunkBytes: cfg.Logs.MaxChunkBytes, MaxBytes: cfg.Logs.MaxBytes,
			MaxFollow: cfg.Logs.MaxFollow.Duration, BytesPerSecond: cfg.Logs.MaxBytesPerSecond,
			// A log waits for the broker rather than filling the outbox.
			MaxBacklog: cfg.MQTT.OutboxMaxBytes / 4},
		Exec: intake.ExecLimits{Enabled: cfg.Exec.Enabled, DefaultTimeout: cfg.Exec.DefaultTimeout.Duration,
			MaxTimeout: cfg.Exec.MaxTimeout.Duration, MaxOutputBytes: cfg.Exec.MaxOutputBytes,
			IdleTimeout: cfg.Exec.IdleTimeout.Duration},
		Version: version.Version,
		Session: session.Options{
			Brokers:      brokerURLs(cfg),
			ClientID:     session.ClientID(cfg.Node),
			Username:     cfg.MQTT.Username,
			Password:     cfg.MQTT.Password,
			TLS:          tlsConfig,
			KeepAlive:    cfg.MQTT.KeepAlive.Duration,
			PingTimeout:  cfg.MQTT.PingTimeout.Duration,
			ReconnectMin: cfg.MQTT.ReconnectMin.Duration,
			ReconnectMax: cfg.MQTT.ReconnectMax.Duration,
			MaxInflight:  cfg.MQTT.MaxInflight,
		},
		Telemetry: telemetryConfig(cfg, topics),
	}
	if state.commandMarks != nil {
		opts.CommandMarks = state.commandMarks
	}
	if state.syncMarks != nil {
		opts.SyncMarks = state.syncMarks
	}
	opts.Crash = state.crash
	if state.box != nil {
		box := state.box
		opts.Logs.Backlog = func() int64 { return box.Stats().Bytes }
	}
	if state.events != nil {
		opts.EventLog = state.events
	}
	opts.Groups = cfg.Groups
	if live := state.live; live != nil {
		opts.Live = live
		opts.Telemetry.LiveMetrics = live.Period("metricsInterval")
		opts.Telemetry.LiveNodeStatus = live.Period("nodeStatusInterval")
	}
	if opts.Eviction, err = evictionOptions(cfg); err != nil {
		return agent.Options{}, err
	}
	if cfg.Images.PreloadDir != "" {
		opts.Preload = &cri.PreloadConfig{Dir: cfg.Images.PreloadDir, Interval: cfg.Images.PreloadInterval.Duration,
			Ctr: cfg.Images.Ctr, Endpoint: cfg.Runtime.CRIEndpoint}
	}
	return opts, nil
}

// telemetryConfig takes the node status and metrics settings from the configuration.
func telemetryConfig(cfg *config.Config, topics apiv1.Scheme) telemetry.Config {
	return telemetry.Config{
		Topics: topics, Version: version.Version, StateDir: cfg.StateDir, CgroupRoot: cfg.Runtime.CgroupRoot, RuntimeEndpoint: cfg.Runtime.CRIEndpoint,
		MetricsInterval: cfg.Telemetry.MetricsInterval.Duration, NodeStatusInterval: cfg.Telemetry.NodeStatusInterval.Duration,
		MemoryAvailable: cfg.Telemetry.MemoryAvailable, DiskAvailablePct: cfg.Telemetry.DiskAvailablePct, PIDAvailablePct: cfg.Telemetry.PIDAvailablePct,
		ReservedMemory: config.Reserved(cfg.Eviction.ReservedMemory), ReservedStorage: config.Reserved(cfg.Eviction.ReservedStorage),
		MaxPods: cfg.Pods.MaxPods, NodeLabels: cfg.NodeLabels,
	}
}

// evictionOptions are the eviction manager's settings: the thresholds of
// the file, mqlet's reserve, and the state directory as the node's
// filesystem (where the pods' emptyDirs are).
func evictionOptions(cfg *config.Config) (*agent.EvictionOptions, error) {
	e := cfg.Eviction
	opts := &agent.EvictionOptions{NodeFsPath: cfg.StateDir, MemoryCgroup: memoryCgroupDir(e.MemoryCgroup), Config: eviction.Config{
		PressureTransitionPeriod: e.PressureTransitionPeriod.Duration,
		MaxPodGracePeriod:        e.MaxPodGracePeriodSeconds,
		ReservedMemory:           config.Reserved(e.ReservedMemory),
		ReservedStorage:          config.Reserved(e.ReservedStorage),
		Interval:                 e.Interval.Duration,
	}}
	for _, t := range cfg.EvictionThresholds() {
		v, err := eviction.ParseValue(eviction.Signal(t.Signal), t.Value)
		if err != nil {
			return nil, fmt.Errorf("eviction threshold: %w", err)
		}
		opts.Thresholds = append(opts.Thresholds, eviction.Threshold{Signal: eviction.Signal(t.Signal), Value: v, GracePeriod: t.GracePeriod})
	}
	return opts, nil
}

// redacted hides a password written into a broker URL.
func redacted(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}

// nodeLabels are the labels the node is published with, which pods are
// admitted against.
func nodeLabels(cfg *config.Config) map[string]string {
	// The configured and the groups' labels are added by the agent, from
	// its live settings.
	return nodestatus.Labels(cfg.Node, nil, nodestatus.HostInfo{OperatingSystem: runtime.GOOS, Architecture: runtime.GOARCH})
}

// nodeAllocatable is the cpu, memory and ephemeral-storage pods are
// admitted against, as the node status computes its allocatable: less the
// eviction thresholds and mqlet's own reserve. What cannot be read is not
// checked (runAgent logs memory).
func nodeAllocatable(cfg *config.Config) v1.ResourceList {
	threshold, err := resource.ParseQuantity(cfg.Telemetry.MemoryAvailable)
	if err != nil {
		threshold = nodestatus.DefaultMemoryAvailable
	}
	memory, err := nodestatus.ReadMemTotal("/proc")
	alloc := nodestatus.Allocatable(runtime.NumCPU(), memory, threshold)
	if err != nil {
		delete(alloc, v1.ResourceMemory)
	} else if reserved := config.Reserved(cfg.Eviction.ReservedMemory); reserved > 0 {
		mem := alloc[v1.ResourceMemory]
		alloc[v1.ResourceMemory] = *resource.NewQuantity(max(mem.Value()-reserved, 0), resource.BinarySI)
	}
	if disk, err := nodestatus.ReadDiskUsage(cfg.StateDir); err == nil && disk.CapacityBytes > 0 {
		capacity := int64(disk.CapacityBytes)
		left := capacity - capacity*int64(max(cfg.Telemetry.DiskAvailablePct, 0))/100 - config.Reserved(cfg.Eviction.ReservedStorage)
		alloc[v1.ResourceEphemeralStorage] = *resource.NewQuantity(max(left, 0), resource.BinarySI)
	}
	return alloc
}

// storeOptions are the desired-state store's settings from cfg: the bounds
// of the request records kept for redeliveries.
func storeOptions(cfg *config.Config) store.Options {
	return store.Options{
		MaxReplies: cfg.Requests.MaxRecords, ReplyTTL: cfg.Requests.TTL.Duration, MaxReplyBytes: cfg.Requests.MaxRecordBytes,
	}
}

// memoryCgroupDir is the directory of the memory controller for cgroup
// (v1: its own hierarchy; v2: the unified tree), "" for none.
func memoryCgroupDir(cgroup string) string {
	if cgroup == "" {
		return ""
	}
	if st, err := os.Stat("/sys/fs/cgroup/memory"); err == nil && st.IsDir() {
		return filepath.Join("/sys/fs/cgroup/memory", cgroup)
	}
	return filepath.Join("/sys/fs/cgroup", cgroup)
}

// The runtime manager reports what eviction reads.
var _ agent.EvictionRuntime = (*cri.Manager)(nil)
