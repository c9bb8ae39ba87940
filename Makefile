# portmap — a drop-in CNI portmap plugin.
#   make build     bin/portmap (the plugin) and bin/portmap-agent (the node agent)
#   make test      unit, kernel, end-to-end, image and kube tests (root: they make their own netns)
#   make demo      the main job end to end, in namespaces of its own (root)
#   make bench     ours vs upstream, both backends, N = 0, 100, 1000 containers
#                  and M = 1, 100, 1000, 5000 mappings in one (root; ~20 minutes)
#   make bench-quick  N = 0 and 100, few samples (under 2 minutes; CI smoke test)
#   make compat-test  the kernel and end-to-end suites again with the iptables and
#                  nft of Debian 11, 12 and 13 first on PATH (roots made with
#                  mmdebstrap, cached in build/compat; root; part of make test)
#   make guest-test Debian's kernels 5.10, 6.1 and 6.12 in QEMU guests: the kernel-API
#                  tests and a traffic test per backend (root; part of make test)
#   make cross-test every architecture of upstream's releases builds; the unit
#                  tests run under qemu-user for arm64 and s390x (big-endian)
#   make release   portmap-linux-<arch>-<version>.tgz with .sha256 and .sha512 for every
#                  architecture into RELEASE_DIR (build/release), reproducibly
#   make kube-test a kubelet and containerd 2 (built from the module proxy) and
#                  Debian's containerd 1.6 run hostPort pods and the DaemonSet through
#                  the plugin, and a control plane of the kubelet's release rolls the
#                  DaemonSet out, in namespaces of their own (root; part of make test)
#   make firewalld-test firewalld 1.3 and 2.3 (Debian 12's and 13's, in roots made
#                  with mmdebstrap, cached in build/firewalld), each with a bus of its
#                  own, beside both backends: traffic, reloads with and without the
#                  agent (root; part of make test)
#   make install   bin/portmap -> $(DESTDIR)/opt/cni/bin/portmap,
#                  bin/portmap-agent -> $(DESTDIR)/usr/local/sbin/portmap-agent
#   make image     the container image (FROM scratch, static binary) with podman

GO      ?= go
CNI_BIN := $(CURDIR)/build/cni

.PHONY: all build plugins deps test unit lint fuzz demo bench bench-quick soak compat-test guest-test cross-build cross-test release release-check kube-test kubelet containerd2 flannel firewalld-test install image clean

all: build

# The version `portmap version` and the CNI VERSION verb's about text
# name: the tag (git describe), else v0.0.0-dev-<revision>[-dirty]; the
# VCS revision itself comes from the toolchain (-buildvcs).
VERSION ?= $(shell git describe --tags --match 'v*' --dirty 2>/dev/null || \
	git log -1 --format=v0.0.0-dev-%h --abbrev=12 2>/dev/null | sed "s/$$/$$(git diff --quiet HEAD 2>/dev/null || echo -dirty)/" || echo dev)
BUILDFLAGS := -buildvcs=auto -ldflags "-X github.com/portmap-dev/portmap/pkg/buildinfo.version=$(VERSION)"

# Static (CGO_ENABLED=0), as the CNI plugins' own releases are: the binary
# runs on any host, whatever its libc (a cgo build needs the build host's
# glibc 2.34 or later), and starts without the dynamic loader.
build:
	CGO_ENABLED=0 $(GO) build $(BUILDFLAGS) -o bin/ ./cmd/portmap ./cmd/portmap-agent

# Everything the tests and the demo run, built from the module versions in
# go.mod: the tools of its tool block (the real ptp/bridge/host-local/loopback,
# upstream portmap as portmap-upstream, cnitool), ours, the demo's server.
plugins:
	@mkdir -p $(CNI_BIN)
	$(GO) run ./test/nettest/buildplugins $(CNI_BIN)

deps:
	@./test/deps.sh

lint:
	@out=$$(gofmt -l cmd pkg plugins test); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags kube ./test/kube
	$(GO) vet -tags firewalld ./test/firewalld

unit:
	$(GO) test -count=1 ./cmd/... ./pkg/... ./plugins/...

# timed runs a command and names its seconds: where make test's time goes.
timed = s=$$(date +%s); $(1); rc=$$?; echo "== $(2): $$rc after $$(($$(date +%s) - s)) s"; exit $$rc

test: deps lint plugins
	@$(call timed,PORTMAP_CNI_BIN=$(CNI_BIN) $(GO) test -count=1 ./...,go test ./...)
	@$(call timed,$(MAKE) fuzz FUZZTIME=100000x,fuzz)
	@$(call timed,$(MAKE) compat-test,compat-test)
	@$(call timed,$(MAKE) guest-test,guest-test)
	@$(call timed,$(MAKE) cross-test,cross-test)
	@$(call timed,$(MAKE) release-check,release-check)
	@$(call timed,$(MAKE) kube-test,kube-test)
	@$(call timed,$(MAKE) firewalld-test,firewalld-test)

# firewalld as Debian 12 (1.3) and 13 (2.3) ship it, each from a root of
# its own (test/firewalld/root.sh, made once), chrooted in the suite's
# namespaces with a D-Bus system bus of the suite's own.
FIREWALLD_DIR ?= $(CURDIR)/build/firewalld

firewalld-test: deps plugins
	@set -e; for s in bookworm trixie; do ./test/firewalld/root.sh $$s $(FIREWALLD_DIR)/$$s; done
	PORTMAP_CNI_BIN=$(CNI_BIN) PORTMAP_FIREWALLD_ROOTS=$(FIREWALLD_DIR) $(GO) test -tags firewalld -count=1 -v ./test/firewalld

# The iptables userlands a drop-in meets: Debian 11 (1.8.7, nft 0.9.8),
# 12 (1.8.9, nft 1.0.6), 13 (1.8.11, nft 1.1.3). Each root is made once
# (test/compat/userland.sh) and its tools put first on PATH through
# wrappers named as Debian's alternatives; the kernel suite (less the tests
# that hold our netlink writer to the host's nft, and the soaks) and the
# end-to-end suite run under each, iptables-nft and nftables backends; then
# the end-to-end tests of one container's life with its iptables-legacy.
# A root whose iptables and nft are the host's own (the release the host
# runs) runs its iptables-legacy tests alone: `go test ./...` (make test)
# runs both suites on those tools.
COMPAT_DIR ?= $(CURDIR)/build/compat
# TestAgentChurn's cycles under another userland (40 under the host's):
# enough for host-local to hand out every address of its /28 and reuse them.
COMPAT_CHURN ?= 20
USERLANDS  ?= bullseye bookworm trixie
COMPAT_LEGACY := TestTraffic|TestTwoContainersDelOne|TestDelLeavesNothing|TestCheckDetectsTampering|TestNodeToolsRoundTrip|TestUpstreamToOurs|TestGC|TestStatus
COMPAT_SKIP := TestSoak|TestTenThousandMappings|TestNetlinkWritesWhatNftWrites|TestNFTOneLookupPerConnection

compat-test: deps plugins
	@mkdir -p build/compat-bin
	$(GO) test -c -o build/compat-bin/kernel.test ./test/kernel
	$(GO) test -c -o build/compat-bin/e2e.test ./test/e2e
	@set -e; host="$$(iptables --version 2>/dev/null) $$(nft --version 2>/dev/null)"; for u in $(USERLANDS); do \
		./test/compat/userland.sh $$u $(COMPAT_DIR)/$$u; \
		start=$$(date +%s); \
		tools="$$(PATH=$(COMPAT_DIR)/$$u/bin:$$PATH iptables --version) $$(PATH=$(COMPAT_DIR)/$$u/bin:$$PATH nft --version)"; \
		if [ "$$tools" = "$$host" ]; then \
			echo "== compat: $$u has the host's own iptables and nft ($$tools): the main suites ran on them"; \
		else \
		echo "== compat: $$u kernel suite"; \
		(cd test/kernel && PATH=$(COMPAT_DIR)/$$u/bin:$$PATH PORTMAP_CNI_BIN=$(CNI_BIN) $(CURDIR)/build/compat-bin/kernel.test -test.count=1 -test.skip '$(COMPAT_SKIP)'); \
		echo "== compat: $$u end-to-end suite"; \
		(cd test/e2e && PATH=$(COMPAT_DIR)/$$u/bin:$$PATH PORTMAP_CNI_BIN=$(CNI_BIN) $(CURDIR)/build/compat-bin/e2e.test -test.count=1 -test.timeout 20m -churn.cycles $(COMPAT_CHURN)); \
		fi; \
		echo "== compat: $$u iptables-legacy"; \
		(cd test/e2e && PATH=$(COMPAT_DIR)/$$u/bin-legacy:$$PATH PORTMAP_CNI_BIN=$(CNI_BIN) $(CURDIR)/build/compat-bin/e2e.test -test.count=1 -test.run '^($(COMPAT_LEGACY))$$'); \
		echo "== compat: $$u passed in $$(($$(date +%s) - start)) s"; \
	done

# Debian's own kernels (bullseye 5.10, bookworm 6.1, trixie 6.12), booted
# in QEMU guests (test/compat/guest.sh; the emulator where the host has no
# usable kvm) with Debian 13's tools, the static test binaries and plugins
# shared from the host. GUEST_TESTS picks the kernel suite's tests: by
# default (all) the kernels of GUEST_FULL (5.10, the floor) run every one
# but the time-bound (parallel ADDs, kill trials, soaks: they fail for
# speed alone under the emulator) and the agent's races with the runtime
# (60 cases of the agent's logic, no kernel API of their own: 3 minutes a
# kernel under the emulator), about 2 minutes a kernel here, and the
# others (6.1, 6.12) the kernel-API ones alone, as GUEST_TESTS=api runs
# them on every kernel; and, of the
# end-to-end suite, a traffic test per backend, the DaemonSet's agent
# with exactly its capabilities, and an SCTP association through a repair
# (the host's kernel here has no SCTP) (GUEST_E2E).
GUEST_KERNELS ?= bullseye bookworm trixie
GUEST_FULL    ?= bullseye
GUEST_API     := TestBPFMap|TestBPFLink|TestNFTApplyCheckRemove|TestNFTFastPathMisses|TestNFTReAddReplaces|TestNFTSamePortAndIP|TestApplyCheckRemove|TestNativeAddAsRestore|TestCheckOverNetlink|TestIPTablesFastPathMisses|TestReadyCommitsNothing|TestReadyReadsTheSkeleton|TestSocketPath
GUEST_SLOW    := $(COMPAT_SKIP)|TestFiftyParallelAddsThenDels|TestKilledMidwayRecovers|TestSyncPassesKeepSockets|TestPassAfterARuntimeVerb
GUEST_TESTS   ?= all
GUEST_E2E     := TestTraffic|TestSocketPathCapabilities|TestSCTPAssociationSurvivesRepair

guest-test: deps plugins
	@mkdir -p build/guest-bin
	CGO_ENABLED=0 $(GO) test -c -o build/guest-bin/kernel.test ./test/kernel
	CGO_ENABLED=0 $(GO) test -c -o build/guest-bin/e2e.test ./test/e2e
	./test/compat/userland.sh trixie $(COMPAT_DIR)/trixie
	@set -e; for k in $(GUEST_KERNELS); do \
		start=$$(date +%s); \
		full=; case " $(GUEST_FULL) " in *" $$k "*) full=$(filter all,$(GUEST_TESTS));; esac; \
		if [ -n "$$full" ]; then sel="-test.skip '$(GUEST_SLOW)'"; else sel="-test.run '^($(GUEST_API))$$'"; fi; \
		echo "== guest: Debian $$k's kernel"; \
		GUEST_ROOT=$(COMPAT_DIR)/trixie/root PORTMAP_CNI_BIN=$(CNI_BIN) ./test/compat/guest.sh $$k $(CURDIR)/build/guest/$$k -- \
			sh -c "cd test/kernel && ../../build/guest-bin/kernel.test -test.count=1 $$sel && cd ../e2e && ../../build/guest-bin/e2e.test -test.count=1 -test.run '^($(GUEST_E2E))$$'"; \
		echo "== guest: $$k passed in $$(($$(date +%s) - start)) s"; \
	done

# Every target of upstream's release tarballs, static as make build.
CROSS_ARCHES ?= amd64 arm64 arm ppc64le s390x riscv64

# Built with the release's flags, so make release-check's first build of
# every architecture, after cross-test in make test, is the build cache's
# (~35 s an architecture on a fresh machine, 1 s from the cache).
cross-build:
	@set -e; for a in $(CROSS_ARCHES); do \
		CGO_ENABLED=0 GOARCH=$$a $(GO) build -trimpath -buildvcs=auto -ldflags "$(RELEASE_LDFLAGS)" -o build/cross/$$a/ ./cmd/portmap ./cmd/portmap-agent; \
		echo "built linux/$$a"; \
	done

# Release tarballs as upstream's plugins ship them, one per architecture:
# portmap-linux-<arch>-<version>.tgz (the plugin and the agent) with its
# .sha256 and .sha512, into RELEASE_DIR. Reproducible: -trimpath, an empty
# build ID, the version from the tag (git describe), the tar's entries
# sorted, owned by root and dated at the commit, gzip without a name or
# time. Beside them the Helm chart as `helm package` names it,
# portmap-<version without the v>.tgz (a top directory portmap/), its
# version the release's and its image tag the release's tag, packed the
# same reproducible way, with its checksums. make release-check builds it
# all twice (the second time with a build cache of its own) and compares
# the bytes.
RELEASE_DIR ?= $(CURDIR)/build/release
RELEASE_LDFLAGS := -buildid= -X github.com/portmap-dev/portmap/pkg/buildinfo.version=$(VERSION)
RELEASE_TIME := $(shell git log -1 --format=%ct 2>/dev/null || echo 0)

release:
	@set -e; mkdir -p $(RELEASE_DIR); for a in $(CROSS_ARCHES); do \
		stage=$$(mktemp -d); \
		CGO_ENABLED=0 GOARCH=$$a $(GO) build -trimpath -buildvcs=auto -ldflags "$(RELEASE_LDFLAGS)" -o $$stage/ ./cmd/portmap ./cmd/portmap-agent; \
		tgz=portmap-linux-$$a-$(VERSION).tgz; \
		tar --sort=name --mtime=@$(RELEASE_TIME) --owner=0 --group=0 --numeric-owner --mode=go-w -C $$stage -cf - portmap portmap-agent | gzip -n -9 >$(RELEASE_DIR)/$$tgz; \
		rm -rf $$stage; \
		(cd $(RELEASE_DIR) && sha256sum $$tgz >$$tgz.sha256 && sha512sum $$tgz >$$tgz.sha512); \
		echo "$(RELEASE_DIR)/$$tgz"; \
	done
	@set -e; stage=$$(mktemp -d); v=$(VERSION); \
		cp -r deploy/chart $$stage/portmap; \
		sed -i -e "s/^version: .*/version: $${v#v}/" -e "s/^appVersion: .*/appVersion: $$v/" $$stage/portmap/Chart.yaml; \
		chart=portmap-$${v#v}.tgz; \
		tar --sort=name --mtime=@$(RELEASE_TIME) --owner=0 --group=0 --numeric-owner --mode=go-w -C $$stage -cf - portmap | gzip -n -9 >$(RELEASE_DIR)/$$chart; \
		rm -rf $$stage; \
		(cd $(RELEASE_DIR) && sha256sum $$chart >$$chart.sha256 && sha512sum $$chart >$$chart.sha512); \
		echo "$(RELEASE_DIR)/$$chart"

release-check:
	@rm -rf build/release-a build/release-b build/release-cache
	$(MAKE) --no-print-directory release RELEASE_DIR=$(CURDIR)/build/release-a
	GOCACHE=$(CURDIR)/build/release-cache $(MAKE) --no-print-directory release RELEASE_DIR=$(CURDIR)/build/release-b CROSS_ARCHES=amd64
	@set -e; for f in build/release-b/*; do cmp $$f build/release-a/$${f##*/}; done; \
		echo "release: portmap-linux-amd64-$(VERSION).tgz and the chart the same, byte for byte, from a build cache of its own"; \
		rm -rf build/release-cache

# The unit tests (those that need no kernel of their own: the ones in user
# namespaces skip themselves under the emulator) for arm64 and for s390x,
# big-endian: every encoder the kernel reads checked in both byte orders.
cross-test: deps cross-build
	@set -e; for a in arm64:aarch64 s390x:s390x; do \
		emu=qemu-$${a#*:}-static; \
		echo "== unit tests, linux/$${a%%:*} under $$emu"; \
		CGO_ENABLED=0 GOARCH=$${a%%:*} PORTMAP_QEMU_USER=$$emu $(GO) test -count=1 -exec $$emu ./cmd/... ./pkg/... ./plugins/...; \
	done

# Short fuzz runs of config parsing and rule rendering (FUZZTIME each).
# `make test` bounds them by executions (100000x): a duration can end with
# a false "context deadline exceeded" on a busy machine (golang/go#75804,
# fixed in Go 1.27).
FUZZTIME ?= 30s
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzParseConfig$$' -fuzztime $(FUZZTIME) ./pkg/attach
	$(GO) test -run '^$$' -fuzz '^FuzzRender$$' -fuzztime $(FUZZTIME) ./pkg/attach
	$(GO) test -run '^$$' -fuzz '^FuzzMappingsJSON$$' -fuzztime $(FUZZTIME) ./pkg/attach
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeFast$$' -fuzztime $(FUZZTIME) ./pkg/attach

# The soak of issue #18: 1000 attachments in place, 10,000 ADD/DEL cycles
# of 1-100 mappings per backend (about 10 minutes; its timing check wants
# a quiet machine: run beside CI, the iptables half measured 1.57x);
# `make test` runs a short one (100 attachments, 300 cycles) that reports
# the cycle times without judging them.
soak: deps plugins
	PORTMAP_CNI_BIN=$(CNI_BIN) $(GO) test -count=1 -timeout 60m -run '^TestSoak$$' -v ./test/kernel -soak.n=1000 -soak.cycles=10000 -soak.timing

# The demo installs only what it uses (iptables, nftables, iproute2,
# conntrack); make test installs the rest.
demo: plugins
	@./test/deps.sh demo
	./test/demo/demo.sh $(CNI_BIN)

# The kube suite's kubelet, built static from the Go module proxy at the
# version test/kube/kubelet/go.mod pins (a module of its own).
KUBELET := $(CURDIR)/build/kube/kubelet
# The control plane of the suite's cluster test and its kubectl, from the
# same module and release, into the kubelet's directory.
KUBE_BIN := $(CURDIR)/build/kube
KUBE_VERSION := $(shell sed -n 's/^\tk8s.io\/kubernetes \(v[0-9.]*\).*/\1/p' test/kube/kubelet/go.mod)
KUBE_LDFLAGS := -s $(foreach p,k8s.io/component-base/version k8s.io/client-go/pkg/version,-X $(p).gitVersion=$(KUBE_VERSION) -X $(p).gitTreeState=clean)

kubelet:
	@start=$$(date +%s); cd test/kube/kubelet && CGO_ENABLED=0 $(GO) build -trimpath -ldflags="$(KUBE_LDFLAGS)" -o $(KUBE_BIN)/ \
		k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
		k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kube-proxy k8s.io/kubernetes/cmd/kubectl && \
		echo "kubelet, control plane and kubectl $(KUBE_VERSION) built in $$(($$(date +%s) - start)) s"

# The kube suite's second runtime: containerd 2.x (its daemon, shim and
# ctr), built static from the Go module proxy at the version
# test/kube/containerd/go.mod pins.
CONTAINERD2 := $(CURDIR)/build/kube/containerd2

containerd2:
	@start=$$(date +%s); cd test/kube/containerd && CGO_ENABLED=0 $(GO) build -trimpath -ldflags=-s -tags "no_btrfs no_devmapper no_zfs urfave_cli_no_docs" \
		-o $(CONTAINERD2)/ github.com/containerd/containerd/v2/cmd/containerd \
		github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 github.com/containerd/containerd/v2/cmd/ctr && \
		echo "containerd 2 built in $$(($$(date +%s) - start)) s"

# The kube suite's flanneld (two-node cluster, VXLAN), built from the Go
# module proxy at the release test/kube/flannel/go.mod pins; with cgo, as
# flannel releases it (its UDP backend needs it).
FLANNELD := $(CURDIR)/build/kube/flanneld

flannel:
	@start=$$(date +%s); cd test/kube/flannel && CGO_ENABLED=1 $(GO) build -trimpath -ldflags=-s -o $(FLANNELD) github.com/flannel-io/flannel && \
		echo "flanneld built in $$(($$(date +%s) - start)) s"

kube-test: deps plugins kubelet containerd2 flannel
	PORTMAP_CNI_BIN=$(CNI_BIN) PORTMAP_KUBELET=$(KUBELET) PORTMAP_KUBE_BIN=$(KUBE_BIN) PORTMAP_CONTAINERD2=$(CONTAINERD2) PORTMAP_FLANNELD=$(FLANNELD) \
		$(GO) test -tags kube -count=1 -timeout 30m -v ./test/kube

BENCH_OUT ?= test/bench/results

bench: deps plugins
	PORTMAP_CNI_BIN=$(CNI_BIN) $(GO) run ./test/bench -n 0,100,1000 -samples 20 -conns 5000 -conn-n 1000 -out $(BENCH_OUT)

bench-quick: deps plugins
	PORTMAP_CNI_BIN=$(CNI_BIN) $(GO) run ./test/bench -n 0,100 -samples 3 -m 1,100 -conns 1000 -conn-n 100 -sync-n 100 -services 0,100 -agent-idle 5s -out $(CURDIR)/build/bench-quick

install: build
	install -D -m 0755 bin/portmap $(DESTDIR)/opt/cni/bin/portmap
	install -D -m 0755 bin/portmap-agent $(DESTDIR)/usr/local/sbin/portmap-agent

IMAGE ?= localhost/portmap:dev

# The image of deploy/portmap.yaml: Containerfile FROM scratch with the
# static binaries; nothing to pull.
image:
	@mkdir -p build/image
	CGO_ENABLED=0 $(GO) build $(BUILDFLAGS) -o build/image/ ./cmd/portmap ./cmd/portmap-agent
	podman build -f Containerfile -t $(IMAGE) build/image

clean:
	rm -rf bin build
