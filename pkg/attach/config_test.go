package attach

import (
	"errors"
	"net"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/portmap-dev/portmap/pkg/backend"
	"github.com/portmap-dev/portmap/pkg/plan"
	"github.com/portmap-dev/portmap/test/fixture"
)

var (
	conf     = fixture.Conf
	mappings = fixture.PortMappings
)

func TestParseConfigDefaults(t *testing.T) {
	c, err := Parse(conf(t, nil), "eth0", backend.IPTables)
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	want := plan.Masquerade{Enabled: true, MarkBit: 13}
	if c.Request.Masquerade != want {
		t.Errorf("masquerade = %+v, want %+v", c.Request.Masquerade, want)
	}
	if c.Backend != backend.IPTables || c.HasMappings || c.PrevResult != nil || len(c.ContainerNets) != 0 {
		t.Errorf("defaults: backend %q, mappings %v, prevResult %v, nets %v", c.Backend, c.HasMappings, c.PrevResult, c.ContainerNets)
	}
	if c.Request.ConditionsV4 != nil || c.Request.ConditionsV6 != nil {
		t.Errorf("conditions = %v / %v, want none", c.Request.ConditionsV4, c.Request.ConditionsV6)
	}
}

func TestParseConfigKeys(t *testing.T) {
	tests := []struct {
		name  string
		extra map[string]string
		check func(*Config) string
	}{
		{"snat false", map[string]string{"snat": "false"}, func(c *Config) string {
			return when(c.Request.Masquerade.Enabled, "masquerading still enabled")
		}},
		{"markMasqBit", map[string]string{"markMasqBit": "5"}, func(c *Config) string {
			return when(c.Request.Masquerade.MarkBit != 5 || c.Request.Masquerade.Mark() != 0x20, "mark bit not 5")
		}},
		{"externalSetMarkChain", map[string]string{"externalSetMarkChain": `"KUBE-MARK-MASQ"`}, func(c *Config) string {
			return when(c.Request.Masquerade.ExternalSetMarkChain != "KUBE-MARK-MASQ", "external chain not kept")
		}},
		{"masqAll", map[string]string{"masqAll": "true"}, func(c *Config) string {
			return when(!c.Request.Masquerade.All, "masqAll not kept")
		}},
		{"localhost default", nil, func(c *Config) string {
			return when(c.Request.Localhost != plan.LocalhostNAT || c.Request.Socket != (plan.Socket{}), "localhost not nat by default")
		}},
		{"localhost socket", map[string]string{"localhost": `"socket"`, "cgroupPath": `"/sys/fs/cgroup/k"`, "bpfPinDir": `"/sys/fs/bpf/x"`}, func(c *Config) string {
			return when(c.Request.Localhost != plan.LocalhostSocket || c.Request.Socket != (plan.Socket{CgroupPath: "/sys/fs/cgroup/k", PinDir: "/sys/fs/bpf/x"}), "socket site not kept")
		}},
		{"localhost auto, the default pin directory named", map[string]string{"localhost": `"auto"`, "bpfPinDir": `"/sys/fs/bpf/cni-portmap"`}, func(c *Config) string {
			return when(c.Request.Localhost != plan.LocalhostAuto || c.Request.Socket != (plan.Socket{}), "auto or the default site not kept")
		}},
		{"backend iptables", map[string]string{"backend": `"iptables"`}, func(c *Config) string {
			return when(c.Backend != "iptables", "backend "+string(c.Backend))
		}},
		{"nft conditions", map[string]string{"backend": `"nftables"`, "conditionsV4": `["ip saddr != 192.0.2.0/24", "iifname \"eth0\""]`}, func(c *Config) string {
			return when(c.Backend != "nftables" || strings.Join(c.Request.ConditionsV4, " ") != `ip saddr != 192.0.2.0/24 iifname "eth0"`, "nft conditions not kept")
		}},
		{"conditions", map[string]string{"conditionsV4": `["!", "-d", "192.0.2.0/24"]`, "conditionsV6": `["-m","comment","--comment","a b"]`}, func(c *Config) string {
			return when(strings.Join(c.Request.ConditionsV4, " ") != "! -d 192.0.2.0/24" ||
				strings.Join(c.Request.ConditionsV6, "|") != "-m|comment|--comment|a b", "conditions not kept")
		}},
		{"empty conditions", map[string]string{"conditionsV4": `[]`, "conditionsV6": `[""]`}, func(c *Config) string {
			return when(c.Request.ConditionsV4 != nil || c.Request.ConditionsV6 != nil, "empty conditions kept")
		}},
		{"mapping defaults", mappings(`[{"hostPort":8080,"containerPort":80}]`), func(c *Config) string {
			m := c.Request.Mappings.Slice()
			return when(!c.HasMappings || len(m) != 1 || m[0].Protocol != plan.TCP || m[0].HostIP != nil ||
				m[0].HostPort != 8080 || m[0].ContainerPort != 80, "bad mapping")
		}},
		{"containerd keys and case", mappings(`[{"HostPort":53,"ContainerPort":5353,"Protocol":"UDP","HostIP":""}]`), func(c *Config) string {
			m := c.Request.Mappings.Slice()
			return when(len(m) != 1 || m[0].Protocol != plan.UDP || m[0].HostPort != 53 || m[0].ContainerPort != 5353 || m[0].HostIP != nil, "bad mapping")
		}},
		{"sctp and hostIP", mappings(`[{"hostPort":1,"containerPort":65535,"protocol":"sctp","hostIP":"2001:db8::1"}]`), func(c *Config) string {
			m := c.Request.Mappings.Slice()
			return when(len(m) != 1 || m[0].Protocol != plan.SCTP || !m[0].HostIP.Equal(net.ParseIP("2001:db8::1")), "bad mapping")
		}},
		{"same port two protocols", mappings(`[{"hostPort":80,"containerPort":80},{"hostPort":80,"containerPort":80,"protocol":"udp"}]`), func(c *Config) string {
			return when(c.Request.Mappings.Len() != 2, "mappings dropped")
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse(conf(t, tt.extra), "eth0", backend.IPTables)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if msg := tt.check(c); msg != "" {
				t.Errorf("%s: %+v", msg, c.Request)
			}
		})
	}
}

func when(bad bool, msg string) string {
	if bad {
		return msg
	}
	return ""
}

func TestParseConfigRejects(t *testing.T) {
	tests := []struct {
		name  string
		extra map[string]string
		code  uint
		msg   string // substring of the error message
	}{
		{"hostPort 0", mappings(`[{"hostPort":0,"containerPort":80}]`), 7, `invalid runtimeConfig.portMappings[0].hostPort 0: must be an integer from 1 to 65535`},
		{"hostPort -1", mappings(`[{"hostPort":-1,"containerPort":80}]`), 7, `hostPort -1:`},
		{"hostPort 65536", mappings(`[{"hostPort":65536,"containerPort":80}]`), 7, `hostPort 65536:`},
		{"hostPort 70000", mappings(`[{"hostPort":70000,"containerPort":80}]`), 7, `hostPort 70000:`},
		{"hostPort string", mappings(`[{"hostPort":"8080","containerPort":80}]`), 7, `hostPort "8080":`},
		{"hostPort float", mappings(`[{"hostPort":80.5,"containerPort":80}]`), 7, `hostPort 80.5:`},
		{"hostPort missing", mappings(`[{"containerPort":80}]`), 7, `hostPort "(missing)": is required`},
		{"containerPort 0", mappings(`[{"hostPort":80,"containerPort":0}]`), 7, `portMappings[0].containerPort 0:`},
		{"containerPort second entry", mappings(`[{"hostPort":80,"containerPort":80},{"hostPort":81,"containerPort":99999}]`), 7, `portMappings[1].containerPort 99999:`},
		{"protocol icmp", mappings(`[{"hostPort":80,"containerPort":80,"protocol":"icmp"}]`), 7, `invalid runtimeConfig.portMappings[0].protocol "icmp": must be "tcp", "udp" or "sctp"`},
		{"protocol injection", mappings(`[{"hostPort":80,"containerPort":80,"protocol":"tcp; drop"}]`), 7, `protocol "tcp; drop"`},
		{"protocol number", mappings(`[{"hostPort":80,"containerPort":80,"protocol":6}]`), 7, `protocol 6: must be a string`},
		{"hostIP garbage", mappings(`[{"hostPort":80,"containerPort":80,"hostIP":"not-an-ip"}]`), 7, `hostIP "not-an-ip": must be an IPv4 or IPv6 address`},
		{"hostIP newline", mappings(`[{"hostPort":80,"containerPort":80,"hostIP":"1.2.3.4\n"}]`), 7, `hostIP "1.2.3.4\n"`},
		{"mapping not object", mappings(`[42]`), 7, `portMappings[0] 42: must be an object`},
		{"conflicting duplicate", mappings(`[{"hostPort":80,"containerPort":80},{"hostPort":80,"containerPort":81}]`), 7, `maps the host port of runtimeConfig.portMappings[0] to another container port`},
		// the first entry that breaks a rule is named, in the order sent
		{"conflict before a bad value", mappings(`[{"hostPort":80,"containerPort":80},{"hostPort":80,"containerPort":81},{"hostPort":0,"containerPort":80}]`), 7, `invalid runtimeConfig.portMappings[1] {"hostPort":80,"containerPort":81}: maps the host port of runtimeConfig.portMappings[0]`},
		{"bad value before a conflict", mappings(`[{"hostPort":80,"containerPort":80},{"hostPort":81,"containerPort":80,"protocol":"icmp"},{"hostPort":80,"containerPort":81}]`), 7, `portMappings[1].protocol "icmp"`},
		{"conflict of a later entry", mappings(`[{"hostPort":80,"containerPort":80},{"hostPort":81,"containerPort":80},{"hostPort":81,"containerPort":82,"protocol":"TCP"}]`), 7, `portMappings[2] {"hostPort":81,"containerPort":82,"protocol":"TCP"}: maps the host port of runtimeConfig.portMappings[1]`},
		{"markMasqBit -1", map[string]string{"markMasqBit": "-1"}, 7, `invalid markMasqBit -1: must be from 0 to 31`},
		{"localhost proxy", map[string]string{"localhost": `"proxy"`}, 7, `invalid localhost "proxy": must be "nat", "socket" or "auto"`},
		{"localhost bool", map[string]string{"localhost": `true`}, 7, `invalid localhost true: must be of type string`},
		{"cgroupPath relative", map[string]string{"cgroupPath": `"sys/fs/cgroup"`}, 7, `invalid cgroupPath "sys/fs/cgroup": must be a clean absolute path`},
		{"bpfPinDir with ..", map[string]string{"bpfPinDir": `"/sys/fs/bpf/../x"`}, 7, `invalid bpfPinDir "/sys/fs/bpf/../x": must be a clean absolute path`},
		{"markMasqBit 32", map[string]string{"markMasqBit": "32"}, 7, `markMasqBit 32:`},
		{"markMasqBit 40", map[string]string{"markMasqBit": "40"}, 7, `markMasqBit 40:`},
		{"markMasqBit string", map[string]string{"markMasqBit": `"13"`}, 7, `invalid markMasqBit "13": must be of type integer`},
		{"snat string", map[string]string{"snat": `"yes"`}, 7, `invalid snat "yes": must be of type boolean`},
		{"markMasqBit with external", map[string]string{"markMasqBit": "13", "externalSetMarkChain": `"KUBE-MARK-MASQ"`}, 7, `cannot be set together with externalSetMarkChain`},
		{"external chain spaces", map[string]string{"externalSetMarkChain": `"KUBE MARK"`}, 7, `invalid externalSetMarkChain "KUBE MARK"`},
		{"external chain newline", map[string]string{"externalSetMarkChain": `"X\n-A INPUT -j ACCEPT"`}, 7, `invalid externalSetMarkChain "X\n-A INPUT -j ACCEPT"`},
		{"external chain -j", map[string]string{"externalSetMarkChain": `"-j"`}, 7, `invalid externalSetMarkChain "-j"`},
		{"external chain too long", map[string]string{"externalSetMarkChain": `"` + strings.Repeat("A", 29) + `"`}, 7, `invalid externalSetMarkChain`},
		{"condition newline", map[string]string{"conditionsV4": `["-d","1.2.3.4\n-A INPUT -j ACCEPT"]`}, 7, `invalid conditionsV4[1] "1.2.3.4\n-A INPUT -j ACCEPT": must not contain control characters`},
		{"condition semicolon", map[string]string{"conditionsV6": `["-d","::1;"]`}, 7, `invalid conditionsV6[1] "::1;"`},
		{"condition second rule", map[string]string{"conditionsV4": `["-d","1.2.3.4","-A","INPUT"]`}, 7, `invalid conditionsV4[2] "-A": is not a match`},
		{"condition target", map[string]string{"conditionsV4": `["-s","1.2.3.4","-j","ACCEPT"]`}, 7, `invalid conditionsV4[2] "-j"`},
		{"condition quote", map[string]string{"conditionsV4": `["-m","comment","--comment","a\"b"]`}, 7, `conditionsV4[3]`},
		{"condition empty token", map[string]string{"conditionsV4": `["-d",""]`}, 7, `conditionsV4[1] "": must not be empty`},
		{"nft conditions on iptables", map[string]string{"conditionsV4": `["ip","daddr","1.2.3.4"]`}, 7, `invalid conditionsV4: the iptables backend is selected but these are nftables options`},
		{"iptables conditions on nftables", map[string]string{"backend": `"nftables"`, "conditionsV6": `["-d","::1"]`}, 7, `invalid conditionsV6: the nftables backend is selected but these are iptables options`},
		{"nft condition statement", map[string]string{"backend": `"nftables"`, "conditionsV4": `["ip saddr 1.2.3.4 drop"]`}, 7, `invalid conditionsV4[0] "ip saddr 1.2.3.4 drop": holds the statement "drop"`},
		{"nft condition semicolon", map[string]string{"backend": `"nftables"`, "conditionsV4": `["ip saddr 1.2.3.4", "; flush ruleset"]`}, 7, `invalid conditionsV4[1]`},
		{"nft condition newline", map[string]string{"backend": `"nftables"`, "conditionsV4": `["ip saddr 1.2.3.4\nadd rule ip t c drop"]`}, 7, `must not contain control characters`},
		{"network name with a newline", map[string]string{"name": `"net\n-A INPUT -j ACCEPT"`}, 7, `invalid name "net\n-A INPUT -j ACCEPT": may hold only`},
		{"network name with a quote", map[string]string{"name": `"a\"b"`}, 7, `invalid name "a\"b"`},
		{"backend bogus", map[string]string{"backend": `"bogus"`}, 7, `invalid backend "bogus": must be "iptables" or "nftables"`},
		{"nftables with iptables options", map[string]string{"backend": `"nftables"`, "externalSetMarkChain": `"KUBE-MARK-MASQ"`}, 7, `invalid externalSetMarkChain: the nftables backend is selected but these are iptables options`},
		{"prevResult bad", map[string]string{"prevResult": `{"ips":[{"address":"bogus"}]}`}, 6, `decode prevResult`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse(conf(t, tt.extra), "eth0", backend.IPTables)
			var te *types.Error
			if !errors.As(err, &te) {
				t.Fatalf("error %v (%T), want *types.Error", err, err)
			}
			if te.Code != tt.code || !strings.Contains(te.Msg, tt.msg) {
				t.Errorf("got code %d %q, want code %d containing %q", te.Code, te.Msg, tt.code, tt.msg)
			}
		})
	}
}

func TestParseConfigContainerNets(t *testing.T) {
	prev := `{"cniVersion":"1.0.0",
	  "interfaces":[{"name":"veth0"},{"name":"eth0","sandbox":"/run/netns/c"},{"name":"eth1","sandbox":"/run/netns/c"}],
	  "ips":[{"address":"203.0.113.9/24","interface":0},
	         {"address":"198.51.100.7/24","interface":2},
	         {"address":"192.0.2.2/24","interface":1},
	         {"address":"192.0.2.3/24","interface":1},
	         {"address":"2001:db8::2/64","interface":1},
	         {"address":"2001:db8::3/64"}]}`
	c, err := Parse(conf(t, map[string]string{"prevResult": prev}), "eth0", backend.IPTables)
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if got := c.ContainerNets[plan.IPv4].String(); got != "192.0.2.2/24" {
		t.Errorf("IPv4 = %s, want 192.0.2.2/24 (first address on eth0)", got)
	}
	if got := c.ContainerNets[plan.IPv6].String(); got != "2001:db8::2/64" {
		t.Errorf("IPv6 = %s, want 2001:db8::2/64", got)
	}
}
