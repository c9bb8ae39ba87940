package attach

import (
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/portmap-dev/portmap/pkg/backend"
	"github.com/portmap-dev/portmap/pkg/cnicache"
	"github.com/portmap-dev/portmap/pkg/plan"
)

// ConflictPolicy is a value of the "hostPortConflict" key.
type ConflictPolicy string

// The host-port conflict policies.
const (
	ConflictReplace ConflictPolicy = "replace" // the newest ADD of a host port wins
	ConflictReject  ConflictPolicy = "reject"  // ADD fails when another attachment or a host process has it
)

// DefaultMarkBit is the mark bit used for masquerading when markMasqBit is
// not set. Kubernetes uses 14 and 15, Calico 20-31.
const DefaultMarkBit = 13

// Config is a parsed and validated plugin configuration.
type Config struct {
	CNIVersion string
	Network    string
	// Backend is the configured backend, or the default the caller passed
	// when "backend" is absent.
	Backend backend.Name
	Request plan.Request
	// HasMappings is false when runtimeConfig.portMappings is absent or
	// empty.
	HasMappings bool
	// Conflict is the host-port conflict policy.
	Conflict ConflictPolicy
	// CacheDir is libcni's cache directory, where STATUS looks for
	// attachments ("cniCacheDir"; default /var/lib/cni).
	CacheDir string
	// PrevResult is the previous plugin's result, nil when absent.
	PrevResult types.Result
	// ContainerNets holds the container's first address of each family on
	// CNI_IFNAME, from prevResult.
	ContainerNets map[plan.Family]*net.IPNet
}

// typedConf is netConf with its mappings' values typed.
type typedConf struct {
	netConf
	RuntimeConfig struct {
		PortMappings typedMappings `json:"portMappings"`
	} `json:"runtimeConfig"`
}

// netConf is the JSON shape of the configuration, drop-in compatible with the
// upstream plugin. encoding/json matches keys case-insensitively, which
// covers containerd's HostPort/ContainerPort/Protocol/HostIP.
type netConf struct {
	types.PluginConf
	Backend              *string   `json:"backend"`
	SNAT                 *bool     `json:"snat"`
	MarkMasqBit          *int      `json:"markMasqBit"`
	ExternalSetMarkChain *string   `json:"externalSetMarkChain"`
	ConditionsV4         *[]string `json:"conditionsV4"`
	ConditionsV6         *[]string `json:"conditionsV6"`
	MasqAll              bool      `json:"masqAll"`
	HostPortConflict     *string   `json:"hostPortConflict"`
	ForwardAccept        bool      `json:"forwardAccept"`
	Localhost            *string   `json:"localhost"`
	CgroupPath           *string   `json:"cgroupPath"`
	BPFPinDir            *string   `json:"bpfPinDir"`
	CNICacheDir          *string   `json:"cniCacheDir"`
	RuntimeConfig        struct {
		PortMappings json.RawMessage `json:"portMappings"`
	} `json:"runtimeConfig"`
}

// invalid is a code-7 error naming the key and the value.
func invalid(key string, value any, why string) *types.Error {
	return types.NewError(types.ErrInvalidNetworkConfig,
		fmt.Sprintf("invalid %s %s: %s", key, formatValue(value), why), "")
}

func formatValue(v any) string {
	switch v := v.(type) {
	case string:
		return strconv.Quote(v)
	case json.RawMessage:
		return string(v)
	default:
		return fmt.Sprint(v)
	}
}

// parseNode reads what the node keeps for the attachment: libcni's
// cache directory, the host-port conflict policy, the backend.
func (c *Config) parseNode(nc netConf) error {
	c.CacheDir = cnicache.DefaultDir
	if nc.CNICacheDir != nil {
		if !cleanAbs(*nc.CNICacheDir) {
			return invalid("cniCacheDir", *nc.CNICacheDir, "must be a clean absolute path")
		}
		c.CacheDir = *nc.CNICacheDir
	}
	c.Conflict = ConflictReplace
	if nc.HostPortConflict != nil {
		switch p := ConflictPolicy(*nc.HostPortConflict); p {
		case ConflictReplace, ConflictReject:
			c.Conflict = p
		default:
			return invalid("hostPortConflict", *nc.HostPortConflict, `must be "replace" or "reject"`)
		}
	}
	if nc.Backend != nil {
		k, ok := backend.Lookup(backend.Name(*nc.Backend))
		if !ok {
			return invalid("backend", *nc.Backend, "must be "+backend.Choices())
		}
		c.Backend = k.Name
	}
	return nil
}

// parseMasquerade reads how hairpin and localhost connections are
// marked for SNAT, and forwardAccept.
func (c *Config) parseMasquerade(nc netConf) error {
	m := plan.Masquerade{Enabled: nc.SNAT == nil || *nc.SNAT, MarkBit: DefaultMarkBit, All: nc.MasqAll}
	if nc.MarkMasqBit != nil && nc.ExternalSetMarkChain != nil {
		return invalid("markMasqBit", *nc.MarkMasqBit, "cannot be set together with externalSetMarkChain")
	}
	if nc.MarkMasqBit != nil {
		if *nc.MarkMasqBit < 0 || *nc.MarkMasqBit > 31 {
			return invalid("markMasqBit", *nc.MarkMasqBit, "must be from 0 to 31")
		}
		m.MarkBit = *nc.MarkMasqBit
	}
	if nc.ExternalSetMarkChain != nil {
		if !chainName().MatchString(*nc.ExternalSetMarkChain) {
			return invalid("externalSetMarkChain", *nc.ExternalSetMarkChain,
				"must be an iptables chain name: 1 to 28 letters, digits, '_', '.' or '-', not starting with '-'")
		}
		m.ExternalSetMarkChain = *nc.ExternalSetMarkChain
	}
	c.Request.Masquerade = m
	c.Request.ForwardAccept = nc.ForwardAccept
	return nil
}

// parsePrevResult reads the previous plugin's result and the container's
// addresses on ifName.
func (c *Config) parsePrevResult(nc netConf, ifName string) error {
	if nc.RawPrevResult == nil {
		return nil
	}
	if err := version.ParsePrevResult(&nc.PluginConf); err != nil {
		return types.NewError(types.ErrDecodingFailure, fmt.Sprintf("decode prevResult: %v", err), "")
	}
	c.PrevResult = nc.PrevResult
	res, err := current.NewResultFromResult(nc.PrevResult)
	if err != nil {
		return types.NewError(types.ErrDecodingFailure, fmt.Sprintf("convert prevResult: %v", err), "")
	}
	c.ContainerNets = containerNets(res, ifName)
	return nil
}

// parseLocalhost reads "localhost" and where the socket path lives.
func (c *Config) parseLocalhost(nc netConf) error {
	c.Request.Localhost = plan.LocalhostNAT
	if nc.Localhost != nil {
		switch l := plan.Localhost(*nc.Localhost); l {
		case plan.LocalhostNAT, plan.LocalhostSocket, plan.LocalhostAuto:
			c.Request.Localhost = l
		default:
			return invalid("localhost", *nc.Localhost, `must be "nat", "socket" or "auto"`)
		}
	}
	for _, kv := range []struct {
		key string
		v   *string
		to  *string
	}{{"cgroupPath", nc.CgroupPath, &c.Request.Socket.CgroupPath}, {"bpfPinDir", nc.BPFPinDir, &c.Request.Socket.PinDir}} {
		if kv.v == nil {
			continue
		}
		if !cleanAbs(*kv.v) {
			return invalid(kv.key, *kv.v, "must be a clean absolute path")
		}
		*kv.to = *kv.v
	}
	backend.Normalize(&c.Request) // one name for each site
	return nil
}

// cleanAbs reports whether path is absolute, clean and without control
// characters.
func cleanAbs(path string) bool {
	return filepath.IsAbs(path) && filepath.Clean(path) == path && !plan.HasControl(path)
}

// chainName is what iptables accepts as a user chain name.
var chainName = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9_.][A-Za-z0-9_.-]{0,27}$`) })

// parseConditions validates conditionsV4/V6 for the selected backend.
// Conditions are match tokens of one rule; nothing in them may end that
// rule or start another one. Like upstream, a list whose first token starts
// with '-' or '!' is iptables syntax, anything else nftables syntax.
func (c *Config) parseConditions(nc netConf) error {
	conds := []struct {
		key string
		val *[]string
		dst *[]string
	}{
		{"conditionsV4", nc.ConditionsV4, &c.Request.ConditionsV4},
		{"conditionsV6", nc.ConditionsV6, &c.Request.ConditionsV6},
	}
	var wrong []string
	if c.Backend == backend.NFTables && nc.ExternalSetMarkChain != nil {
		wrong = append(wrong, "externalSetMarkChain")
	}
	for _, cd := range conds {
		if cd.val == nil || len(*cd.val) == 0 || (len(*cd.val) == 1 && (*cd.val)[0] == "") {
			continue
		}
		tokens := *cd.val
		syntax := backend.NFTables
		if first := tokens[0]; first != "" && (first[0] == '-' || first[0] == '!') {
			syntax = backend.IPTables
		}
		if syntax != c.Backend {
			wrong = append(wrong, cd.key)
			continue
		}
		k, _ := backend.Lookup(syntax)
		bad := k.BadConditionToken
		for i, tok := range tokens {
			if why := bad(tok); why != "" {
				return invalid(fmt.Sprintf("%s[%d]", cd.key, i), tok, why)
			}
		}
		*cd.dst = append([]string(nil), tokens...)
	}
	if len(wrong) > 0 {
		other := backend.NFTables
		if c.Backend == backend.NFTables {
			other = backend.IPTables
		}
		hint := ""
		if strings.Contains(strings.Join(wrong, ","), "conditions") {
			hint = " (iptables conditions start with '-' or '!')"
		}
		return types.NewError(types.ErrInvalidNetworkConfig,
			fmt.Sprintf("invalid %s: the %s backend is selected but these are %s options%s",
				strings.Join(wrong, ", "), c.Backend, other, hint), "")
	}
	return nil
}

// containerNets picks the first address of each family on the sandbox
// interface ifName, skipping addresses of other interfaces.
func containerNets(res *current.Result, ifName string) map[plan.Family]*net.IPNet {
	out := map[plan.Family]*net.IPNet{}
	for _, ip := range res.IPs {
		if ip.Interface != nil {
			i := *ip.Interface
			if i >= 0 && i < len(res.Interfaces) &&
				(res.Interfaces[i].Name != ifName || res.Interfaces[i].Sandbox == "") {
				continue
			}
		}
		f := plan.FamilyOf(ip.Address.IP)
		if out[f] != nil {
			continue
		}
		n := ip.Address
		if f == plan.IPv4 {
			n.IP = n.IP.To4()
		}
		out[f] = &n
	}
	return out
}
