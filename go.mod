module github.com/portmap-dev/portmap

go 1.26.8

require (
	github.com/containernetworking/cni v1.3.0
	github.com/containernetworking/plugins v1.9.1
	github.com/coreos/go-iptables v0.8.0
	github.com/vishvananda/netlink v1.3.1
	golang.org/x/sys v0.35.0
)

require (
	github.com/pkg/errors v0.9.1 // indirect
	github.com/vishvananda/netns v0.0.5 // indirect
	sigs.k8s.io/knftables v0.0.18 // indirect
)
