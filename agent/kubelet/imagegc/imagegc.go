// Package imagegc removes the node's unused images when the filesystem
// of its images fills, as the kubelet's image garbage collector does: once
// the filesystem is HighThresholdPercent full, the images that no
// container uses (running or not), that are not pinned (the runtime pins
// the pod sandbox image) and that the node has known for MinAge are
// removed, the least recently used first, until LowThresholdPercent would
// be reached.
//
//	gc := imagegc.New(imagegc.Config{Runtime: rt.Runtime, Images: rt.Images})
//	go gc.Run(ctx)
package imagegc

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// The kubelet's defaults.
const (
	DefaultHighThresholdPercent = 85
	DefaultLowThresholdPercent  = 80
	DefaultMinAge               = 2 * time.Minute
	DefaultInterval             = 5 * time.Minute
)

// Config is what New needs; zero fields take the defaults.
type Config struct {
	Runtime criv1.RuntimeServiceClient
	Images  criv1.ImageServiceClient
	// HighThresholdPercent of the image filesystem used starts a
	// collection, which frees space down to LowThresholdPercent.
	HighThresholdPercent, LowThresholdPercent int
	// MinAge is how long an image is known to the node before it may be
	// removed, for an image pulled for a container not created yet.
	MinAge time.Duration
	// Interval is how often Run looks.
	Interval time.Duration
	// Now is the clock; time.Now if nil.
	Now func() time.Time
	// Log receives what is removed; slog.Default() if nil.
	Log *slog.Logger
}

// GC is the node's image garbage collector. Its methods may be called
// from many goroutines.
type GC struct {
	cfg Config

	mu    sync.Mutex
	known map[string]*record // by image ID
}

// record is what the collector knows of one image.
type record struct {
	firstSeen, lastUsed time.Time
	// inUse and pinned are as the last detect found them.
	inUse, pinned bool
	size          uint64
	refs          []string
}

// New returns the collector of cfg.
func New(cfg Config) *GC {
	cfg.HighThresholdPercent = cmp.Or(cfg.HighThresholdPercent, DefaultHighThresholdPercent)
	cfg.LowThresholdPercent = cmp.Or(cfg.LowThresholdPercent, DefaultLowThresholdPercent)
	cfg.MinAge = cmp.Or(cfg.MinAge, DefaultMinAge)
	cfg.Interval = cmp.Or(cfg.Interval, DefaultInterval)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	return &GC{cfg: cfg, known: map[string]*record{}}
}

// Run collects every Interval until ctx ends, logging what fails.
func (g *GC) Run(ctx context.Context) {
	t := time.NewTicker(g.cfg.Interval)
	defer t.Stop()
	for {
		if _, err := g.Collect(ctx); err != nil && ctx.Err() == nil {
			g.cfg.Log.Warn("image garbage collection", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Result is what a collection did.
type Result struct {
	// UsedPercent is how full the image filesystem was.
	UsedPercent int
	// Removed are the images removed, by their first reference (or ID),
	// and Freed their size.
	Removed []string
	Freed   uint64
}

// Collect notes which images are in use, and removes unused ones if the
// image filesystem is HighThresholdPercent full.
func (g *GC) Collect(ctx context.Context) (Result, error) {
	if err := g.detect(ctx); err != nil {
		return Result{}, err
	}
	fsi, err := g.cfg.Images.ImageFsInfo(ctx, &criv1.ImageFsInfoRequest{})
	if err != nil {
		return Result{}, fmt.Errorf("CRI ImageFsInfo: %w", err)
	}
	if len(fsi.ImageFilesystems) == 0 || fsi.ImageFilesystems[0].FsId == nil {
		return Result{}, errors.New("the runtime tells no image filesystem")
	}
	var st unix.Statfs_t
	mount := fsi.ImageFilesystems[0].FsId.Mountpoint
	if err := unix.Statfs(mount, &st); err != nil {
		return Result{}, fmt.Errorf("statfs %s: %w", mount, err)
	}
	capacity, available := st.Blocks*uint64(st.Bsize), st.Bavail*uint64(st.Bsize)
	if capacity == 0 {
		return Result{}, fmt.Errorf("%s has no capacity", mount)
	}
	res := Result{UsedPercent: int(100 - available*100/capacity)}
	if res.UsedPercent < g.cfg.HighThresholdPercent {
		return res, nil
	}
	want := capacity*uint64(100-g.cfg.LowThresholdPercent)/100 - available
	var errs []error
	for _, id := range g.candidates(g.cfg.Now(), want) {
		name := g.name(id)
		if _, err := g.cfg.Images.RemoveImage(ctx, &criv1.RemoveImageRequest{Image: &criv1.ImageSpec{Image: id}}); err != nil {
			errs = append(errs, fmt.Errorf("remove image %s: %w", name, err))
			continue
		}
		g.mu.Lock()
		res.Freed += g.known[id].size
		delete(g.known, id)
		g.mu.Unlock()
		res.Removed = append(res.Removed, name)
	}
	g.cfg.Log.Info("image garbage collection", "used percent", res.UsedPercent, "high", g.cfg.HighThresholdPercent,
		"low", g.cfg.LowThresholdPercent, "to free", want, "freed", res.Freed, "removed", res.Removed)
	if res.Freed < want {
		errs = append(errs, fmt.Errorf("freed %d bytes of the %d wanted: the rest is in use", res.Freed, want))
	}
	return res, errors.Join(errs...)
}

// detect notes the images the runtime has, when each was first seen, and
// marks those containers use as used now; it forgets removed images.
func (g *GC) detect(ctx context.Context) error {
	imgs, err := g.cfg.Images.ListImages(ctx, &criv1.ListImagesRequest{})
	if err != nil {
		return fmt.Errorf("CRI ListImages: %w", err)
	}
	ctrs, err := g.cfg.Runtime.ListContainers(ctx, &criv1.ListContainersRequest{})
	if err != nil {
		return fmt.Errorf("CRI ListContainers: %w", err)
	}
	used := map[string]bool{}
	for _, c := range ctrs.Containers {
		used[c.ImageRef] = true
		if c.Image != nil {
			used[c.Image.Image] = true
		}
	}
	now := g.cfg.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	seen := map[string]bool{}
	for _, img := range imgs.Images {
		seen[img.Id] = true
		r := g.known[img.Id]
		if r == nil {
			r = &record{firstSeen: now}
			g.known[img.Id] = r
		}
		r.size, r.refs, r.pinned = img.Size, img.RepoTags, img.Pinned
		r.inUse = used[img.Id] || slices.ContainsFunc(slices.Concat(img.RepoTags, img.RepoDigests), func(ref string) bool { return used[ref] })
		if r.inUse {
			r.lastUsed = now
		}
	}
	for id := range g.known {
		if !seen[id] {
			delete(g.known, id)
		}
	}
	return nil
}

// candidates are the images to remove to free want bytes, the least
// recently used first: those neither in use nor pinned at the last
// detect, known for MinAge.
func (g *GC) candidates(now time.Time, want uint64) []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	type cand struct {
		id   string
		last time.Time
		size uint64
	}
	var cs []cand
	for id, r := range g.known {
		if r.inUse || r.pinned || now.Sub(r.firstSeen) < g.cfg.MinAge {
			continue
		}
		cs = append(cs, cand{id, cmp.Or(r.lastUsed, r.firstSeen), r.size})
	}
	slices.SortFunc(cs, func(a, b cand) int {
		return cmp.Or(a.last.Compare(b.last), cmp.Compare(a.id, b.id))
	})
	var out []string
	var total uint64
	for _, c := range cs {
		if total >= want {
			break
		}
		out = append(out, c.id)
		total += c.size
	}
	return out
}

// name is how an image is named in logs: its first tag, else its ID.
func (g *GC) name(id string) string {
	g.mu.Lock()
	defer g.mu.Unlock()
	if r := g.known[id]; r != nil && len(r.refs) > 0 {
		return r.refs[0]
	}
	return id
}
