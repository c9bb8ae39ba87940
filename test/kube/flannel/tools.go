//go:build tools

// flanneld of the kube suite's two-node cluster (make kube-test), built
// from the Go module proxy at a pinned release in a module of its own.
package flannel

import _ "github.com/flannel-io/flannel"
