package attach

import (
	"reflect"
	"strings"
	"testing"

	"github.com/portmap-dev/portmap/pkg/plan"
)

// requests are the shapes decodeFast must read as encoding/json does, or
// refuse.
var requests = []string{
	`{"cniVersion":"1.0.0","name":"n","type":"portmap"}`,
	`{"name":"n","runtimeConfig":{"portMappings":[{"hostPort":80,"containerPort":8080,"protocol":"udp","hostIP":"::"}]}}`,
	`{"name":"n","runtimeConfig":{"portMappings":[]}}`,
	`{"name":"n","runtimeConfig":{"portMappings":null}}`,
	`{"name":"n","runtimeConfig":null}`,
	`{"name":"n","runtimeConfig":{"bandwidth":{"a":[1,2,{"b":"\u00e9\n"}]},"portMappings":[{"HostPort":80,"ContainerPort":80}]}}`,
	`{"name":"n","RUNTIMECONFIG":{"PortMappings":[{"hostPort":80,"containerPort":80,"protocol":null}]},"prevResult":{"ips":[{"address":"192.0.2.2/24"}]}}`,
	` { "name" : "n" , "runtimeConfig" : { "portMappings" : [ { "hostPort" : 80 , "containerPort" : 80 } ] } } `,
	`{"name":"n","runtimeConfig":{"portMappings":[{"hostPort":80,"containerPort":80}]},"runtimeConfig":{}}`, // twice: refused
	`{"name":"n","runtimeConfig":{"portMappings":[],"portMappings":[]}}`,                                    // twice: refused
	`{"name":"n","runtime\u0043onfig":{"portMappings":[{"hostPort":80,"containerPort":80}]}}`,               // escaped key: refused
	`{"name":"n","runtimeConfig":{"portMappings":[{"hostPort":080,"containerPort":80}]}}`,                   // invalid JSON
	`{"name":"n","runtimeConfig":{"portMappings":[{"hostPort":80,"containerPort":80,"x":1.5e+3}]}}`,
	`{"name":"n","runtimeConfig":{"portMappings":[{"hostPort":80,"containerPort":80,"x":1.}]}}`, // invalid JSON
	`{"name":"n","runtimeConfig":{"portMappings":[{"hostPort":80.0,"containerPort":80}]}}`,
	`{"name":"n","snat":"yes","runtimeConfig":{"portMappings":[{"hostPort":80,"containerPort":80}]}}`, // a type error elsewhere
	`{"name":"n","runtimeConfig":{"portMappings":[{"hostPort":80,"containerPort":80}]}`,               // cut short
	`{"name":"n","runtimeConfig":{"portMappings":[{"hostPort":80,"containerPort":80}]}} x`,
	`{"name":"n","a":"\x01","runtimeConfig":{"portMappings":[]}}`,
	`{"name":"n","a":"\q","runtimeConfig":{"portMappings":[]}}`,
	`{"name":"n","a":tru,"runtimeConfig":{"portMappings":[]}}`,
	`{"name":"n","a":[1,,2],"runtimeConfig":{"portMappings":[]}}`,
}

// diffDecode checks that decodeFast reads b as decodeSlow does, where it
// reads it at all, and refuses what encoding/json refuses.
func diffDecode(t *testing.T, b []byte) (fast bool) {
	t.Helper()
	fnc, fms, ok := decodeFast(b)
	snc, styped, err := decodeSlow(b)
	if !ok {
		return false
	}
	if err != nil || styped == nil {
		t.Fatalf("decodeFast read %q, which encoding/json refuses or reads the slow way: %v", b, err)
	}
	var sms []plan.Mapping
	for _, typed := range *styped {
		m, ok := plainMapping(typed)
		if !ok {
			t.Fatalf("decodeFast took %q, whose entry %+v the typed path refuses", b, typed)
		}
		sms = append(sms, m)
	}
	// The raw mappings are what the slow path reads again; compare the
	// rest, and the mappings.
	fnc.RuntimeConfig.PortMappings, snc.RuntimeConfig.PortMappings = nil, nil
	got := fms.Slice()
	if len(got) == 0 {
		got = nil
	}
	if !reflect.DeepEqual(fnc, snc) || !reflect.DeepEqual(got, sms) {
		t.Fatalf("%q:\nfast %+v %+v\nslow %+v %+v", b, fnc, fms, snc, sms)
	}
	return true
}

func TestDecodeFast(t *testing.T) {
	fast := 0
	for _, r := range requests {
		if diffDecode(t, []byte(r)) {
			fast++
		}
	}
	// a range's entries after the first, with the protocol and host IP
	// of the entry before them
	shaped := 0
	for _, c := range shapeCases {
		if diffDecode(t, []byte(`{"name":"n","runtimeConfig":{"portMappings":`+c+`}}`)) {
			shaped++
		}
	}
	if shaped < 10 {
		t.Errorf("decodeFast read %d of the shaped requests, want 10 or more", shaped)
	}
	if fast < 9 {
		t.Errorf("decodeFast read %d of the plain requests, want 9 or more", fast)
	}
	for _, refused := range []string{`"runtimeConfig":{}}`, `[],"portMappings":[]`, `runtime\u0043onfig`} {
		for _, r := range requests {
			if strings.Contains(r, refused) {
				if _, _, ok := decodeFast([]byte(r)); ok {
					t.Errorf("decodeFast read %s", r)
				}
			}
		}
	}
}

// FuzzDecodeFast: whatever decodeFast reads, it reads as encoding/json.
func FuzzDecodeFast(f *testing.F) {
	for _, r := range requests {
		f.Add([]byte(r))
	}
	for _, c := range shapeCases {
		f.Add([]byte(`{"name":"n","runtimeConfig":{"portMappings":` + c + `}}`))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		diffDecode(t, b)
	})
}
