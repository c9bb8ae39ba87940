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
		for j, prev := range c.Request.Mappings {
			if sameHostPort(prev, m) && prev.ContainerPort != m.ContainerPort {
				return invalid(key, json.RawMessage(r), fmt.Sprintf("maps the host port of runtimeConfig.portMappings[%d] to another container port", j))
			}
		}
		c.Request.Mappings = append(c.Request.Mappings, m)
	}
	c.HasMappings = len(c.Request.Mappings) > 0
	return nil
}

func sameHostPort(a, b plan.Mapping) bool {
	return a.HostPort == b.HostPort && a.Protocol == b.Protocol && a.HostIP.Equal(b.HostIP)
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
