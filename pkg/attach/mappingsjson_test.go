package attach

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// mappingsJSONCases are portMappings values, plain and not.
var mappingsJSONCases = []string{
	`null`, `[]`, ` [ ] `, `[{}]`,
	`[{"hostPort":8080,"containerPort":80,"protocol":"tcp","hostIP":""}]`,
	`[{"HostPort":8080,"ContainerPort":80,"Protocol":"TCP","HostIP":"::1"},{"hostport":1,"CONTAINERPORT":2}]`,
	"[\n  {\"hostPort\": 1, \"containerPort\": 2, \"protocol\": null, \"hostIP\": null}\n]",
	`[{"hostPort":1,"hostPort":2,"containerPort":3,"containerPort":null}]`,
	`[{"hostPort":1,"containerPort":2,"extra":"x","n":-1.5e3,"b":true,"z":null}]`,
	`[{"hostPort":-5,"containerPort":99999999}]`,
	`[{"hostPort":80.0,"containerPort":1}]`, `[{"hostPort":8e1,"containerPort":1}]`,
	`[{"hostPort":"80","containerPort":1}]`, `[{"hostPort":true}]`,
	`[{"hostPort":99999999999999999999999}]`,
	`[{"protocol":"t\u0063p"}]`, `[{"protocol":"tcp\n"}]`, `[{"hostIP":"ｆe80::1"}]`,
	`[{"nested":{"a":1}}]`, `[{"list":[1]}]`, `[1]`, `["x"]`, `{}`, `"x"`, `[null]`,
	// spacing, key order, ports at and past their edges
	`[{"hostPort": 20000, "containerPort": 20000, "protocol": "tcp"}, {"hostPort": 20001, "containerPort": 20001, "protocol": "udp"}]`,
	`[{"hostIP": "10.0.0.1", "hostPort": 65535, "protocol": "sctp", "containerPort": 9}]`,
	`[{"hostPort": 0, "containerPort": 1}]`, `[{"hostPort": 01, "containerPort": 1}]`,
	`[{"hostPort": 123456, "containerPort": 1}]`, `[{"hostPort": 99999, "containerPort": 1}]`,
	`[{"hostPort": 80 , "containerPort" : 1 }]`, `[{"hostPort":  80}]`, `[{ "hostPort": 80}]`,
	`[{"hostPort": 80, "protocol": "tcp", "hostPort": 81}]`, `[{"protocol": "tc"}]`, `[{"protocol": "tcpx"}]`,
	`[{"hostIPx": 1}]`, `[{"host": 1}]`, `[{"hostPort": 1e2}]`, `[{"hostPort": 1.5}]`, `[{"hostPort": 1, }]`,
	`[{"hostPort": 80}`, `[{"hostPort": 80`, `[{"hostPort": "80"}]`, `[{"protocol": tcp}]`, `[{"hostIP": ""}]`,
}

// shapeCases are an entry of a range followed by one that continues it
// or differs from it in one way.
var shapeCases = func() []string {
	first := `{"hostPort": 20000, "containerPort": 30000, "protocol": "tcp"}`
	var out []string
	for _, next := range []string{
		`{"hostPort": 20001, "containerPort": 30001, "protocol": "tcp"}`, // the shape
		`{"hostPort": 1, "containerPort": 65535, "protocol": "tcp"}`,
		`{"hostPort": 0, "containerPort": 30001, "protocol": "tcp"}`,
		`{"hostPort": 020001, "containerPort": 30001, "protocol": "tcp"}`,
		`{"hostPort": 200011, "containerPort": 30001, "protocol": "tcp"}`,
		`{"hostPort": 99999, "containerPort": 30001, "protocol": "tcp"}`,
		`{"hostPort": 20001.0, "containerPort": 30001, "protocol": "tcp"}`,
		`{"hostPort": 20001, "containerPort": 3e4, "protocol": "tcp"}`,
		`{"hostPort": 20001, "containerPort": 30001, "protocol": "udp"}`,
		`{"hostPort": 20001, "containerPort": 30001, "protocol": "tcp", "hostIP": "10.0.0.1"}`,
		`{"containerPort": 30001, "hostPort": 20001, "protocol": "tcp"}`,
		`{"hostPort":20001, "containerPort": 30001, "protocol": "tcp"}`,
		`{"hostPort": 20001, "containerPort": 30001, "protocol": "tcp" }`,
		`{"hostPort": 20001, "containerPort": 30001}`,
		`{"hostPort": 20001, "containerPort": -30001, "protocol": "tcp"}`,
		`{"hostPort": 20001, "containerPort": 30001, "protocol": "tcp"`,
	} {
		out = append(out, "["+first+", "+next+"]", "["+first+", "+next+", "+next+"]")
	}
	// the shape of the other order, and of a host IP
	out = append(out, `[{"containerPort": 80, "hostPort": 8080}, {"containerPort": 81, "hostPort": 8081}]`,
		`[{"hostIP": "10.0.0.1", "hostPort": 1, "containerPort": 2}, {"hostIP": "10.0.0.1", "hostPort": 3, "containerPort": 4}]`)
	return append(out, continuedCases()...)
}()

// continuedCases are ranges as runtimes send them, and with each way an
// entry can differ from its continuation in the third, the fifth or the
// last place.
func continuedCases() []string {
	entry := func(h, c int) string {
		return fmt.Sprintf(`{"hostPort": %d, "containerPort": %d, "protocol": "tcp"}`, h, c)
	}
	ranges := [][2]int{{20000, 30000}, {9996, 9996}, {20005, 30095}, {65530, 65530}, {1, 99990}}
	var out []string
	for _, r := range ranges {
		var es []string
		for i := range 8 {
			es = append(es, entry(r[0]+i, r[1]+i))
		}
		out = append(out, "["+strings.Join(es, ", ")+"]", "["+strings.Join(es, ",")+"]", "[\n"+strings.Join(es, ",\n ")+"\n]")
		h, c := r[0], r[1]
		for _, at := range []int{2, 4, 7} {
			for _, odd := range []string{
				fmt.Sprintf(`{"hostPort": %d, "containerPort": %d, "protocol": "tcp"}`, h+at, c+at+1),
				fmt.Sprintf(`{"hostPort": %d, "containerPort": %d, "protocol": "tcp"}`, h+at+1, c+at),
				fmt.Sprintf(`{"hostPort": %d, "containerPort": %d, "protocol": "tcp"}`, h+at-1, c+at-1),
				fmt.Sprintf(`{"hostPort": %d1, "containerPort": %d, "protocol": "tcp"}`, h+at, c+at),
				fmt.Sprintf(`{"hostPort": %d, "containerPort": %d0, "protocol": "tcp"}`, h+at, c+at),
				fmt.Sprintf(`{"hostPort": %d.0, "containerPort": %d, "protocol": "tcp"}`, h+at, c+at),
				fmt.Sprintf(`{"hostPort": %d, "containerPort": %de0, "protocol": "tcp"}`, h+at, c+at),
				fmt.Sprintf(`{"hostPort": 0%d, "containerPort": %d, "protocol": "tcp"}`, h+at, c+at),
				fmt.Sprintf(`{"hostPort": %d, "containerPort": %d, "protocol": "udp"}`, h+at, c+at),
				fmt.Sprintf(`{"hostPort": %d, "containerPort": %d}`, h+at, c+at),
				fmt.Sprintf(`{"hostPort": %d, "containerPort": %d, "protocol": "tcp", "hostIP": "10.0.0.1"}`, h+at, c+at),
				fmt.Sprintf(`{"containerPort": %d, "hostPort": %d, "protocol": "tcp"}`, c+at, h+at),
				fmt.Sprintf(`{"hostPort": %d,  "containerPort": %d, "protocol": "tcp"}`, h+at, c+at),
				fmt.Sprintf(`{"hostPort": %d, "containerPort": %d, "protocol": "tcp"`, h+at, c+at),
				fmt.Sprintf(`{"hostPort": %d, "containerPort": %d, "protocol": "tcp"}}`, h+at, c+at),
				// read the general way: another key, a key in another case
				fmt.Sprintf(`{"hostPort": %d, "containerPort": %d, "protocol": "tcp", "name": "web"}`, h+at, c+at),
				fmt.Sprintf(`{"HostPort": %d, "containerPort": %d, "protocol": "tcp"}`, h+at, c+at),
			} {
				cut := slices.Clone(es)
				cut[at] = odd
				// and put before the entry that continues the one
				// before it, which must then not be read as continuing
				// the odd one
				put := slices.Insert(slices.Clone(es), at, odd)
				out = append(out, "["+strings.Join(cut, ", ")+"]", "["+strings.Join(put, ", ")+"]")
			}
		}
	}
	return out
}

// diffMappingsJSON fails when the hand decoder takes b and gives other
// than encoding/json.
func diffMappingsJSON(t *testing.T, b []byte) {
	t.Helper()
	var fast typedMappings
	if err := json.Unmarshal(b, &fast); err != nil {
		return // refused (or not JSON): the slow path decides
	}
	var std []typedMapping
	if err := json.Unmarshal(b, &std); err != nil {
		t.Fatalf("%s: the hand decoder took what encoding/json refuses (%v): %+v", b, err, fast)
	}
	if !reflect.DeepEqual([]typedMapping(fast), std) && !(len(fast) == 0 && len(std) == 0 && (fast == nil) == (std == nil)) {
		t.Fatalf("%s: hand decoder %+v, encoding/json %+v", b, fast, std)
	}
}

// TestMappingsJSON: the hand decoder agrees with encoding/json on every
// case it takes, and takes the plain shapes runtimes send.
func TestMappingsJSON(t *testing.T) {
	for _, c := range append(mappingsJSONCases, shapeCases...) {
		diffMappingsJSON(t, []byte(c))
	}
	for _, plain := range []string{mappingsJSONCases[4], mappingsJSONCases[5], mappingsJSONCases[6], mappingsJSONCases[7], mappingsJSONCases[8], mappingsJSONCases[9]} {
		var m typedMappings
		if err := json.Unmarshal([]byte(plain), &m); err != nil {
			t.Errorf("%s: refused (%v), want taken", plain, err)
		}
	}
	for _, odd := range []string{`[{"hostPort":80.0}]`, `[{"protocol":"t\u0063p"}]`, `[{"nested":{"a":1}}]`, `[{"hostIP":"ｆe80::1"}]`, `[1]`} {
		var m typedMappings
		if err := json.Unmarshal([]byte(odd), &m); err == nil {
			t.Errorf("%s: taken as %+v, want the slow path", odd, m)
		}
	}
	// A request whose mappings take the slow path decodes the same.
	fast := `{"name":"n","runtimeConfig":{"portMappings":[{"hostPort":8080,"containerPort":80,"protocol":"tcp"}]}}`
	slow := strings.Replace(fast, `"tcp"`, `"t\u0063p"`, 1)
	a, errA := Parse([]byte(fast), "eth0", "iptables")
	b, errB := Parse([]byte(slow), "eth0", "iptables")
	if errA != nil || errB != nil || !reflect.DeepEqual(a.Request.Mappings, b.Request.Mappings) {
		t.Errorf("plain %v %+v, escaped %v %+v: want the same mappings", errA, a, errB, b)
	}
}
