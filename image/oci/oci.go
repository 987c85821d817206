// Package oci makes small OCI images from a single static binary, the way
// Cairn ships its own images (the pod sandbox) and its tests build theirs:
// one layer, root-owned files, fixed times, so the same binary always gives
// the same digest. It also pushes a UKI to a registry as an OCI artifact,
// for upgrades that a node pulls.
package oci

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"path"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// BinaryImage returns a linux/amd64 image holding binary at binPath (an
// absolute path), which is its entrypoint. created stamps the files and the
// config.
func BinaryImage(binary []byte, binPath string, created time.Time) (v1.Image, error) {
	layerTar, err := layerWith(binPath, binary, created)
	if err != nil {
		return nil, fmt.Errorf("layer for %s: %w", binPath, err)
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("layer for %s: %w", binPath, err)
	}
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.AppendLayers(base, layer)
	if err != nil {
		return nil, err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg = cfg.DeepCopy()
	cfg.OS = "linux"
	cfg.Architecture = "amd64"
	cfg.Created = v1.Time{Time: created}
	for i := range cfg.History {
		cfg.History[i].Created = v1.Time{Time: created}
		cfg.History[i].CreatedBy = "cairn: single binary " + binPath
	}
	cfg.Config.Entrypoint = []string{binPath}
	cfg.Config.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	return mutate.ConfigFile(img, cfg)
}

// WriteArchive writes img, tagged ref, as an image archive (the `docker
// save` layout, which containerd imports).
func WriteArchive(img v1.Image, ref, out string) error {
	tag, err := name.NewTag(ref)
	if err != nil {
		return fmt.Errorf("image name %q: %w", ref, err)
	}
	if err := tarball.WriteToFile(out, tag, img); err != nil {
		return fmt.Errorf("write image archive %s: %w", out, err)
	}
	return nil
}

// layerWith returns an uncompressed tar holding the file at abs (with its
// parent directories), root-owned, mode 0755, stamped with mtime.
func layerWith(abs string, content []byte, mtime time.Time) ([]byte, error) {
	rel := strings.TrimPrefix(path.Clean(abs), "/")
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	var dirs []string
	for d := path.Dir(rel); d != "."; d = path.Dir(d) {
		dirs = append([]string{d}, dirs...)
	}
	for _, d := range dirs {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: mtime, Format: tar.FormatUSTAR}); err != nil {
			return nil, err
		}
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: rel, Mode: 0o755, Size: int64(len(content)), ModTime: mtime, Format: tar.FormatUSTAR}); err != nil {
		return nil, err
	}
	if _, err := tw.Write(content); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
