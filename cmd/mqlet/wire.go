package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/mqlet/mqlet/agent"
	"github.com/mqlet/mqlet/agent/eventlog"
	"github.com/mqlet/mqlet/agent/inflight"
	"github.com/mqlet/mqlet/agent/intake"
	"github.com/mqlet/mqlet/agent/liveconfig"
	"github.com/mqlet/mqlet/agent/presence"
	"github.com/mqlet/mqlet/agent/restart"
	"github.com/mqlet/mqlet/agent/store"
	"github.com/mqlet/mqlet/agent/telemetry"
	"github.com/mqlet/mqlet/agent/validate"
	apiv1 "github.com/mqlet/mqlet/api/v1"
	"github.com/mqlet/mqlet/config"
	"github.com/mqlet/mqlet/cri"
	"github.com/mqlet/mqlet/internal/redact"
	"github.com/mqlet/mqlet/internal/version"
	"github.com/mqlet/mqlet/mqtt/broker"
	"github.com/mqlet/mqlet/mqtt/outbox"
	"github.com/mqlet/mqlet/mqtt/session"
)

// runAgent builds every part from the configuration and runs them until
// ctx ends; then it says goodbye on MQTT and closes the stores.
func runAgent(ctx context.Context, cfg *config.Config, sources map[string]string, log zerolog.Logger, secrets *redact.Live) error {
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
	st, err := store.OpenWith(filepath.Join(cfg.StateDir, "state.db"), storeOptions(cfg))
	if err != nil {
		return fmt.Errorf("opening desired-state store: %w", err)
	}
	defer st.Close()
	secrets.Bind(st)
	defer secrets.Bind(nil)
	box, err := outbox.Open(filepath.Join(cfg.StateDir, "outbox.db"), cfg.MQTT.OutboxMaxBytes, log, outbox.WithMaxInflight(cfg.MQTT.MaxInflight))
	if err != nil {
		return fmt.Errorf("opening outbox: %w", err)
	}
	defer box.Close()

	runCtx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()

	if cfg.EmbeddedBroker.Enabled {
		b, err := startEmbeddedBroker(runCtx, cfg, log)
		if err != nil {
			return err
		}
		defer b.Close()
	}

	topics := apiv1.Scheme{Prefix: cfg.MQTT.TopicPrefix, Node: cfg.Node}
	if err := topics.Validate(); err != nil {
		return fmt.Errorf("topic scheme: %w", err)
	}
	rt := cri.NewManager(cri.Config{
		Endpoint:       cfg.Runtime.CRIEndpoint,
		PodLogDir:      cfg.Runtime.PodLogDir,
		PodDir:         filepath.Join(cfg.StateDir, "pods"),
		CgroupRoot:     cfg.Runtime.CgroupRoot,
		PodPidsLimit:   cfg.Pods.PidsLimit,
		RequestTimeout: cfg.Runtime.RequestTimeout.Duration,
		// The runtime re-checks hostPaths on their resolved path and scrubs
		// secret values from what it reports.
		AllowedHostPaths: cfg.Admission.AllowedHostPaths,
		Scrub:            secrets.Current,
		PullParallelism:  cfg.Images.PullParallelism,
		PullTimeout:      cfg.Images.PullTimeout.Duration,
		PullBackoffBase:  cfg.Images.PullBackoffBase.Duration,
		PullBackoffMax:   cfg.Images.PullBackoffMax.Duration,
		NodeCredentials:  cfg.Images.CredentialsFile,
	}, log)
	if m := st.Schema(); m.Migrated() {
		log.Warn().Int("from", m.From).Int("to", m.To).Str("backup", m.Backup).Msg("state store migrated to a new schema; the old store was copied first")
	}
	if m := st.MigratedUIDs(); len(m) > 0 {
		log.Warn().Strs("objects", m).Msg("stored uids that were not UUIDs were replaced; those pods are re-created")
	}
	opts := agentOptions(cfg, topics)
	opts.Live = live
	// A log waits for the broker rather than filling the outbox.
	opts.Logs.Backlog = func() int64 { return box.Stats().Bytes }
	opts.Logs.MaxBacklog = cfg.MQTT.OutboxMaxBytes / 4
	if opts.EventLog, err = eventlog.Open(filepath.Join(cfg.StateDir, "events.jsonl"), cfg.Events.History, log.With().Str("component", "eventlog").Logger()); err != nil {
		return err
	}
	defer opts.EventLog.Close()
	if opts.CommandMarks, err = inflight.Open(filepath.Join(cfg.StateDir, "inflight-command"), 1); err != nil {
		return fmt.Errorf("opening command marks: %w", err)
	}
	defer opts.CommandMarks.Close()
	if opts.SyncMarks, err = inflight.Open(filepath.Join(cfg.StateDir, "inflight-syncs"), max(cfg.Pods.Workers, 1)); err != nil {
		return fmt.Errorf("opening pod sync marks: %w", err)
	}
	defer opts.SyncMarks.Close()
	verifier, nonces, err := verifierFrom(cfg)
	if err != nil {
		return fmt.Errorf("setting up signed commands: %w", err)
	}
	defer nonces.Close()
	log.Info().Str("commands", string(cfg.Security.Commands)).Strs("signedVerbs", cfg.Security.SignedVerbs).Int("trustedKeys", len(cfg.Security.TrustedKeys)).Msg("signed commands")
	opts.Opener = verifier
	opts.ProfilePolicy = func(node validate.Policy, namespace, profile string) validate.Policy {
		return node.LoosenedFor(namespace, validate.Profile(profile))
	}
	// Everything published is scrubbed of the node's secret values.
	out := agent.Scrubbed(box, secrets.Current)
	a := agent.New(opts, st, out, rt, log)

	tlsConfig, err := tlsFor(cfg)
	if err != nil {
		return err
	}
	birth := presence.New(topics.State(), version.Version, st, nil)
	will := birth.Offline()
	var sess *session.Session
	sess, err = session.New(session.Options{
		BrokerURL:     brokerURL(cfg),
		ClientID:      session.ClientID(cfg.Node),
		Username:      cfg.MQTT.Username,
		Password:      cfg.MQTT.Password,
		TLS:           tlsConfig,
		KeepAlive:     cfg.MQTT.KeepAlive.Duration,
		PingTimeout:   cfg.MQTT.PingTimeout.Duration,
		ReconnectMin:  cfg.MQTT.ReconnectMin.Duration,
		ReconnectMax:  cfg.MQTT.ReconnectMax.Duration,
		Will:          &will,
		CommandFilter: topics.CommandFilter(),
		Handler:       a.HandleCommand,
		ManualAck:     true, // the agent acknowledges each command once it is persisted
		MaxInflight:   cfg.MQTT.MaxInflight,
		OnConnect: func(ctx context.Context) error {
			online, err := birth.Online()
			if err != nil {
				return err
			}
			return sess.Publish(ctx, online)
		},
	}, log)
	if err != nil {
		return fmt.Errorf("configuring the MQTT session: %w", err)
	}
	telCfg := telemetryConfig(cfg, topics)
	telCfg.LiveMetrics = telemetry.LiveInterval{Period: func() time.Duration { return live.Duration("metricsInterval") }, Changes: live.Changes}
	tel, err := telemetry.New(runCtx, telCfg, telemetry.Deps{Runtime: rt, Out: out, Events: a.Events(), Counters: telemetry.Counters(a.Counters, box, sess)}, log)
	if err != nil {
		return fmt.Errorf("setting up telemetry: %w", err)
	}

	spawn := func(name string, f func(context.Context) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(runCtx); err != nil && runCtx.Err() == nil {
				log.Error().Err(err).Str("part", name).Msg("stopped unexpectedly")
			}
		}()
	}
	spawn("mqtt", sess.Run)
	spawn("outbox", func(ctx context.Context) error { return box.Run(ctx, sess) })
	spawn("agent", a.Run)
	spawn("telemetry", tel.Run)
	if cfg.Images.PreloadDir != "" {
		pre := cri.NewPreloader(cri.PreloadConfig{Dir: cfg.Images.PreloadDir, Interval: cfg.Images.PreloadInterval.Duration,
			Ctr: cfg.Images.Ctr, Endpoint: cfg.Runtime.CRIEndpoint}, a.Events(), log)
		spawn("preload", pre.Run)
	}
	log.Info().Str("bootId", birth.BootID()).Str("broker", redacted(brokerURL(cfg))).Str("cri", cfg.Runtime.CRIEndpoint).Msg("mqlet running")

	<-ctx.Done()
	log.Info().Msg("stopping: publishing offline state")
	byeCtx, byeCancel := context.WithTimeout(context.Background(), 3*time.Second)
	if err := sess.Publish(byeCtx, birth.Offline()); err != nil {
		log.Warn().Err(err).Msg("could not publish offline state; the broker's will says it")
	}
	byeCancel()
	sess.Disconnect(250 * time.Millisecond)
	cancel()
	wg.Wait()
	log.Info().Msg("mqlet stopped")
	return nil
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

// brokerURL points at the embedded broker when it runs and no other broker
// was configured.
func brokerURL(cfg *config.Config) string {
	if cfg.EmbeddedBroker.Enabled && cfg.MQTT.Broker == config.Default().MQTT.Broker {
		scheme := "tcp"
		if cfg.EmbeddedBroker.CertFile != "" {
			scheme = "ssl"
		}
		return scheme + "://" + cfg.EmbeddedBroker.Listen
	}
	return cfg.MQTT.Broker
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
	}
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

// agentOptions takes the agent's settings from the configuration.
func agentOptions(cfg *config.Config, topics apiv1.Scheme) agent.Options {
	return agent.Options{
		Topics:          topics,
		MaxPayloadBytes: cfg.MQTT.MaxPayloadBytes,
		Policy:          policyFrom(cfg.Admission),
		Workers:         cfg.Pods.Workers,
		Restart:         restart.Policy{Base: cfg.Pods.BackoffBase.Duration, Max: cfg.Pods.BackoffMax.Duration, ResetAfter: cfg.Pods.BackoffResetAfter.Duration},
		ApplyDeadline:   cfg.Pods.ApplyDeadline.Duration,
		PLEGPeriod:      cfg.Runtime.PLEGPeriod.Duration,
		GCInterval:      cfg.GC.Interval.Duration,
		GCPolicy: cri.GCPolicy{
			MinAge:                      cfg.GC.MinDeadAge.Duration,
			MaxPerPodContainer:          cfg.GC.MaxDeadPerContainer,
			ImageGCHighThresholdPercent: cfg.GC.ImageGCHighPercent,
			ImageGCLowThresholdPercent:  max(cfg.GC.ImageGCHighPercent-5, 0),
		},
		PodStatusResync:   cfg.Telemetry.PodStatusResync.Duration,
		HostIPs:           hostIPs(),
		MaxPods:           cfg.Pods.MaxPods,
		LogRotation:       cri.LogRotation{MaxBytes: cfg.Runtime.ContainerLogMaxBytes, MaxFiles: cfg.Runtime.ContainerLogMaxFiles},
		LogRotationPeriod: cfg.Runtime.LogRotationPeriod.Duration,
		MaxReplyBytes:     cfg.Requests.MaxReplyBytes,
		MaxBacklog:        cfg.Requests.MaxBacklog,
		MaxBacklogBytes:   cfg.Requests.MaxBacklogBytes,
		MaxStreams:        cfg.Requests.MaxStreams,
		Logs: intake.LogLimits{MaxChunkBytes: cfg.Logs.MaxChunkBytes, MaxBytes: cfg.Logs.MaxBytes,
			MaxFollow: cfg.Logs.MaxFollow.Duration, BytesPerSecond: cfg.Logs.MaxBytesPerSecond},
		Exec: intake.ExecLimits{Enabled: cfg.Exec.Enabled, DefaultTimeout: cfg.Exec.DefaultTimeout.Duration,
			MaxTimeout: cfg.Exec.MaxTimeout.Duration, MaxOutputBytes: cfg.Exec.MaxOutputBytes},
	}
}

// telemetryConfig takes the node status and metrics settings from the configuration.
func telemetryConfig(cfg *config.Config, topics apiv1.Scheme) telemetry.Config {
	return telemetry.Config{
		Topics: topics, Version: version.Version, StateDir: cfg.StateDir, CgroupRoot: cfg.Runtime.CgroupRoot, RuntimeEndpoint: cfg.Runtime.CRIEndpoint,
		MetricsInterval: cfg.Telemetry.MetricsInterval.Duration, NodeStatusInterval: cfg.Telemetry.NodeStatusInterval.Duration,
		MemoryAvailable: cfg.Telemetry.MemoryAvailable, DiskAvailablePct: cfg.Telemetry.DiskAvailablePct, PIDAvailablePct: cfg.Telemetry.PIDAvailablePct,
		MaxPods: cfg.Pods.MaxPods,
	}
}

// redacted hides a password written into a broker URL.
func redacted(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}

// storeOptions are the desired-state store's settings from cfg: the bounds
// of the request records kept for redeliveries.
func storeOptions(cfg *config.Config) store.Options {
	return store.Options{
		MaxReplies: cfg.Requests.MaxRecords, ReplyTTL: cfg.Requests.TTL.Duration, MaxReplyBytes: cfg.Requests.MaxRecordBytes,
	}
}
