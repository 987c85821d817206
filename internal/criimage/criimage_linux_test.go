package criimage_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"

	"github.com/cairn-os/cairn/internal/criimage"
	"github.com/cairn-os/cairn/internal/layout"
	"github.com/cairn-os/cairn/test/need"
	"github.com/cairn-os/cairn/test/runtime"
)

// TestImportPinned imports the sandbox image into a real containerd again
// (the runtime did once, as a node does at each start of containerd): it
// is idempotent, the image stays pinned and unpacked; an archive that does
// not hold the image asked for is an error naming both.
func TestImportPinned(t *testing.T) {
	need.Root(t, "containerd")
	rt := runtime.Start(t)
	archive := filepath.Join(rt.Dir, "pause.tar") // written by runtime.Start
	if _, err := os.Stat(archive); err != nil {
		t.Fatalf("the runtime's sandbox archive: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := criimage.ImportPinned(ctx, rt.Socket, archive, layout.SandboxImage); err != nil {
		t.Fatalf("ImportPinned() again = %v, want nil", err)
	}
	c, err := containerd.New(rt.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	nctx := namespaces.WithNamespace(ctx, criimage.CRINamespace)
	img, err := c.GetImage(nctx, layout.SandboxImage)
	if err != nil {
		t.Fatalf("GetImage(%s) = %v", layout.SandboxImage, err)
	}
	if got := img.Labels()["io.cri-containerd.pinned"]; got != "pinned" {
		t.Errorf("label io.cri-containerd.pinned = %q, want pinned", got)
	}
	if unpacked, err := img.IsUnpacked(nctx, ""); err != nil || !unpacked {
		t.Errorf("IsUnpacked() = %v, %v; want true", unpacked, err)
	}

	err = criimage.ImportPinned(ctx, rt.Socket, archive, "registry.example/other:v1")
	if err == nil || !strings.Contains(err.Error(), "does not hold registry.example/other:v1") {
		t.Errorf("ImportPinned(another ref) = %v, want an error that the archive does not hold it", err)
	}
}
