package containers

import (
	"context"
	"encoding/json"
	"fmt"
	"io"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/containerd/containerd/v2/core/remotes/docker/config"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// PullBlob pulls the OCI artifact ref with the containerd at socket
// (through the registry hosts of hostsDir, as service images are) and
// copies to w its one layer of mediaType. The content is held by a lease
// for the call alone: containerd collects it afterwards. The descriptor
// returned is the layer's, whose size and digest containerd checked.
func PullBlob(ctx context.Context, socket, hostsDir, ref, mediaType string, w io.Writer) (ocispec.Descriptor, error) {
	c, err := containerd.New(socket)
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("connect to containerd: %w", err)
	}
	defer c.Close()
	ctx = namespaces.WithNamespace(ctx, Namespace)
	ctx, done, err := c.WithLease(ctx)
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("lease: %w", err)
	}
	defer done(context.WithoutCancel(ctx))
	resolver := docker.NewResolver(docker.ResolverOptions{
		Hosts: config.ConfigureHosts(ctx, config.HostOptions{HostDir: config.HostDirFromRoot(hostsDir)}),
	})
	img, err := c.Fetch(ctx, ref, containerd.WithResolver(resolver))
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("pull %s: %w", ref, err)
	}
	if img.Target.MediaType != ocispec.MediaTypeImageManifest {
		return ocispec.Descriptor{}, fmt.Errorf("%s is a %s, not an OCI image manifest", ref, img.Target.MediaType)
	}
	store := c.ContentStore()
	raw, err := content.ReadBlob(ctx, store, img.Target)
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("read the manifest of %s: %w", ref, err)
	}
	var m ocispec.Manifest
	if err := json.Unmarshal(raw, &m); err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("the manifest of %s: %w", ref, err)
	}
	var layer *ocispec.Descriptor
	for i, l := range m.Layers {
		if l.MediaType == mediaType {
			if layer != nil {
				return ocispec.Descriptor{}, fmt.Errorf("%s has more than one layer of type %s", ref, mediaType)
			}
			layer = &m.Layers[i]
		}
	}
	if layer == nil {
		return ocispec.Descriptor{}, fmt.Errorf("%s has no layer of type %s", ref, mediaType)
	}
	ra, err := store.ReaderAt(ctx, *layer)
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("read %s's layer: %w", ref, err)
	}
	defer ra.Close()
	if _, err := io.Copy(w, content.NewReader(ra)); err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("copy %s's layer: %w", ref, err)
	}
	return *layer, nil
}
