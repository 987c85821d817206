//go:build bench

package bench

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cairn-os/cairn/test/runtime"
)

// criFloor starts podCount pods straight through the CRI, one after
// another and then all at once, and returns how long the three calls of
// each took: RunPodSandbox, CreateContainer and StartContainer; and for
// the concurrent run, the CPU times of containerd (process containerd)
// and the host.
func criFloor(b *testing.B, rt *runtime.Runtime, containerd int, image string) nodeFigures {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	logs := b.TempDir()
	var f nodeFigures
	for i := range podCount {
		d, err := startOnCRI(ctx, rt, image, logs, fmt.Sprintf("floor-seq-%d", i))
		if err != nil {
			b.Fatal(err)
		}
		f.seq = append(f.seq, d)
	}
	if err := removeSandboxes(ctx, rt); err != nil {
		b.Fatal(err)
	}

	f.conc = make([]time.Duration, podCount)
	errs := make([]error, podCount)
	var wg sync.WaitGroup
	cpu0, err := readCPUTimes(0, containerd)
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	for i := range podCount {
		wg.Go(func() { f.conc[i], errs[i] = startOnCRI(ctx, rt, image, logs, fmt.Sprintf("floor-conc-%d", i)) })
	}
	wg.Wait()
	f.concWall = time.Since(start)
	if err := f.since(cpu0, 0, containerd); err != nil {
		b.Fatal(err)
	}
	if err := errors.Join(errs...); err != nil {
		b.Fatal(err)
	}
	if err := removeSandboxes(ctx, rt); err != nil {
		b.Fatal(err)
	}
	return f
}

// startOnCRI starts a pod named name of one container of image, as a
// kubelet would ask for it, and returns how long that took.
func startOnCRI(ctx context.Context, rt *runtime.Runtime, image, logs, name string) (time.Duration, error) {
	sandbox := &criv1.PodSandboxConfig{
		Metadata:     &criv1.PodSandboxMetadata{Name: name, Namespace: "bench", Uid: name},
		Hostname:     name,
		LogDirectory: filepath.Join(logs, name),
		Linux: &criv1.LinuxPodSandboxConfig{SecurityContext: &criv1.LinuxSandboxSecurityContext{
			NamespaceOptions: &criv1.NamespaceOption{Pid: criv1.NamespaceMode_CONTAINER},
		}},
	}
	ctr := &criv1.ContainerConfig{
		Metadata: &criv1.ContainerMetadata{Name: "hello"},
		Image:    &criv1.ImageSpec{Image: image},
		LogPath:  "hello/0.log",
		Linux:    &criv1.LinuxContainerConfig{},
	}
	start := time.Now()
	sb, err := rt.RuntimeClient.RunPodSandbox(ctx, &criv1.RunPodSandboxRequest{Config: sandbox})
	if err != nil {
		return 0, fmt.Errorf("RunPodSandbox %s: %w", name, err)
	}
	c, err := rt.RuntimeClient.CreateContainer(ctx, &criv1.CreateContainerRequest{
		PodSandboxId: sb.PodSandboxId, Config: ctr, SandboxConfig: sandbox,
	})
	if err != nil {
		return 0, fmt.Errorf("CreateContainer in %s: %w", name, err)
	}
	if _, err := rt.RuntimeClient.StartContainer(ctx, &criv1.StartContainerRequest{ContainerId: c.ContainerId}); err != nil {
		return 0, fmt.Errorf("StartContainer in %s: %w", name, err)
	}
	return time.Since(start), nil
}

// removeSandboxes stops and removes every pod sandbox of rt, and with them
// their containers.
func removeSandboxes(ctx context.Context, rt *runtime.Runtime) error {
	resp, err := rt.RuntimeClient.ListPodSandbox(ctx, &criv1.ListPodSandboxRequest{})
	if err != nil {
		return fmt.Errorf("list pod sandboxes: %w", err)
	}
	var errs []error
	for _, sb := range resp.Items {
		if _, err := rt.RuntimeClient.StopPodSandbox(ctx, &criv1.StopPodSandboxRequest{PodSandboxId: sb.Id}); err != nil {
			errs = append(errs, fmt.Errorf("stop pod sandbox %s: %w", sb.Id, err))
		}
		if _, err := rt.RuntimeClient.RemovePodSandbox(ctx, &criv1.RemovePodSandboxRequest{PodSandboxId: sb.Id}); err != nil {
			errs = append(errs, fmt.Errorf("remove pod sandbox %s: %w", sb.Id, err))
		}
	}
	return errors.Join(errs...)
}

// sandboxCount is how many pod sandboxes rt holds, ready or not.
func sandboxCount(ctx context.Context, rt *runtime.Runtime) (int, error) {
	resp, err := rt.RuntimeClient.ListPodSandbox(ctx, &criv1.ListPodSandboxRequest{})
	if err != nil {
		return 0, fmt.Errorf("list pod sandboxes: %w", err)
	}
	return len(resp.Items), nil
}
