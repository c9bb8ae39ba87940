//go:build kube

package kube

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"time"
)

// ociArchive writes an OCI image archive (an image layout in a tar, as
// `ctr images import` reads it) named name: one uncompressed layer
// holding files (path in the image → file on this machine, mode 0755),
// run as entrypoint with env. The suite's images are made this way from
// static binaries, so nothing is pulled and no builder is needed.
func ociArchive(path, name string, files map[string]string, entrypoint, env []string) error {
	layer, err := tarOf(files)
	if err != nil {
		return err
	}
	blobs := map[string][]byte{}
	put := func(b []byte) (string, int) {
		sum := sha256.Sum256(b)
		d := "sha256:" + hex.EncodeToString(sum[:])
		blobs[d] = b
		return d, len(b)
	}
	layerDigest, layerSize := put(layer)
	config, _ := json.Marshal(map[string]any{
		"architecture": "amd64",
		"os":           "linux",
		"config":       map[string]any{"Entrypoint": entrypoint, "Env": env},
		"rootfs":       map[string]any{"type": "layers", "diff_ids": []string{layerDigest}},
	})
	configDigest, configSize := put(config)
	manifest, _ := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        map[string]any{"mediaType": "application/vnd.oci.image.config.v1+json", "digest": configDigest, "size": configSize},
		"layers":        []any{map[string]any{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layerDigest, "size": layerSize}},
	})
	manifestDigest, manifestSize := put(manifest)
	index, _ := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"manifests": []any{map[string]any{
			"mediaType":   "application/vnd.oci.image.manifest.v1+json",
			"digest":      manifestDigest,
			"size":        manifestSize,
			"platform":    map[string]string{"architecture": "amd64", "os": "linux"},
			"annotations": map[string]string{"io.containerd.image.name": name},
		}},
	})
	var out bytes.Buffer
	tw := tar.NewWriter(&out)
	add := func(name string, b []byte) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(b)), ModTime: time.Unix(0, 0), Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		_, err := tw.Write(b)
		return err
	}
	if err := add("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return err
	}
	if err := add("index.json", index); err != nil {
		return err
	}
	for d, b := range blobs {
		if err := add("blobs/sha256/"+d[len("sha256:"):], b); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return os.WriteFile(path, out.Bytes(), 0o644)
}

// tarOf is a layer: each file of files at its path in the image, and the
// directories above it.
func tarOf(files map[string]string) ([]byte, error) {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	dirs := map[string]bool{}
	for in, from := range files {
		data, err := os.ReadFile(from)
		if err != nil {
			return nil, fmt.Errorf("image file: %w", err)
		}
		for i := 1; i < len(in); i++ {
			if in[i] == '/' && !dirs[in[1:i]] {
				dirs[in[1:i]] = true
				if err := tw.WriteHeader(&tar.Header{Name: in[1:i] + "/", Mode: 0o755, Typeflag: tar.TypeDir, ModTime: time.Unix(0, 0)}); err != nil {
					return nil, err
				}
			}
		}
		if err := tw.WriteHeader(&tar.Header{Name: in[1:], Mode: 0o755, Size: int64(len(data)), Typeflag: tar.TypeReg, ModTime: time.Unix(0, 0)}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}
