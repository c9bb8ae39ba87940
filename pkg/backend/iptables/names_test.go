package iptables

import (
	"fmt"
	"testing"

	"github.com/containernetworking/plugins/pkg/utils"

	"github.com/portmap-dev/portmap/pkg/plan"
)

// TestChainNameAsUpstream: the attachment's chains are named as upstream
// names them (a compatibility promise: DEL and GC find upstream's chains
// by these names), held against the plugins module's own function.
func TestChainNameAsUpstream(t *testing.T) {
	owners := []plan.Owner{{}, {Network: "podman", ContainerID: "c1"}, {Network: "k8s-pod-network", ContainerID: fmt.Sprintf("%064x", 1<<60)}}
	for i := 0; i < 50; i++ {
		owners = append(owners, plan.Owner{Network: fmt.Sprintf("net-%d", i), ContainerID: fmt.Sprintf("%x", i*7919)})
	}
	for _, o := range owners {
		for _, prefix := range []string{dnChainPrefix, forwardChainPrefix} {
			if got, want := chainName(o, prefix), utils.MustFormatChainNameWithPrefix(o.Network, o.ContainerID, prefix); got != want {
				t.Errorf("%+v %q: %s, want %s", o, prefix, got, want)
			}
		}
	}
	if got := ChainName(plan.Owner{Network: "podman", ContainerID: "c1"}); len(got) != 28 || got[:7] != "CNI-DN-" {
		t.Errorf("ChainName %q", got)
	}
}
