package config

import (
	"encoding/json"
	"os"
	"sort"

	"sigs.k8s.io/yaml"
)

// Sources of a setting, lowest precedence first.
const (
	SourceDefault = "default"
	SourceFile    = "file"
	SourceEnv     = "env"
	SourceFlag    = "flag"
)

// flagPaths is the setting each override flag (and its environment
// variable) sets.
var flagPaths = map[string]string{
	"node": "node", "groups": "groups", "broker": "mqtt.broker", "state-dir": "stateDir", "cri-endpoint": "runtime.criEndpoint",
	"log-level": "logLevel", "metrics-interval": "telemetry.metricsInterval", "node-status-interval": "telemetry.nodeStatusInterval",
	"embedded-broker": "embeddedBroker.enabled", "embedded-broker-listen": "embeddedBroker.listen",
}

// Sources says where each setting given other than by default came from
// (dotted paths as in the file, e.g. "telemetry.metricsInterval").
func Sources(f *Flags, getenv func(string) string) map[string]string {
	out := map[string]string{}
	if f.ConfigFile != "" {
		if data, err := os.ReadFile(f.ConfigFile); err == nil {
			var doc map[string]any
			if yaml.Unmarshal(data, &doc) == nil {
				for _, p := range Flatten(doc, "") {
					out[p] = SourceFile
				}
			}
		}
	}
	for _, k := range flagKeys {
		if getenv("MQLET_"+k.env) != "" {
			out[flagPaths[k.flag]] = SourceEnv
		}
		if _, ok := f.set[k.flag]; ok {
			out[flagPaths[k.flag]] = SourceFlag
		}
	}
	if getenv("MQLET_MQTT_USERNAME") != "" {
		out["mqtt.username"] = SourceEnv
	}
	return out
}

// Flatten lists the dotted paths of the leaves of doc (objects are walked;
// lists and scalars are leaves), sorted.
func Flatten(doc map[string]any, prefix string) []string {
	var out []string
	for k, v := range doc {
		p := k
		if prefix != "" {
			p = prefix + "." + k
		}
		if m, ok := v.(map[string]any); ok && len(m) > 0 {
			out = append(out, Flatten(m, p)...)
			continue
		}
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}

// Leaves returns every setting of c by dotted path, as JSON values.
func (c *Config) Leaves() (map[string]json.RawMessage, error) {
	b, err := json.Marshal(c)
	if err != nil {
		return nil, err
	}
	var doc map[string]any
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, err
	}
	out := map[string]json.RawMessage{}
	var walk func(m map[string]any, prefix string) error
	walk = func(m map[string]any, prefix string) error {
		for k, v := range m {
			p := k
			if prefix != "" {
				p = prefix + "." + k
			}
			if sub, ok := v.(map[string]any); ok && len(sub) > 0 && p != "admission.namespaces" {
				if err := walk(sub, p); err != nil {
					return err
				}
				continue
			}
			raw, err := json.Marshal(v)
			if err != nil {
				return err
			}
			out[p] = raw
		}
		return nil
	}
	return out, walk(doc, "")
}
