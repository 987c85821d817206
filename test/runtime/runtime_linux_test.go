package runtime

import (
	"path/filepath"

	"context"
	"github.com/vishvananda/netlink"
	"os"
	"testing"

	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func TestStart(t *testing.T) {
	rt := Start(t)
	ctx := context.Background()
	v, err := rt.RuntimeClient.Version(ctx, &criv1.VersionRequest{})
	if err != nil {
		t.Fatalf("Version: %v", err)
	}
	t.Logf("CRI %s %s", v.RuntimeName, v.RuntimeVersion)
	imgs, err := rt.ImageClient.ListImages(ctx, &criv1.ListImagesRequest{})
	if err != nil {
		t.Fatalf("ListImages: %v", err)
	}
	var pinned bool
	for _, im := range imgs.Images {
		for _, tag := range im.RepoTags {
			if tag == "cairn.dev/pause:1.0" && im.Pinned {
				pinned = true
			}
		}
	}
	if !pinned {
		t.Errorf("ListImages = %v, want cairn.dev/pause:1.0 pinned", imgs.Images)
	}
	if _, err := os.Stat(rt.Socket); err != nil {
		t.Errorf("socket: %v", err)
	}
}

// TestCleanup leaves a pod sandbox running and checks that the end of the
// test takes away everything containerd and CNI made for it.
func TestCleanup(t *testing.T) {
	var rt *Runtime
	t.Run("sandbox", func(t *testing.T) {
		rt = Start(t)
		_, err := rt.RuntimeClient.RunPodSandbox(context.Background(), &criv1.RunPodSandboxRequest{Config: &criv1.PodSandboxConfig{
			Metadata: &criv1.PodSandboxMetadata{Name: "left", Namespace: "default", Uid: "uid-left"},
			Hostname: "left",
		}})
		if err != nil {
			t.Fatalf("RunPodSandbox: %v", err)
		}
	})
	if rt == nil {
		t.Fatal("no runtime: see the sandbox subtest")
	}
	if m := mountsUnder(rt.Dir); len(m) != 0 {
		t.Errorf("mounts left under %s: %q", rt.Dir, m)
	}
	if _, err := netlink.LinkByName(rt.bridge); err == nil {
		t.Errorf("bridge %s left behind", rt.bridge)
	}
	for _, id := range rt.sandboxes {
		if m, _ := filepath.Glob(filepath.Join(cniResultsDir, "*"+id+"*")); len(m) != 0 {
			t.Errorf("CNI results left: %q", m)
		}
	}
	if len(rt.sandboxes) != 1 {
		t.Errorf("cleanup saw sandboxes %q, want the one left running", rt.sandboxes)
	}
	select {
	case <-rt.exited:
	default:
		t.Errorf("containerd still runs")
	}
}
