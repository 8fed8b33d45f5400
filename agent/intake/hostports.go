package intake

import (
	"fmt"
	"slices"

	v1 "k8s.io/api/core/v1"
	apiruntime "k8s.io/apimachinery/pkg/runtime"

	"github.com/mqlet/mqlet/agent/store"
)

// ReasonHostPortConflict is the kubelet's word for a hostPort another pod
// holds.
const ReasonHostPortConflict = "HostPortConflict"

// hostPort is one hostPort a pod asks for.
type hostPort struct {
	protocol v1.Protocol
	ip       string // "" or 0.0.0.0: every address
	port     int32
}

func (a hostPort) overlaps(b hostPort) bool {
	wild := func(ip string) bool { return ip == "" || ip == "0.0.0.0" || ip == "::" }
	return a.protocol == b.protocol && a.port == b.port && (wild(a.ip) || wild(b.ip) || a.ip == b.ip)
}

func podHostPorts(p *v1.Pod) []hostPort {
	var out []hostPort
	for _, c := range slices.Concat(p.Spec.InitContainers, p.Spec.Containers) {
		for _, cp := range c.Ports {
			port := cp.HostPort
			if port == 0 && p.Spec.HostNetwork {
				port = cp.ContainerPort
			}
			if port == 0 {
				continue
			}
			proto := cp.Protocol
			if proto == "" {
				proto = v1.ProtocolTCP
			}
			out = append(out, hostPort{protocol: proto, ip: cp.HostIP, port: port})
		}
	}
	return out
}

// checkHostPorts refuses a command whose pods ask for a hostPort another
// desired pod holds (the kubelet's NodePorts admission). Port mappings are
// DNAT rules: the first pod's rule wins until its sandbox is made again,
// and then the newcomer takes the other pod's clients and their data.
func (in *Intake) checkHostPorts(id string, objs []apiruntime.Object, replaceAll bool) error {
	var incoming []*v1.Pod
	named := map[string]bool{}
	for _, o := range objs {
		if p, ok := o.(*v1.Pod); ok && len(podHostPorts(p)) > 0 {
			incoming = append(incoming, p)
		}
		if p, ok := o.(*v1.Pod); ok {
			named[store.Key(p.Namespace, p.Name)] = true
		}
	}
	if len(incoming) == 0 {
		return nil
	}
	holders := map[string][]hostPort{}
	if !replaceAll { // sync keeps only the pods it names
		stored, err := in.store.ListPods()
		if err != nil {
			return fmt.Errorf("reading stored pods to check host ports: %w", err)
		}
		for _, p := range stored {
			if key := store.Key(p.Namespace, p.Name); !named[key] {
				holders[key] = podHostPorts(p)
			}
		}
	}
	for _, p := range incoming {
		key := store.Key(p.Namespace, p.Name)
		for _, want := range podHostPorts(p) {
			for _, other := range sortedHolders(holders) {
				if other == key {
					continue
				}
				for _, held := range holders[other] {
					if want.overlaps(held) {
						msg := fmt.Sprintf("hostPort %d/%s of pod %s is held by pod %s", want.port, want.protocol, key, other)
						in.events.Event(p, v1.EventTypeWarning, ReasonHostPortConflict, msg)
						return fmt.Errorf("%s: %s; nothing applied", ReasonHostPortConflict, msg)
					}
				}
			}
		}
		holders[key] = podHostPorts(p)
	}
	return nil
}

func sortedHolders(m map[string][]hostPort) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
