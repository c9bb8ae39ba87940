package attach

import (
	"encoding/json"
	"fmt"
	"net"
	"strconv"

	"github.com/portmap-dev/portmap/pkg/plan"
)

// rawMapping is one entry of runtimeConfig.portMappings as sent: each
// value kept raw, so an error can show it as it was.
type rawMapping struct {
	HostPort      json.RawMessage `json:"hostPort"`
	ContainerPort json.RawMessage `json:"containerPort"`
	Protocol      json.RawMessage `json:"protocol"`
	HostIP        json.RawMessage `json:"hostIP"`
}

// takeMappings takes mappings whose values all have their types and
// pass the checks of parseMappings; false, with nothing taken, when one
// does not (parseMappings then says why).
func (c *Config) takeMappings(typed []typedMapping) bool {
	var ms plan.Mappings
	for _, t := range typed {
		m, ok := plainMapping(t)
		if !ok {
			return false
		}
		ms.Add(m)
	}
	return c.takePlain(ms)
}

// takePlain takes mappings converted by plainMapping, unless a host port
// of them goes to two container ports (parseMappings then says so).
func (c *Config) takePlain(ms plan.Mappings) bool {
	if _, second := conflict(ms); second >= 0 {
		return false
	}
	c.Request.Mappings = ms
	c.HasMappings = ms.Len() > 0
	return true
}

// The rules every decoder holds an entry to, each written once: a port
// from 1 to 65535 (portOK), a protocol and a host IP that parse
// (mappingOf), and no host port (host IP, protocol, port) going to two
// container ports (conflict). The fast decoders ask them and give up on
// a no; parseMappings asks the same and words the no with what was sent.

// portOK reports whether p is a port: from 1 to 65535.
func portOK(p int) bool { return p >= 1 && p <= 65535 }

// plainMapping converts an entry whose values have their types: false
// when one is out of range or does not parse (parseMappings, on the
// slow path, says which).
func plainMapping(t typedMapping) (plan.Mapping, bool) {
	if !portOK(t.HostPort) || !portOK(t.ContainerPort) {
		return plan.Mapping{}, false
	}
	m, bad := mappingOf(t.HostPort, t.ContainerPort, t.Protocol, t.HostIP)
	return m, bad == ""
}

// mappingOf builds a mapping of checked ports; bad names the value that
// does not parse ("protocol", "hostIP"), "" when both do.
func mappingOf(hostPort, containerPort int, proto, hostIP string) (m plan.Mapping, bad string) {
	m = plan.Mapping{HostPort: hostPort, ContainerPort: containerPort}
	var ok bool
	if m.Protocol, ok = plan.ParseProtocol(proto); !ok {
		return m, "protocol"
	}
	if hostIP != "" {
		if m.HostIP = net.ParseIP(hostIP); m.HostIP == nil {
			return m, "hostIP"
		}
		if v4 := m.HostIP.To4(); v4 != nil {
			m.HostIP = v4
		}
	}
	return m, ""
}

// conflict finds the first mapping of ms whose host port an earlier one
// sends to another container port: the indexes of the two, or -1, -1.
// Mappings in ascending order (a Podman range) repeat no host port: that
// is seen on their stretches, without a set.
func conflict(ms plan.Mappings) (first, second int) {
	if ms.Ascending() {
		return -1, -1
	}
	seen := make(map[hostPortKey][2]int, ms.Len()) // index, container port
	i := 0
	for m := range ms.All() {
		hk := hostPortKey{string(m.HostIP), m.Protocol, m.HostPort}
		if f, ok := seen[hk]; ok && f[1] != m.ContainerPort {
			return f[0], i
		} else if !ok {
			seen[hk] = [2]int{i, m.ContainerPort}
		}
		i++
	}
	return -1, -1
}

// parseMappings validates runtimeConfig.portMappings, as sent, into the
// request: ports from 1 to 65535, tcp/udp/sctp in any case, a host IP
// that parses, and no host port mapped to two container ports; an error
// shows the value as it was sent.
func (c *Config) parseMappings(raw json.RawMessage) error {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	var list []json.RawMessage
	if err := json.Unmarshal(raw, &list); err != nil {
		return invalid("runtimeConfig.portMappings", raw, "must be of type array")
	}
	for i, r := range list {
		m, err := entry(i, r)
		if err != nil {
			// an earlier entry's conflict is named first, as sent
			if cerr := conflictError(c.Request.Mappings, list); cerr != nil {
				return cerr
			}
			return err
		}
		c.Request.Mappings.Add(m)
	}
	if err := conflictError(c.Request.Mappings, list); err != nil {
		return err
	}
	c.HasMappings = c.Request.Mappings.Len() > 0
	return nil
}

// entry reads entry i of portMappings, as sent, into a mapping; an error
// names the value that breaks a rule, as it was sent.
func entry(i int, r json.RawMessage) (plan.Mapping, error) {
	key := fmt.Sprintf("runtimeConfig.portMappings[%d]", i)
	var rm rawMapping
	if err := json.Unmarshal(r, &rm); err != nil {
		return plan.Mapping{}, invalid(key, r, "must be an object")
	}
	hostPort, err := parsePort(key+".hostPort", rm.HostPort)
	if err != nil {
		return plan.Mapping{}, err
	}
	containerPort, err := parsePort(key+".containerPort", rm.ContainerPort)
	if err != nil {
		return plan.Mapping{}, err
	}
	proto, err := parseString(key+".protocol", rm.Protocol)
	if err != nil {
		return plan.Mapping{}, err
	}
	hostIP, err := parseString(key+".hostIP", rm.HostIP)
	if err != nil {
		return plan.Mapping{}, err
	}
	m, bad := mappingOf(hostPort, containerPort, proto, hostIP)
	switch bad {
	case "protocol":
		return m, invalid(key+".protocol", proto, `must be "tcp", "udp" or "sctp"`)
	case "hostIP":
		return m, invalid(key+".hostIP", hostIP, "must be an IPv4 or IPv6 address")
	}
	return m, nil
}

// conflictError words conflict's answer for ms, read from list as sent.
func conflictError(ms plan.Mappings, list []json.RawMessage) error {
	first, second := conflict(ms)
	if second < 0 {
		return nil
	}
	return invalid(fmt.Sprintf("runtimeConfig.portMappings[%d]", second), list[second],
		fmt.Sprintf("maps the host port of runtimeConfig.portMappings[%d] to another container port", first))
}

// typedMapping is a portMappings entry whose values have their types.
type typedMapping struct {
	HostPort      int    `json:"hostPort"`
	ContainerPort int    `json:"containerPort"`
	Protocol      string `json:"protocol"`
	HostIP        string `json:"hostIP"`
}

// hostPortKey is what makes two mappings claim the same host port (the
// host IP in its 4- or 16-byte form, as parsed).
type hostPortKey struct {
	hostIP   string
	protocol plan.Protocol
	port     int
}

// parsePort accepts a JSON integer from 1 to 65535.
func parsePort(key string, raw json.RawMessage) (int, error) {
	if raw == nil {
		return 0, invalid(key, "(missing)", "is required")
	}
	n, err := strconv.Atoi(string(raw))
	if err != nil || !portOK(n) {
		return 0, invalid(key, raw, "must be an integer from 1 to 65535")
	}
	return n, nil
}

// parseString accepts a JSON string or null/absent (as "").
func parseString(key string, raw json.RawMessage) (string, error) {
	if raw == nil || string(raw) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", invalid(key, raw, "must be a string")
	}
	return s, nil
}
