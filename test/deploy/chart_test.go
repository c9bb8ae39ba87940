package deploy

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	loader3 "helm.sh/helm/v3/pkg/chart/loader"
	chartutil3 "helm.sh/helm/v3/pkg/chartutil"
	engine3 "helm.sh/helm/v3/pkg/engine"
	lint3 "helm.sh/helm/v3/pkg/lint"
	support3 "helm.sh/helm/v3/pkg/lint/support"
	common4 "helm.sh/helm/v4/pkg/chart/common"
	util4 "helm.sh/helm/v4/pkg/chart/common/util"
	lint4 "helm.sh/helm/v4/pkg/chart/v2/lint"
	support4 "helm.sh/helm/v4/pkg/chart/v2/lint/support"
	loader4 "helm.sh/helm/v4/pkg/chart/v2/loader"
	engine4 "helm.sh/helm/v4/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/portmap-dev/portmap/test/fixture"
)

// render renders the chart as `helm install portmap deploy/chart
// --namespace kube-system` would with values, through Helm 3's and Helm
// 4's Go packages, and fails unless both render the same. It returns the
// templates' output by file name (templates/… , empty ones left out).
func render(t *testing.T, values map[string]any) (map[string]string, error) {
	t.Helper()
	out3, err3 := render3(values)
	out4, err4 := render4(values)
	if (err3 == nil) != (err4 == nil) || !maps.Equal(out3, out4) {
		t.Fatalf("Helm 3 and Helm 4 render differently:\n%v %v\n%v %v", out3, err3, out4, err4)
	}
	return out3, err3
}

func render3(values map[string]any) (map[string]string, error) {
	ch, err := loader3.Load(ChartDir)
	if err != nil {
		return nil, err
	}
	vals, err := chartutil3.ToRenderValues(ch, values, chartutil3.ReleaseOptions{Name: "portmap", Namespace: "kube-system", IsInstall: true}, chartutil3.DefaultCapabilities)
	if err != nil {
		return nil, err
	}
	out, err := engine3.Render(ch, vals)
	return files(out), err
}

func render4(values map[string]any) (map[string]string, error) {
	ch, err := loader4.Load(ChartDir)
	if err != nil {
		return nil, err
	}
	vals, err := util4.ToRenderValues(ch, values, common4.ReleaseOptions{Name: "portmap", Namespace: "kube-system", IsInstall: true}, common4.DefaultCapabilities)
	if err != nil {
		return nil, err
	}
	out, err := engine4.Render(ch, vals)
	return files(out), err
}

// files keys a render by the template's path in the chart, without the
// empty ones and the helpers.
func files(out map[string]string) map[string]string {
	m := map[string]string{}
	for name, text := range out {
		if _, file, ok := strings.Cut(name, "/templates/"); ok && strings.TrimSpace(text) != "" {
			m["templates/"+file] = text
		}
	}
	return m
}

// The manifest is the chart rendered with its defaults, byte for byte
// (go test -update writes it).
func TestChartDefaultsAreTheManifest(t *testing.T) {
	out, err := render(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := slices.Sorted(maps.Keys(out)); !slices.Equal(got, []string{"templates/daemonset.yaml"}) {
		t.Errorf("the defaults render %v, want the DaemonSet alone", got)
	}
	fixture.Golden(t, Manifest, out["templates/daemonset.yaml"])
}

// The chart lints clean under Helm 3 and Helm 4: no warning, no error
// (Helm's informational notes, such as a missing icon, are logged).
func TestChartLints(t *testing.T) {
	for _, values := range []map[string]any{nil, {"serviceMonitor": map[string]any{"enabled": true}, "agent": map[string]any{"metrics": map[string]any{"address": "0.0.0.0"}}}} {
		for _, m := range lint3.All(ChartDir, values, "kube-system", false).Messages {
			if m.Severity > support3.InfoSev {
				t.Errorf("helm 3 lint %v: %s", values, m)
			} else {
				t.Logf("helm 3 lint: %s", m)
			}
		}
		for _, m := range lint4.RunAll(ChartDir, values, "kube-system").Messages {
			if m.Severity > support4.InfoSev {
				t.Errorf("helm 4 lint %v: %s", values, m)
			} else {
				t.Logf("helm 4 lint: %s", m)
			}
		}
	}
}

// Each value changes the pod as values.yaml says.
func TestChartValues(t *testing.T) {
	for _, tc := range []struct {
		name   string
		values string // YAML
		check  func(t *testing.T, out map[string]string)
	}{
		{"another CNI bin directory (k3s)", "cniBinDir: /var/lib/rancher/k3s/data/current/bin", func(t *testing.T, out map[string]string) {
			if v := volume(t, out, "cni-bin"); v.HostPath == nil || v.HostPath.Path != "/var/lib/rancher/k3s/data/current/bin" {
				t.Errorf("cni-bin: %+v", v)
			}
		}},
		{"another libcni cache", "cniCacheDir: /var/lib/cni-other", func(t *testing.T, out map[string]string) {
			if v := volume(t, out, "cni-cache"); v.HostPath == nil || v.HostPath.Path != "/var/lib/cni-other" {
				t.Errorf("cni-cache: %+v", v)
			}
			c := agent(t, out)
			if m := mountAt(c, "/host/var/lib/cni-other"); m == nil || m.Name != "cni-cache" || !m.ReadOnly {
				t.Errorf("the cache's mount: %+v", c.VolumeMounts)
			}
			if got := flagValue(c.Args, "--cache-dir"); got != "/var/lib/cni-other" {
				t.Errorf("--cache-dir %q in %q", got, c.Args)
			}
		}},
		{"a digest", "image: {repository: registry.example/portmap, tag: v1.2.3, digest: 'sha256:" + strings.Repeat("ab", 32) + "', pullPolicy: Always}\nimagePullSecrets: [regcred]", func(t *testing.T, out map[string]string) {
			ds := daemonSet(t, out)
			spec := ds.Spec.Template.Spec
			want := "registry.example/portmap@sha256:" + strings.Repeat("ab", 32)
			for _, c := range append(spec.InitContainers, spec.Containers...) {
				if c.Image != want || c.ImagePullPolicy != corev1.PullAlways {
					t.Errorf("%s: image %s %s, want %s Always", c.Name, c.Image, c.ImagePullPolicy, want)
				}
			}
			if len(spec.ImagePullSecrets) != 1 || spec.ImagePullSecrets[0].Name != "regcred" {
				t.Errorf("pull secrets %+v", spec.ImagePullSecrets)
			}
		}},
		{"a tag", "image: {tag: v1.2.3}", func(t *testing.T, out map[string]string) {
			if c := agent(t, out); c.Image != "localhost/portmap:v1.2.3" {
				t.Errorf("image %s", c.Image)
			}
		}},
		{"the agent's settings and extra args", "agent: {prune: false, minSyncPeriod: 5s, interval: 2m, logFormat: json, extraArgs: [--debounce, 500ms], extraEnv: [{name: GOMAXPROCS, value: '1'}], metrics: {address: 0.0.0.0, port: 9876}}", func(t *testing.T, out map[string]string) {
			c := agent(t, out)
			want := "sync --watch --root /host --metrics-addr 0.0.0.0:9876 --min-sync-period 5s --interval 2m --log-format json --debounce 500ms"
			if got := strings.Join(c.Args, " "); got != want {
				t.Errorf("args %q, want %q", got, want)
			}
			if len(c.Env) != 1 || c.Env[0].Name != "GOMAXPROCS" {
				t.Errorf("env %+v", c.Env)
			}
			if len(c.Ports) != 1 || c.Ports[0].ContainerPort != 9876 || c.Ports[0].HostPort != 9876 {
				t.Errorf("ports %+v", c.Ports)
			}
			for _, p := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe} {
				if g := p.HTTPGet; g.Host != "127.0.0.1" || g.Port.IntValue() != 9876 {
					t.Errorf("probe %s:%s, want the loopback of the wildcard address", g.Host, g.Port.String())
				}
			}
		}},
		{"an IPv6 metrics address", "agent: {metrics: {address: 'fd00::1'}}", func(t *testing.T, out map[string]string) {
			c := agent(t, out)
			if got := flagValue(c.Args, "--metrics-addr"); got != "[fd00::1]:9765" || c.LivenessProbe.HTTPGet.Host != "fd00::1" {
				t.Errorf("--metrics-addr %q, probe host %q", got, c.LivenessProbe.HTTPGet.Host)
			}
		}},
		{"scheduling and the pod's metadata", `
tolerations: [{key: dedicated, operator: Equal, value: edge, effect: NoSchedule}]
nodeSelector: {kubernetes.io/os: linux}
affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{matchExpressions: [{key: portmap, operator: NotIn, values: ["off"]}]}]}}}
priorityClassName: ""
updateStrategy: {type: RollingUpdate, rollingUpdate: {maxUnavailable: 10%}}
podAnnotations: {example.com/note: hi}
podLabels: {team: net}
agent: {resources: {requests: {cpu: 50m}, limits: {memory: 64Mi}}, capabilities: [NET_ADMIN, NET_RAW, SYS_CHROOT]}`, func(t *testing.T, out map[string]string) {
			ds := daemonSet(t, out)
			spec := ds.Spec.Template.Spec
			if len(spec.Tolerations) != 1 || spec.Tolerations[0].Key != "dedicated" || spec.NodeSelector["kubernetes.io/os"] != "linux" ||
				spec.Affinity == nil || spec.Affinity.NodeAffinity == nil || spec.PriorityClassName != "" {
				t.Errorf("scheduling: %+v %v %+v %q", spec.Tolerations, spec.NodeSelector, spec.Affinity, spec.PriorityClassName)
			}
			if u := ds.Spec.UpdateStrategy.RollingUpdate; u == nil || u.MaxUnavailable.String() != "10%" {
				t.Errorf("update strategy %+v", ds.Spec.UpdateStrategy)
			}
			meta := ds.Spec.Template.ObjectMeta
			if meta.Annotations["example.com/note"] != "hi" || meta.Labels["team"] != "net" || meta.Labels["app.kubernetes.io/name"] != "portmap" {
				t.Errorf("pod metadata %+v", meta)
			}
			c := agent(t, out)
			if c.Resources.Requests.Cpu().String() != "50m" || c.Resources.Limits.Memory().String() != "64Mi" {
				t.Errorf("resources %+v", c.Resources)
			}
			if caps := fmt.Sprint(c.SecurityContext.Capabilities.Add); caps != "[NET_ADMIN NET_RAW SYS_CHROOT]" {
				t.Errorf("capabilities %s", caps)
			}
		}},
		{"the ServiceMonitor", "serviceMonitor: {enabled: true, interval: 15s, labels: {release: prom}}\nagent: {metrics: {address: 0.0.0.0}}", func(t *testing.T, out map[string]string) {
			text := out["templates/servicemonitor.yaml"]
			docs := strings.Split(text, "\n---\n")
			if len(docs) != 2 {
				t.Fatalf("servicemonitor.yaml: %d documents, want the Service and the ServiceMonitor:\n%s", len(docs), text)
			}
			var svc corev1.Service
			if err := yaml.UnmarshalStrict([]byte(docs[0]), &svc); err != nil || svc.Spec.ClusterIP != "None" ||
				svc.Spec.Selector["app.kubernetes.io/name"] != "portmap" || svc.Spec.Ports[0].Port != 9765 {
				t.Errorf("the Service: %+v %v", svc, err)
			}
			var sm struct {
				APIVersion, Kind string
				Metadata         struct {
					Name, Namespace string
					Labels          map[string]string
				}
				Spec struct {
					Selector  struct{ MatchLabels map[string]string }
					Endpoints []struct{ Port, Path, Interval string }
				}
			}
			if err := yaml.Unmarshal([]byte(docs[1]), &sm); err != nil {
				t.Fatal(err)
			}
			if sm.APIVersion != "monitoring.coreos.com/v1" || sm.Kind != "ServiceMonitor" || sm.Metadata.Namespace != "kube-system" ||
				sm.Metadata.Labels["release"] != "prom" || sm.Spec.Selector.MatchLabels["app.kubernetes.io/name"] != "portmap" ||
				len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Port != "metrics" || sm.Spec.Endpoints[0].Interval != "15s" {
				t.Errorf("the ServiceMonitor: %+v", sm)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var values map[string]any
			if err := yaml.Unmarshal([]byte(tc.values), &values); err != nil {
				t.Fatal(err)
			}
			out, err := render(t, values)
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, out)
		})
	}
}

// A ServiceMonitor of a node-local metrics address is refused, naming
// both keys, rather than installed to scrape nothing.
func TestChartRefusesAServiceMonitorOfLoopback(t *testing.T) {
	_, err := render(t, map[string]any{"serviceMonitor": map[string]any{"enabled": true}})
	if err == nil || !strings.Contains(err.Error(), "serviceMonitor.enabled") || !strings.Contains(err.Error(), "agent.metrics.address") {
		t.Errorf("render: %v, want the two keys named", err)
	}
}

func daemonSet(t *testing.T, out map[string]string) *appsv1.DaemonSet {
	t.Helper()
	ds, err := Decode([]byte(out["templates/daemonset.yaml"]))
	if err != nil {
		t.Fatalf("the rendered DaemonSet: %v\n%s", err, out["templates/daemonset.yaml"])
	}
	return ds
}

func agent(t *testing.T, out map[string]string) corev1.Container {
	t.Helper()
	cs := daemonSet(t, out).Spec.Template.Spec.Containers
	if len(cs) != 1 {
		t.Fatalf("%d containers", len(cs))
	}
	return cs[0]
}

func volume(t *testing.T, out map[string]string, name string) corev1.Volume {
	t.Helper()
	for _, v := range daemonSet(t, out).Spec.Template.Spec.Volumes {
		if v.Name == name {
			return v
		}
	}
	t.Fatalf("no volume %s", name)
	return corev1.Volume{}
}
