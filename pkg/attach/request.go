package attach

// Reading a request: the bytes from a reader, the plain shape decoded
// by hand where it can be (requestjson.go), else by encoding/json, whose
// type errors are worded with the key and the value sent.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/utils"

	"github.com/portmap-dev/portmap/pkg/backend"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// Read reads a request from r and parses it as Parse does. When it
// fails, it returns the request as it came, for what reads it next (skel,
// in its checks).
func Read(r io.Reader, ifName string, defaultBackend backend.Name) (*Config, []byte, error) {
	// memory reserved once, untouched but for what the request takes: a
	// request of up to readRoom is read without a copy
	buf := bytes.NewBuffer(make([]byte, 0, readRoom))
	if _, err := buf.ReadFrom(r); err != nil {
		return nil, buf.Bytes(), fmt.Errorf("read the request: %w", err)
	}
	c, err := Parse(buf.Bytes(), ifName, defaultBackend)
	if err != nil {
		return nil, buf.Bytes(), err
	}
	return c, nil, nil
}

// readRoom is the capacity Read reserves for a request.
const readRoom = 1 << 20

// Parse parses stdin for the attachment's interface ifName;
// defaultBackend is used when "backend" is absent. Every error is a
// *types.Error: code 6 for undecodable input, 7 for invalid values.
func Parse(stdin []byte, ifName string, defaultBackend backend.Name) (*Config, error) {
	// The plain shape without encoding/json reading the mappings
	// (decodeFast), else encoding/json (decodeSlow).
	nc, plain, fast := decodeFast(stdin)
	var typed *typedMappings
	if !fast {
		var err error
		if nc, typed, err = decodeSlow(stdin); err != nil {
			return nil, err
		}
	}
	// skel checked the name already; names end up in rule comments, so
	// check again where the rendering relies on it.
	if err := utils.ValidateNetworkName(nc.Name); err != nil {
		return nil, invalid("name", nc.Name, "may hold only letters, digits, '_', '.' and '-', starting with a letter or digit")
	}
	c := &Config{
		CNIVersion:    nc.CNIVersion,
		Network:       nc.Name,
		Backend:       defaultBackend,
		ContainerNets: map[plan.Family]*net.IPNet{},
	}
	// In the order the keys are judged: the first invalid one is named.
	for _, step := range []func(netConf) error{c.parseNode, c.parseMasquerade, c.parseLocalhost, c.parseConditions} {
		if err := step(nc); err != nil {
			return nil, err
		}
	}
	taken := (fast && c.takePlain(plain)) || (typed != nil && c.takeMappings(*typed))
	if !taken {
		if fast || typed != nil { // read again, as sent, for the error
			if err := json.Unmarshal(stdin, &nc); err != nil {
				return nil, types.NewError(types.ErrDecodingFailure, fmt.Sprintf("decode network configuration: %v", err), "")
			}
		}
		if err := c.parseMappings(nc.RuntimeConfig.PortMappings); err != nil {
			return nil, err
		}
	}
	if err := c.parsePrevResult(nc, ifName); err != nil {
		return nil, err
	}
	return c, nil
}

// decodeSlow reads stdin with encoding/json: in one pass when every value
// has its type (typed is then set); else with the values kept as sent,
// so that an error can show them.
func decodeSlow(stdin []byte) (nc netConf, typed *typedMappings, err error) {
	var tc typedConf
	if err := json.Unmarshal(stdin, &tc); err == nil {
		return tc.netConf, &tc.RuntimeConfig.PortMappings, nil
	}
	if err := json.Unmarshal(stdin, &nc); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return nc, nil, invalid(te.Field, rawValue(stdin, te.Field, te.Value), "must be of type "+jsonType(te.Type.Kind().String()))
		}
		return nc, nil, types.NewError(types.ErrDecodingFailure, fmt.Sprintf("decode network configuration: %v", err), "")
	}
	return nc, nil, nil
}

// rawValue finds the JSON text of a mistyped key so the error can show it;
// it falls back to the JSON type name encoding/json reported.
func rawValue(stdin []byte, field, jsonKind string) any {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(stdin, &top); err == nil {
		for k, v := range top {
			if strings.EqualFold(k, field) {
				return json.RawMessage(v)
			}
		}
	}
	return jsonKind
}

func jsonType(kind string) string {
	switch kind {
	case "int", "int64":
		return "integer"
	case "bool":
		return "boolean"
	case "slice":
		return "array"
	case "struct", "map":
		return "object"
	}
	return kind
}
