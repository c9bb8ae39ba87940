//go:build kube

package kube

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/portmap-dev/portmap/test/nettest"
)

// kubeBinEnv names the directory of the control plane's binaries and
// kubectl (make kube-test builds them from test/kube/kubelet).
const kubeBinEnv = "PORTMAP_KUBE_BIN"

// controlPlane is a cluster's control plane on the node: Debian's etcd,
// and kube-apiserver, kube-controller-manager and kube-scheduler of the
// kubelet's release, reached by everyone (the kubelet, the controllers,
// kubectl) with one token of system:masters over TLS on 127.0.0.1:6443.
type controlPlane struct {
	dir        string
	kubeconfig string
	// nodeIP is the node's address on its LAN, which the API server
	// advertises and the kubelet reports.
	nodeIP string
}

// serviceRange is the cluster's Service addresses; clusterCIDR its
// pods' network, a /24 of it per node.
const (
	serviceRange = "10.96.0.0/24"
	clusterCIDR  = "10.244.0.0/16"
)

func kubeBin(prog string) string { return filepath.Join(os.Getenv(kubeBinEnv), prog) }

// startControlPlane writes the cluster's keys and starts its control
// plane as daemons of the node (stopped with it), then waits for the API
// server to be ready and its default namespace's service account.
func startControlPlane(t *testing.T, n *node, nodeIP string) *controlPlane {
	t.Helper()
	c := &controlPlane{dir: filepath.Join(n.dir, "cluster"), nodeIP: nodeIP}
	if err := os.MkdirAll(c.dir, 0o700); err != nil {
		t.Fatal(err)
	}
	token, err := c.writeKeys(nodeIP)
	if err != nil {
		t.Fatal(err)
	}
	p := func(name string) string { return filepath.Join(c.dir, name) }
	c.kubeconfig = p("admin.kubeconfig")
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: local
  cluster: {server: "https://127.0.0.1:6443", certificate-authority: %q}
users:
- name: admin
  user: {token: %q}
contexts:
- name: local
  context: {cluster: local, user: admin}
current-context: local
`, p("ca.crt"), token)
	if err := os.WriteFile(c.kubeconfig, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	n.control = append(n.control, n.daemon(t, "etcd", "etcd", "--data-dir", p("etcd"), "--name", "node1",
		"--listen-client-urls", "http://127.0.0.1:2379", "--advertise-client-urls", "http://127.0.0.1:2379",
		"--listen-peer-urls", "http://127.0.0.1:2380", "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
		"--initial-cluster", "node1=http://127.0.0.1:2380", "--listen-metrics-urls", ""))
	n.control = append(n.control, n.daemon(t, "kube-apiserver", kubeBin("kube-apiserver"),
		"--etcd-servers", "http://127.0.0.1:2379",
		"--bind-address", "0.0.0.0", "--secure-port", "6443", "--advertise-address", nodeIP,
		"--cert-dir", p("apiserver"), "--tls-cert-file", p("apiserver.crt"), "--tls-private-key-file", p("apiserver.key"),
		"--client-ca-file", p("ca.crt"), "--token-auth-file", p("tokens.csv"), "--authorization-mode", "RBAC",
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file", p("sa.key"), "--service-account-signing-key-file", p("sa.key"),
		"--service-cluster-ip-range", serviceRange, "--allow-privileged",
		"--enable-priority-and-fairness=false", "--profiling=false"))
	if !nettest.Eventually(90*time.Second, func() bool { _, err := c.kubectl("get", "--raw", "/readyz"); return err == nil }) {
		t.Fatalf("the API server was not ready in 90 s:\n%s", n.log("kube-apiserver"))
	}
	n.control = append(n.control, n.daemon(t, "kube-controller-manager", kubeBin("kube-controller-manager"),
		"--kubeconfig", c.kubeconfig, "--leader-elect=false", "--secure-port", "0",
		"--service-account-private-key-file", p("sa.key"), "--root-ca-file", p("ca.crt"),
		// its FlexVolume prober makes this directory, by default
		// /usr/libexec/kubernetes/kubelet-plugins/volume/exec on the
		// machine, once a pod's volumes reach the attach-detach
		// controller: the suite's own instead
		"--flex-volume-plugin-dir", p("flex-volume-plugins"),
		// every node gets a subnet of the pods' network (flannel's kube
		// subnet manager takes it from the node's spec)
		"--allocate-node-cidrs", "--cluster-cidr", clusterCIDR, "--node-cidr-mask-size", "24",
		"--use-service-account-credentials=false", "--profiling=false"))
	n.control = append(n.control, n.daemon(t, "kube-scheduler", kubeBin("kube-scheduler"),
		"--kubeconfig", c.kubeconfig, "--leader-elect=false", "--secure-port", "0", "--profiling=false"))
	// Pods of a namespace are admitted once its service account exists
	// (the controller manager makes it).
	if !nettest.Eventually(60*time.Second, func() bool {
		_, err := c.kubectl("-n", "default", "get", "serviceaccount", "default")
		return err == nil
	}) {
		t.Fatalf("no default service account 60 s after the controller manager started:\n%s", n.log("kube-controller-manager"))
	}
	return c
}

// waitReady waits, up to 90 s, for node n to be Ready.
func (c *controlPlane) waitReady(t *testing.T, n *node) {
	t.Helper()
	if !nettest.Eventually(90*time.Second, func() bool {
		out, err := c.kubectl("get", "node", n.name, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
		return err == nil && out == "True"
	}) {
		out, _ := c.kubectl("get", "node", n.name, "-o", "yaml")
		t.Fatalf("%s not Ready 90 s after the kubelet started:\n%s\n%s", n.name, out, n.log("kubelet"))
	}
}

// waitPodCIDR waits, up to 60 s, for the controller manager to give
// node n its pod CIDR: flanneld started before that exits at once
// ("pod cidr not assigned") and never writes its subnet.env.
func (c *controlPlane) waitPodCIDR(t *testing.T, n *node) {
	t.Helper()
	if !nettest.Eventually(60*time.Second, func() bool {
		out, err := c.kubectl("get", "node", n.name, "-o", "jsonpath={.spec.podCIDR}")
		return err == nil && out != ""
	}) {
		out, _ := c.kubectl("get", "node", n.name, "-o", "yaml")
		t.Fatalf("%s: no pod CIDR 60 s after its kubelet started:\n%s", n.name, out)
	}
}

// kubectl runs the release's kubectl against the cluster and returns its
// output.
func (c *controlPlane) kubectl(args ...string) (string, error) {
	cmd := exec.Command(kubeBin("kubectl"), append([]string{"--kubeconfig", c.kubeconfig}, args...)...)
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		return string(out), fmt.Errorf("kubectl %s: %w\n%s", strings.Join(args, " "), err, stderr)
	}
	return string(out), nil
}

// mustKubectl is kubectl that fails the test on an error.
func (c *controlPlane) mustKubectl(t *testing.T, args ...string) string {
	t.Helper()
	out, err := c.kubectl(args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// writeKeys writes the cluster's CA, the API server's serving certificate
// (for 127.0.0.1, the node's address and the kubernetes service), the
// service accounts' signing key and the token file, and returns the
// admin token.
func (c *controlPlane) writeKeys(nodeIP string) (string, error) {
	p := func(name string) string { return filepath.Join(c.dir, name) }
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", err
	}
	now := time.Now()
	ca := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "portmap-kube-test-ca"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		return "", err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return "", err
	}
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", err
	}
	srv := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "kube-apiserver"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP(nodeIP), net.ParseIP("10.96.0.1")},
		DNSNames:    []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srv, caCert, &srvKey.PublicKey, caKey)
	if err != nil {
		return "", err
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", err
	}
	tok := make([]byte, 16)
	if _, err := rand.Read(tok); err != nil {
		return "", err
	}
	token := fmt.Sprintf("%x", tok)
	files := map[string][]byte{
		"ca.crt":        pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		"apiserver.crt": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srvDER}),
		"tokens.csv":    []byte(token + `,admin,admin,"system:masters"` + "\n"),
	}
	for name, key := range map[string]*ecdsa.PrivateKey{"apiserver.key": srvKey, "sa.key": saKey} {
		der, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			return "", err
		}
		files[name] = pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})
	}
	for name, data := range files {
		if err := os.WriteFile(p(name), data, 0o600); err != nil {
			return "", err
		}
	}
	return token, nil
}
