package imagegc

import (
	"context"
	"log/slog"
	"path/filepath"
	"slices"
	"testing"
	"time"

	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cairn-os/cairn/test/registry"
	"github.com/cairn-os/cairn/test/runtime"
)

// TestCollect runs the collector against a real containerd holding three
// pulled images, one of them used by a container (created, never
// started), and its pinned sandbox image: with MinAge not passed nothing
// goes; then, with the filesystem over the threshold, the two unused
// images are removed and the used one and the sandbox image stay.
func TestCollect(t *testing.T) {
	rt := runtime.Start(t)
	reg := registry.Start(t)
	if err := rt.AllowHTTP(reg.Addr); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var refs []string
	for _, pkg := range []string{"./test/images/hello", "./agent/kubelet/testdata/probee", "./agent/kubelet/pods/testdata/echoexit"} {
		tag := "cairn-test/" + filepath.Base(pkg) + ":v1"
		if _, err := registry.BuildAndPush(ctx, reg, pkg, tag); err != nil {
			t.Fatal(err)
		}
		ref := reg.Addr + "/" + tag
		if _, err := rt.ImageClient.PullImage(ctx, &criv1.PullImageRequest{Image: &criv1.ImageSpec{Image: ref}}); err != nil {
			t.Fatal(err)
		}
		refs = append(refs, ref)
	}
	used := refs[0]
	sandbox := &criv1.PodSandboxConfig{Metadata: &criv1.PodSandboxMetadata{Name: "gc", Namespace: "test", Uid: "gc"}, LogDirectory: t.TempDir()}
	sb, err := rt.RuntimeClient.RunPodSandbox(ctx, &criv1.RunPodSandboxRequest{Config: sandbox})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rt.RuntimeClient.CreateContainer(ctx, &criv1.CreateContainerRequest{PodSandboxId: sb.PodSandboxId, SandboxConfig: sandbox,
		Config: &criv1.ContainerConfig{Metadata: &criv1.ContainerMetadata{Name: "c"}, Image: &criv1.ImageSpec{Image: used}, LogPath: "c.log"}}); err != nil {
		t.Fatal(err)
	}
	images := func() []string {
		resp, err := rt.ImageClient.ListImages(ctx, &criv1.ListImagesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		var tags []string
		for _, img := range resp.Images {
			tags = append(tags, img.RepoTags...)
		}
		slices.Sort(tags)
		return tags
	}
	before := images()

	now := time.Now()
	clock := func() time.Time { return now }
	// Any use of the filesystem is over these thresholds: every image
	// that may go, goes.
	gc := New(Config{Runtime: rt.RuntimeClient, Images: rt.ImageClient, HighThresholdPercent: 1, LowThresholdPercent: 1,
		MinAge: time.Minute, Now: clock, Log: slog.New(slog.DiscardHandler)})
	res, err := gc.Collect(ctx)
	if len(res.Removed) != 0 {
		t.Errorf("images known for less than MinAge removed: %v", res.Removed)
	}
	if err == nil {
		t.Errorf("Collect() with nothing it may remove = nil, want it to say it freed too little")
	}
	now = now.Add(2 * time.Minute)
	res, _ = gc.Collect(ctx)
	slices.Sort(res.Removed)
	if want := slices.Sorted(slices.Values(refs[1:])); !slices.Equal(res.Removed, want) {
		t.Errorf("removed %v, want the unused %v", res.Removed, want)
	}
	after := images()
	for _, keep := range []string{used, "cairn.dev/pause:1.0"} {
		if !slices.Contains(after, keep) {
			t.Errorf("%s removed (images before %v, after %v), want it kept", keep, before, after)
		}
	}
	if res.Freed == 0 || res.UsedPercent < 1 {
		t.Errorf("result %+v, want bytes freed and the filesystem's use", res)
	}
}

// TestCandidates orders the unused images by when they were last used,
// the oldest first, and takes no more than the space asked for needs.
func TestCandidates(t *testing.T) {
	t0 := time.Unix(1000, 0)
	g := New(Config{MinAge: time.Minute})
	g.known = map[string]*record{
		"recent":  {firstSeen: t0, lastUsed: t0.Add(50 * time.Minute), size: 10},
		"old":     {firstSeen: t0, lastUsed: t0.Add(10 * time.Minute), size: 10},
		"never":   {firstSeen: t0, size: 10},
		"in-use":  {firstSeen: t0, inUse: true, size: 10},
		"pinned":  {firstSeen: t0, pinned: true, size: 10},
		"too-new": {firstSeen: t0.Add(59*time.Minute + 30*time.Second), size: 10},
	}
	now := t0.Add(time.Hour)
	if got, want := g.candidates(now, 15), []string{"never", "old"}; !slices.Equal(got, want) {
		t.Errorf("candidates(15 bytes) = %v, want %v", got, want)
	}
	if got, want := g.candidates(now, 1000), []string{"never", "old", "recent"}; !slices.Equal(got, want) {
		t.Errorf("candidates(1000 bytes) = %v, want %v", got, want)
	}
}
