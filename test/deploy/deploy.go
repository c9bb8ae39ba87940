// Package deploy reads deploy/portmap.yaml into the Kubernetes API types
// (strictly), for its tests here and for the image tests, which run the
// DaemonSet's pod with podman. Its tests hold the manifest equal to the
// Helm chart deploy/chart rendered with its defaults, and the chart's
// values to what they change.
package deploy

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"slices"

	appsv1 "k8s.io/api/apps/v1"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// Manifest is the DaemonSet's file.
var Manifest = func() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "deploy", "portmap.yaml")
}()

// ChartDir is the Helm chart whose default render is the manifest.
var ChartDir = filepath.Join(filepath.Dir(Manifest), "chart")

// Read decodes the manifest.
func Read() (*appsv1.DaemonSet, error) {
	data, err := os.ReadFile(Manifest)
	if err != nil {
		return nil, err
	}
	return Decode(data)
}

// Decode reads the DaemonSet strictly, as the API server's strict field
// validation does: a duplicate key, an unknown field, a field in the
// wrong case ("readonly") or a value of the wrong type is an error.
// (sigs.k8s.io/yaml's UnmarshalStrict alone matches field names in any
// case, as encoding/json does.)
func Decode(data []byte) (*appsv1.DaemonSet, error) {
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, err
	}
	var ds appsv1.DaemonSet
	strict, err := kjson.UnmarshalStrict(js, &ds, kjson.DisallowUnknownFields)
	if err != nil {
		return nil, err
	}
	if len(strict) > 0 {
		return nil, errors.Join(strict...)
	}
	return &ds, nil
}

// RuntimeDefaults are the capabilities containerd and CRI-O give a
// container by default; a pod's securityContext adds to them.
var RuntimeDefaults = []string{"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
	"NET_BIND_SERVICE", "NET_RAW", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}

// AgentContainerCapabilities are the capabilities the agent's container
// runs with: the runtime's defaults and what the manifest adds, sorted.
func AgentContainerCapabilities() ([]string, error) {
	added, err := AgentCapabilities()
	if err != nil {
		return nil, err
	}
	return slices.Compact(slices.Sorted(slices.Values(append(slices.Clone(RuntimeDefaults), added...)))), nil
}

// AgentCapabilities are the capabilities the manifest adds to the agent's
// container (the runtime's defaults are given besides).
func AgentCapabilities() ([]string, error) {
	ds, err := Read()
	if err != nil {
		return nil, err
	}
	for _, c := range ds.Spec.Template.Spec.Containers {
		if c.Name != "sync" {
			continue
		}
		if c.SecurityContext == nil || c.SecurityContext.Capabilities == nil {
			return nil, errors.New("the sync container adds no capabilities")
		}
		var out []string
		for _, cp := range c.SecurityContext.Capabilities.Add {
			out = append(out, string(cp))
		}
		return out, nil
	}
	return nil, errors.New("no sync container in " + Manifest)
}
