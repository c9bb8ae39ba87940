package deploy

import (
	"os"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func TestStrictDecodeCatchesMistakes(t *testing.T) {
	data, err := os.ReadFile(Manifest)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Decode(data); err != nil {
		t.Fatalf("%s: %v", Manifest, err)
	}
	for _, c := range []struct{ from, to string }{
		{"hostNetwork: true", "hostNetwrok: true"},
		{"readOnly: true", "readonly: true"},
		{"periodSeconds: 10", "periodSeconds: ten"},
		{"hostNetwork: true", "hostNetwork: true\n      hostNetwork: true"},
	} {
		if !strings.Contains(string(data), c.from) {
			t.Fatalf("%s lacks %q", Manifest, c.from)
		}
		bad := strings.Replace(string(data), c.from, c.to, 1)
		if _, err := Decode([]byte(bad)); err == nil {
			t.Errorf("%q decoded without an error", c.to)
		}
	}
}

// TestPromises: what the README and docs/node.md say of the DaemonSet.
func TestPromises(t *testing.T) {
	data, err := os.ReadFile(Manifest)
	if err != nil {
		t.Fatal(err)
	}
	ds, err := Decode(data)
	if err != nil {
		t.Fatal(err)
	}
	if ds.Kind != "DaemonSet" || ds.APIVersion != "apps/v1" {
		t.Errorf("kind %s/%s", ds.APIVersion, ds.Kind)
	}
	spec := ds.Spec.Template.Spec
	if !spec.HostNetwork {
		t.Error("not in the host's network namespace (hostNetwork)")
	}
	if sel := ds.Spec.Selector.MatchLabels; len(sel) == 0 || !subset(sel, ds.Spec.Template.Labels) {
		t.Errorf("selector %v does not select the template's labels %v", sel, ds.Spec.Template.Labels)
	}
	hostPaths := map[string]string{} // volume → host path
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			hostPaths[v.Name] = v.HostPath.Path
		}
	}

	if len(spec.InitContainers) != 1 {
		t.Fatalf("%d init containers, want the install", len(spec.InitContainers))
	}
	in := spec.InitContainers[0]
	if got := strings.Join(append(in.Command, in.Args...), " "); got != "/portmap install --dest /host/opt/cni/bin" {
		t.Errorf("init container runs %q, want the plugin installing itself", got)
	}
	if m := mountAt(in, "/host/opt/cni/bin"); m == nil || hostPaths[m.Name] != "/opt/cni/bin" || m.ReadOnly {
		t.Errorf("init container's /host/opt/cni/bin: %+v, want the host's /opt/cni/bin, writable", m)
	}

	if len(spec.Containers) != 1 {
		t.Fatalf("%d containers, want the agent", len(spec.Containers))
	}
	c := spec.Containers[0]
	args := append(c.Command, c.Args...)
	if len(args) < 3 || args[0] != "/portmap-agent" || args[1] != "sync" || !slices.Contains(args, "--watch") || !slices.Contains(args, "--prune") {
		t.Errorf("container runs %q, want portmap-agent sync --watch --prune", args)
	}
	if root := flagValue(args, "--root"); root != "/host" {
		t.Errorf("--root %q, want /host", root)
	}
	if m := mountAt(c, "/host"); m == nil || hostPaths[m.Name] != "/" || m.MountPropagation == nil ||
		*m.MountPropagation != corev1.MountPropagationHostToContainer {
		t.Errorf("/host: %+v, want the host's / with HostToContainer propagation", m)
	}
	if m := mountAt(c, "/host/var/lib/cni"); m == nil || hostPaths[m.Name] != "/var/lib/cni" || !m.ReadOnly {
		t.Errorf("/host/var/lib/cni: %+v, want the host's libcni cache, read-only", m)
	}
	addr := flagValue(args, "--metrics-addr")
	if addr != "127.0.0.1:9765" {
		t.Errorf("--metrics-addr %q, want 127.0.0.1:9765", addr)
	}
	for _, p := range []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{{"liveness", c.LivenessProbe, "/healthz"}, {"readiness", c.ReadinessProbe, "/readyz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("no %s probe over HTTP", p.name)
			continue
		}
		g := p.probe.HTTPGet
		if g.Path != p.path || g.Host+":"+g.Port.String() != addr {
			t.Errorf("%s probe GET %s:%s%s, want %s%s", p.name, g.Host, g.Port.String(), g.Path, addr, p.path)
		}
	}
	if len(c.Ports) != 1 || c.Ports[0].Name != "metrics" || c.Ports[0].ContainerPort != 9765 || c.Ports[0].HostPort != 9765 {
		t.Errorf("ports %+v, want the metrics port documented", c.Ports)
	}
	sc := c.SecurityContext
	if sc == nil || sc.Capabilities == nil {
		t.Fatal("no capabilities")
	}
	var caps []string
	for _, cp := range sc.Capabilities.Add {
		caps = append(caps, string(cp))
	}
	slices.Sort(caps)
	if strings.Join(caps, " ") != "BPF NET_ADMIN NET_RAW SYS_CHROOT" || (sc.Privileged != nil && *sc.Privileged) {
		t.Errorf("capabilities %v, privileged %v; want BPF, NET_ADMIN, NET_RAW, SYS_CHROOT and no more", caps, sc.Privileged)
	}
}

func subset(a, b map[string]string) bool {
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func mountAt(c corev1.Container, path string) *corev1.VolumeMount {
	for i := range c.VolumeMounts {
		if c.VolumeMounts[i].MountPath == path {
			return &c.VolumeMounts[i]
		}
	}
	return nil
}

// flagValue is the value of flag in args ("--flag value" or
// "--flag=value"), or "".
func flagValue(args []string, flag string) string {
	for i, a := range args {
		if a == flag && i+1 < len(args) {
			return args[i+1]
		}
		if v, ok := strings.CutPrefix(a, flag+"="); ok {
			return v
		}
	}
	return ""
}
