package containers

import (
	"context"
	"testing"
	"time"

	"github.com/cairn-os/cairn/internal/criimage"
	"github.com/cairn-os/cairn/internal/layout"
	"github.com/cairn-os/cairn/test/need"
	"github.com/cairn-os/cairn/test/runtime"
)

// TestList reports a real containerd's namespaces and images: the CRI's
// namespace holds the sandbox image that the runtime imported, with its
// digest and size.
func TestList(t *testing.T) {
	need.Root(t, "containerd")
	rt := runtime.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nss, err := List(ctx, rt.Socket)
	if err != nil {
		t.Fatalf("List() = %v", err)
	}
	for _, ns := range nss {
		if ns.Name != criimage.CRINamespace {
			continue
		}
		for _, im := range ns.Images {
			if im.Name == layout.SandboxImage {
				if im.Digest == "" || im.Size <= 0 {
					t.Errorf("List(): %s has digest %q, size %d; want both", im.Name, im.Digest, im.Size)
				}
				return
			}
		}
		t.Fatalf("List(): namespace %s has images %v, want %s", ns.Name, ns.Images, layout.SandboxImage)
	}
	t.Fatalf("List() = %v, want namespace %s", nss, criimage.CRINamespace)
}

// TestListNoContainerd: without containerd, List says it cannot reach it.
func TestListNoContainerd(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := List(ctx, t.TempDir()+"/none.sock"); err == nil {
		t.Error("List(no containerd) = nil error, want one")
	}
}
