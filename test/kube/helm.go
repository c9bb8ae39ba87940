//go:build kube

package kube

import (
	"testing"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"k8s.io/cli-runtime/pkg/genericclioptions"

	"github.com/portmap-dev/portmap/test/deploy"
)

// helmRelease is the chart deploy/chart as a release of the cluster,
// driven through Helm's own actions (install, upgrade, uninstall) as the
// helm command drives them: no helm binary, the release stored as Helm
// stores it (a Secret in its namespace).
type helmRelease struct {
	cfg      *action.Configuration
	chart    *chart.Chart
	name, ns string
}

func (c *controlPlane) helm(t *testing.T, name, namespace string) *helmRelease {
	t.Helper()
	ch, err := loader.Load(deploy.ChartDir)
	if err != nil {
		t.Fatal(err)
	}
	flags := genericclioptions.NewConfigFlags(false)
	// the discovery cache in the test's directory, not $HOME/.kube
	cache := t.TempDir()
	flags.KubeConfig, flags.CacheDir, flags.Namespace = &c.kubeconfig, &cache, &namespace
	cfg := new(action.Configuration)
	if err := cfg.Init(flags, namespace, "secret", t.Logf); err != nil {
		t.Fatal(err)
	}
	return &helmRelease{cfg: cfg, chart: ch, name: name, ns: namespace}
}

func (h *helmRelease) install(values map[string]any) error {
	in := action.NewInstall(h.cfg)
	in.ReleaseName, in.Namespace = h.name, h.ns
	_, err := in.Run(h.chart, values)
	return err
}

func (h *helmRelease) upgrade(values map[string]any) error {
	up := action.NewUpgrade(h.cfg)
	up.Namespace = h.ns
	_, err := up.Run(h.name, h.chart, values)
	return err
}

func (h *helmRelease) uninstall() error {
	_, err := action.NewUninstall(h.cfg).Run(h.name)
	return err
}
