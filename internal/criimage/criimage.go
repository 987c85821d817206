// Package criimage puts images that a node ships into the CRI's containerd
// namespace: the pod sandbox image is imported from its archive, unpacked
// and pinned, never pulled. Init does it on the node; host tests do it for
// their own containerd.
package criimage

import (
	"context"
	"fmt"
	"os"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
)

// CRINamespace is the containerd namespace of the CRI: pods' images and
// containers.
const CRINamespace = "k8s.io"

// pinnedLabel keeps an image from the CRI's image garbage collection.
const pinnedLabel = "io.cri-containerd.pinned"

// ImportPinned imports the image archive into the CRI's namespace, unpacks
// it and pins it. It is idempotent: the node runs it each time containerd
// becomes ready.
func ImportPinned(ctx context.Context, socket, archive, ref string) error {
	c, err := containerd.New(socket)
	if err != nil {
		return fmt.Errorf("connect to containerd: %w", err)
	}
	defer c.Close()
	ctx = namespaces.WithNamespace(ctx, CRINamespace)
	f, err := os.Open(archive)
	if err != nil {
		return err
	}
	defer f.Close()
	imgs, err := c.Import(ctx, f, containerd.WithImageLabels(map[string]string{pinnedLabel: "pinned"}))
	if err != nil {
		return fmt.Errorf("import %s: %w", archive, err)
	}
	for _, img := range imgs {
		if img.Name != ref {
			continue
		}
		if err := containerd.NewImage(c, img).Unpack(ctx, ""); err != nil {
			return fmt.Errorf("unpack %s: %w", ref, err)
		}
		return nil
	}
	return fmt.Errorf("%s does not hold %s", archive, ref)
}
