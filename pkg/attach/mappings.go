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
	if !oneContainerPortEach(ms) {
		return false
	}
	c.Request.Mappings = ms
	c.HasMappings = ms.Len() > 0
	return true
}

// plainMapping converts an entry whose values have their types: false
// when one is out of range or does not parse (parseMappings, on the
// slow path, says which).
func plainMapping(t typedMapping) (plan.Mapping, bool) {
	if t.HostPort < 1 || t.HostPort > 65535 || t.ContainerPort < 1 || t.ContainerPort > 65535 {
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

// oneContainerPortEach reports whether no host port (host IP, protocol,
// port) of ms goes to two container ports. Mappings in ascending order
// (a Podman range) repeat none: that is checked on their stretches,
// without a set.
func oneContainerPortEach(ms plan.Mappings) bool {
	if ms.Ascending() {
		return true
	}
	first := make(map[hostPortKey]int, ms.Len())
	for m := range ms.All() {
		hk := hostPortKey{string(m.HostIP), m.Protocol, m.HostPort}
		if cp, ok := first[hk]; ok && cp != m.ContainerPort {
			return false
		} else if !ok {
			first[hk] = m.ContainerPort
		}
	}
	return true
}

// firstOf is, while the mappings are read, the first mapping of each
// host port: its index and container port.
type firstOf map[hostPortKey][2]int

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
	seen := make(firstOf, len(list))
	for i, r := range list {
		key := func() string { return fmt.Sprintf("runtimeConfig.portMappings[%d]", i) }
		var rm rawMapping
		if err := json.Unmarshal(r, &rm); err != nil {
			return invalid(key(), r, "must be an object")
		}
		hostPort, err := parsePort(key()+".hostPort", rm.HostPort)
		if err != nil {
			return err
		}
		containerPort, err := parsePort(key()+".containerPort", rm.ContainerPort)
		if err != nil {
			return err
		}
		proto, err := parseString(key()+".protocol", rm.Protocol)
		if err != nil {
			return err
		}
		hostIP, err := parseString(key()+".hostIP", rm.HostIP)
		if err != nil {
			return err
		}
		if err := c.addMapping(seen, hostPort, containerPort, proto, hostIP, &mappingText{key(), r}); err != nil {
			return err
		}
	}
	c.HasMappings = c.Request.Mappings.Len() > 0
	return nil
}

// typedMapping is a portMappings entry whose values have their types.
type typedMapping struct {
	HostPort      int    `json:"hostPort"`
	ContainerPort int    `json:"containerPort"`
	Protocol      string `json:"protocol"`
	HostIP        string `json:"hostIP"`
}

// mappingText is an entry as sent and its key, for errors.
type mappingText struct {
	key string
	raw json.RawMessage
}

// addMapping checks one entry's values, as sent (errors name it), and
// appends it; seen finds a host port mapped to two container ports.
func (c *Config) addMapping(seen firstOf, hostPort, containerPort int, proto, hostIP string, sent *mappingText) error {
	m, bad := mappingOf(hostPort, containerPort, proto, hostIP)
	switch bad {
	case "protocol":
		return invalid(sent.key+".protocol", proto, `must be "tcp", "udp" or "sctp"`)
	case "hostIP":
		return invalid(sent.key+".hostIP", hostIP, "must be an IPv4 or IPv6 address")
	}
	hk := hostPortKey{string(m.HostIP), m.Protocol, m.HostPort}
	if first, ok := seen[hk]; ok && first[1] != m.ContainerPort {
		return invalid(sent.key, sent.raw, fmt.Sprintf("maps the host port of runtimeConfig.portMappings[%d] to another container port", first[0]))
	} else if !ok {
		seen[hk] = [2]int{c.Request.Mappings.Len(), m.ContainerPort}
	}
	c.Request.Mappings.Add(m)
	return nil
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
	if err != nil || n < 1 || n > 65535 {
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
