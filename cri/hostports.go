package cri

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
)

// A hostPort is a DNAT rule in front of the host's own sockets: a pod
// asking for a port a host service listens on would take that service's
// traffic. Before a sandbox with port mappings is created, every hostPort
// is checked against the host's listening sockets (the runtime runs in the
// host network namespace, so /proc/net is the host's).

// procNet is where the socket tables are read; a field so tests can point
// it elsewhere.
type procNet string

const hostProcNet procNet = "/proc/net"

// listening returns the local ports with a listening TCP socket or a bound
// UDP socket, per protocol ("TCP", "UDP").
func (p procNet) listening() (map[string]map[int32]bool, error) {
	out := map[string]map[int32]bool{"TCP": {}, "UDP": {}}
	for _, t := range []struct{ file, proto, state string }{
		{"tcp", "TCP", "0A"}, {"tcp6", "TCP", "0A"}, // LISTEN
		{"udp", "UDP", ""}, {"udp6", "UDP", ""}, // any bound socket
	} {
		if err := readSocketTable(string(p)+"/"+t.file, t.state, out[t.proto]); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// readSocketTable adds the local ports of the table's sockets in state
// (any state when "") to ports. A missing table (no IPv6) is no error.
func readSocketTable(file, state string, ports map[int32]bool) error {
	f, err := os.Open(file)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read host sockets: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Scan() // header
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 4 {
			continue
		}
		if state != "" && fields[3] != state {
			continue
		}
		_, portHex, ok := strings.Cut(fields[1], ":")
		if !ok {
			continue
		}
		port, err := strconv.ParseUint(portHex, 16, 16)
		if err != nil || port == 0 {
			continue
		}
		ports[int32(port)] = true
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read host sockets %s: %w", file, err)
	}
	return nil
}

// HostPortInUseError says which hostPort a host process already holds.
type HostPortInUseError struct {
	Port     int32
	Protocol string
}

func (e *HostPortInUseError) Error() string {
	return fmt.Sprintf("hostPort %d/%s is already in use by a process on the node", e.Port, e.Protocol)
}

// checkHostPorts refuses the pod's hostPorts that a host socket holds.
func checkHostPorts(pod *v1.Pod, table procNet) error {
	if pod.Spec.HostNetwork {
		return nil // no mappings: the containers bind the host's ports themselves
	}
	ports := sandboxPorts(pod)
	if len(ports) == 0 {
		return nil
	}
	used, err := table.listening()
	if err != nil {
		return err
	}
	for _, p := range ports {
		if p.HostPort == 0 {
			continue
		}
		proto := string(p.Protocol)
		if proto == "" {
			proto = string(v1.ProtocolTCP)
		}
		if used[proto][p.HostPort] {
			return &HostPortInUseError{Port: p.HostPort, Protocol: proto}
		}
	}
	return nil
}
