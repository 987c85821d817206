// Package logrotate keeps the node's container logs from filling its disk:
// a running container's log file that grew past MaxSize is renamed with a
// timestamp and the runtime is asked to reopen it (CRI ReopenContainerLog),
// and of a container's rotated files only the newest MaxFiles-1 are kept,
// as the kubelet does with containerLogMaxSize and containerLogMaxFiles.
//
//	r := &logrotate.Rotator{Runtime: rt}
//	go r.Run(ctx)
package logrotate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"time"

	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// The kubelet's defaults.
const (
	DefaultMaxSize  = 10 << 20
	DefaultMaxFiles = 5
	DefaultInterval = 10 * time.Second
)

// stamp is the suffix of a rotated file: its log path, a dot and the time
// of the rotation, which sorts as it happened.
const stamp = "20060102-150405.000000000"

// Rotator rotates the logs of the runtime's running containers. Its fields
// are set before Run.
type Rotator struct {
	Runtime criv1.RuntimeServiceClient
	// MaxSize is the size in bytes past which a log is rotated; 0 means
	// DefaultMaxSize.
	MaxSize int64
	// MaxFiles is how many files of a container's log are kept, the one
	// being written included (at least 2); 0 means DefaultMaxFiles.
	MaxFiles int
	// Interval is how often the logs are checked; 0 means DefaultInterval.
	Interval time.Duration
	// Log receives what fails; nil means slog.Default().
	Log *slog.Logger
	// Now is the clock of the rotated files' names; time.Now if nil.
	Now func() time.Time
}

// Run checks the logs every Interval until ctx ends.
func (r *Rotator) Run(ctx context.Context) {
	interval := r.Interval
	if interval == 0 {
		interval = DefaultInterval
	}
	log := r.Log
	if log == nil {
		log = slog.Default()
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if err := r.Rotate(ctx); err != nil && ctx.Err() == nil {
			log.Warn("container log rotation", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Rotate checks the log of every running container once.
func (r *Rotator) Rotate(ctx context.Context) error {
	resp, err := r.Runtime.ListContainers(ctx, &criv1.ListContainersRequest{
		Filter: &criv1.ContainerFilter{State: &criv1.ContainerStateValue{State: criv1.ContainerState_CONTAINER_RUNNING}},
	})
	if err != nil {
		return fmt.Errorf("list running containers: %w", err)
	}
	var errs []error
	for _, c := range resp.Containers {
		st, err := r.Runtime.ContainerStatus(ctx, &criv1.ContainerStatusRequest{ContainerId: c.Id})
		if err != nil {
			errs = append(errs, fmt.Errorf("status of container %s: %w", c.Id, err))
			continue
		}
		if path := st.GetStatus().GetLogPath(); path != "" {
			if err := r.rotate(ctx, c.Id, path); err != nil {
				errs = append(errs, fmt.Errorf("container %s: %w", c.Id, err))
			}
		}
	}
	return errors.Join(errs...)
}

// rotate rotates the log at path of container id if it is too large, and
// removes its oldest rotated files beyond MaxFiles.
func (r *Rotator) rotate(ctx context.Context, id, path string) error {
	maxSize, maxFiles := r.MaxSize, r.MaxFiles
	if maxSize == 0 {
		maxSize = DefaultMaxSize
	}
	if maxFiles == 0 {
		maxFiles = DefaultMaxFiles
	}
	maxFiles = max(maxFiles, 2)
	st, err := os.Stat(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil // not written yet
		}
		return err
	}
	if st.Size() > maxSize {
		now := time.Now
		if r.Now != nil {
			now = r.Now
		}
		rotated := path + "." + now().UTC().Format(stamp)
		if err := os.Rename(path, rotated); err != nil {
			return fmt.Errorf("rotate %s: %w", path, err)
		}
		if _, err := r.Runtime.ReopenContainerLog(ctx, &criv1.ReopenContainerLogRequest{ContainerId: id}); err != nil {
			// The runtime still writes to the renamed file: put it back
			// rather than lose the lines to come.
			if rerr := os.Rename(rotated, path); rerr != nil {
				return errors.Join(fmt.Errorf("reopen %s: %w", path, err), rerr)
			}
			return fmt.Errorf("reopen %s: %w", path, err)
		}
	}
	old, err := filepath.Glob(path + ".*")
	if err != nil {
		return err
	}
	slices.Sort(old)
	var errs []error
	for len(old) > maxFiles-1 {
		if err := os.Remove(old[0]); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
		old = old[1:]
	}
	return errors.Join(errs...)
}
