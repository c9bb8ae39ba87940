package portmap

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

// parseMappings validates runtimeConfig.portMappings into the request:
// ports from 1 to 65535, tcp/udp/sctp in any case, a host IP that parses,
// and no host port mapped to two container ports.
func (c *Config) parseMappings(raw []json.RawMessage) error {
	seen := make(map[hostPortKey]int, len(raw)) // host port -> first mapping's index
	for i, r := range raw {
		key := fmt.Sprintf("runtimeConfig.portMappings[%d]", i)
		var rm rawMapping
		if err := json.Unmarshal(r, &rm); err != nil {
			return invalid(key, json.RawMessage(r), "must be an object")
		}
		var m plan.Mapping
		var err error
		if m.HostPort, err = parsePort(key+".hostPort", rm.HostPort); err != nil {
			return err
		}
		if m.ContainerPort, err = parsePort(key+".containerPort", rm.ContainerPort); err != nil {
			return err
		}
		proto, err := parseString(key+".protocol", rm.Protocol)
		if err != nil {
			return err
		}
		var ok bool
		if m.Protocol, ok = plan.ParseProtocol(proto); !ok {
			return invalid(key+".protocol", proto, `must be "tcp", "udp" or "sctp"`)
		}
		hostIP, err := parseString(key+".hostIP", rm.HostIP)
		if err != nil {
			return err
		}
		if hostIP != "" {
			if m.HostIP = net.ParseIP(hostIP); m.HostIP == nil {
				return invalid(key+".hostIP", hostIP, "must be an IPv4 or IPv6 address")
			}
			if v4 := m.HostIP.To4(); v4 != nil {
				m.HostIP = v4
			}
		}
		hk := hostPortKey{string(m.HostIP), m.Protocol, m.HostPort}
		if j, ok := seen[hk]; ok && c.Request.Mappings[j].ContainerPort != m.ContainerPort {
			return invalid(key, json.RawMessage(r), fmt.Sprintf("maps the host port of runtimeConfig.portMappings[%d] to another container port", j))
		} else if !ok {
			seen[hk] = len(c.Request.Mappings)
		}
		c.Request.Mappings = append(c.Request.Mappings, m)
	}
	c.HasMappings = len(c.Request.Mappings) > 0
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
