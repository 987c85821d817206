package stats

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cairn-os/cairn/agent/kubelet/cri"
)

// A runtime that is away makes Summary fail at once with the CRI call
// and its reason, rather than wait for the runtime.
func TestSummaryRuntimeAway(t *testing.T) {
	dir := t.TempDir()
	c, err := cri.New(filepath.Join(dir, "containerd.sock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	p := New(Config{NodeName: "n", Runtime: c.Runtime, Images: c.Images, RootDir: dir, PodLogRoot: dir})
	start := time.Now()
	_, err = p.Summary(t.Context(), false)
	if err == nil || !strings.Contains(err.Error(), "CRI ListPodSandbox") || !strings.Contains(err.Error(), "containerd.sock") {
		t.Errorf("Summary() with no runtime = %v, want the CRI call's error naming the socket", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Summary() with no runtime took %v, want it to fail at once", d)
	}
}
