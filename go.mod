module github.com/portmap-dev/portmap

go 1.26.8

require (
	github.com/cilium/ebpf v0.22.0
	github.com/containernetworking/cni v1.3.1
	github.com/containernetworking/plugins v1.9.1
	github.com/coreos/go-iptables v0.8.0
	github.com/prometheus/client_golang v1.25.0
	github.com/vishvananda/netlink v1.3.1
	golang.org/x/sys v0.48.0
	sigs.k8s.io/knftables v0.0.18
)

require (
	github.com/alexflint/go-filemutex v1.3.0 // indirect
	github.com/beorn7/perks v1.0.1 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/inconshreveable/mousetrap v1.1.0 // indirect
	github.com/mattn/go-shellwords v1.0.12 // indirect
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822 // indirect
	github.com/networkplumbing/go-nft v0.4.0 // indirect
	github.com/pkg/errors v0.9.1 // indirect
	github.com/prometheus/client_model v0.6.3 // indirect
	github.com/prometheus/common v0.72.0 // indirect
	github.com/prometheus/procfs v0.22.0 // indirect
	github.com/safchain/ethtool v0.6.2 // indirect
	github.com/spf13/cobra v1.10.2 // indirect
	github.com/spf13/pflag v1.0.10 // indirect
	github.com/vishvananda/netns v0.0.5 // indirect
	go.opentelemetry.io/otel v1.29.0 // indirect
	go.opentelemetry.io/otel/trace v1.29.0 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)

tool (
	github.com/containernetworking/cni/cnitool
	github.com/containernetworking/plugins/plugins/ipam/host-local
	github.com/containernetworking/plugins/plugins/main/bridge
	github.com/containernetworking/plugins/plugins/main/ptp
	github.com/containernetworking/plugins/plugins/meta/portmap
)
