// Package containers is init's side of containerd. It runs system services
// from OCI images: a Launcher pulls the image (through the registry hosts of
// containerd's certs.d), makes a container on the host network in the
// service's own cgroup, and starts its task; each Launch is one run, so the
// supervisor restarts it with backoff and a failed pull is retried, its
// error the reason shown for the service. A run outlives a restart of
// containerd: its shim is in a cgroup of its own, and the Launcher waits
// for the task again once containerd is back. List reports what containerd
// holds.
package containers

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/containerd/containerd/v2/core/remotes/docker/config"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cairn-os/cairn/init/internal/boot"
	"github.com/cairn-os/cairn/machineconfig"
	"github.com/cairn-os/cairn/supervisor"
)

// Namespace is the containerd namespace of system services, apart from the
// CRI's k8s.io.
const Namespace = "system"

// Launcher starts runs of one image-backed service.
type Launcher struct {
	Socket   string // containerd's socket
	HostsDir string // containerd's certs.d, for pulls
	// ShimCgroup, if set, is the cgroup of the run's shim (ShimCgroup on a
	// node), apart from containerd's own.
	ShimCgroup string
	Service    machineconfig.Service
}

// ShimCgroup holds the containerd shims of system services, apart from
// containerd's own cgroup: restarting containerd must not kill them.
const ShimCgroup = "/system/shims"

// cgroupRoot is where cgroup v2 is mounted on the node; the OCI spec wants
// cgroup paths relative to it.
const cgroupRoot = "/sys/fs/cgroup"

// Launch pulls the image if needed and starts a fresh container for it.
func (l *Launcher) Launch(ctx context.Context, opts supervisor.LaunchOptions) (supervisor.Instance, error) {
	c, err := containerd.New(l.Socket, containerd.WithDefaultNamespace(Namespace))
	if err != nil {
		return nil, fmt.Errorf("connect to containerd: %w", err)
	}
	ctx = namespaces.WithNamespace(ctx, Namespace)
	inst, err := l.launch(ctx, c, opts)
	if err != nil {
		c.Close()
		return nil, err
	}
	return inst, nil
}

func (l *Launcher) launch(ctx context.Context, c *containerd.Client, opts supervisor.LaunchOptions) (*instance, error) {
	s := l.Service
	resolver := docker.NewResolver(docker.ResolverOptions{
		Hosts: config.ConfigureHosts(ctx, config.HostOptions{HostDir: config.HostDirFromRoot(l.HostsDir)}),
	})
	img, err := c.Pull(ctx, s.Image, containerd.WithPullUnpack, containerd.WithResolver(resolver))
	if err != nil {
		return nil, fmt.Errorf("pull %s: %w", s.Image, err)
	}
	id := s.Name
	// A container left by an earlier run (or boot) is replaced.
	if old, err := c.LoadContainer(ctx, id); err == nil {
		if t, err := old.Task(ctx, nil); err == nil {
			t.Delete(ctx, containerd.WithProcessKill)
		}
		if err := old.Delete(ctx, containerd.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
			return nil, fmt.Errorf("remove old container %s: %w", id, err)
		}
	}
	specOpts := []oci.SpecOpts{
		// Args replace the image's CMD, after its ENTRYPOINT, as in a Pod.
		oci.WithImageConfigArgs(img, s.Args),
		oci.WithHostNamespace(specs.NetworkNamespace),
		oci.WithHostHostsFile,
		oci.WithHostResolvconf,
		oci.WithEnv(s.Env),
	}
	if rel, ok := strings.CutPrefix(opts.Cgroup, cgroupRoot); ok && rel != "" {
		specOpts = append(specOpts, oci.WithCgroup(rel))
	}
	var mounts []specs.Mount
	for _, m := range s.Mounts {
		opts := []string{"rbind", "rw"}
		if m.ReadOnly {
			opts = []string{"rbind", "ro"}
		}
		mounts = append(mounts, specs.Mount{Type: "bind", Source: m.Source, Destination: m.Destination, Options: opts})
	}
	if len(mounts) > 0 {
		specOpts = append(specOpts, oci.WithMounts(mounts))
	}
	ctr, err := c.NewContainer(ctx, id,
		containerd.WithImage(img),
		containerd.WithNewSnapshot(id, img),
		containerd.WithNewSpec(specOpts...),
	)
	if err != nil {
		return nil, fmt.Errorf("create container %s: %w", id, err)
	}
	var taskOpts []containerd.NewTaskOpts
	if l.ShimCgroup != "" {
		taskOpts = append(taskOpts, containerd.WithShimCgroup(l.ShimCgroup))
	}
	task, err := ctr.NewTask(ctx, cio.NewCreator(cio.WithStreams(nil, opts.Output, opts.Output)), taskOpts...)
	if err != nil {
		ctr.Delete(ctx, containerd.WithSnapshotCleanup)
		return nil, fmt.Errorf("create task %s: %w", id, err)
	}
	statusC, err := task.Wait(ctx)
	if err != nil {
		task.Delete(ctx)
		ctr.Delete(ctx, containerd.WithSnapshotCleanup)
		return nil, err
	}
	if err := task.Start(ctx); err != nil {
		task.Delete(ctx)
		ctr.Delete(ctx, containerd.WithSnapshotCleanup)
		return nil, fmt.Errorf("start %s: %w", id, err)
	}
	inst := &instance{client: c, ctr: ctr, task: task, exited: make(chan supervisor.Exit, 1), killed: make(chan struct{})}
	boot.Go("wait for "+id, func() { inst.wait(statusC) })
	return inst, nil
}

type instance struct {
	client *containerd.Client
	ctr    containerd.Container
	task   containerd.Task
	exited chan supervisor.Exit
	// killed is closed by Kill: a wait for containerd to come back gives
	// up then.
	killed   chan struct{}
	killOnce sync.Once
	// asked counts rewait's questions to containerd, so a test can tell
	// that it went on asking a containerd that is away.
	asked atomic.Int64
}

// rewaitInterval is how often wait asks a containerd that went away
// whether it is back.
const rewaitInterval = 500 * time.Millisecond

// wait reports the task's exit once, after removing the task and container
// so the next run starts clean. A containerd restart ends the Wait call
// but not the task, whose shim runs on outside containerd's cgroup: wait
// then asks again once containerd is back, so the run goes on.
func (i *instance) wait(statusC <-chan containerd.ExitStatus) {
	ctx := namespaces.WithNamespace(context.Background(), Namespace)
	var code uint32
	var err error
	for {
		st := <-statusC
		if code, _, err = st.Result(); err == nil {
			break
		}
		if statusC, code, err = i.rewait(ctx, err); statusC == nil {
			break
		}
	}
	i.task.Delete(ctx)
	i.ctr.Delete(ctx, containerd.WithSnapshotCleanup)
	i.client.Close()
	e := supervisor.Exit{Err: err}
	if err == nil {
		e.Status = syscall.WaitStatus(code << 8) // an exit status, as wait(2) encodes it
		if code > 128 {
			e.Status = syscall.WaitStatus(code - 128) // killed by signal code-128
		}
	}
	i.exited <- e
}

// rewait is called when waiting for the task failed with waitErr. It polls
// containerd until it answers about the task: a task still running is
// waited for again (a new channel); one stopped but still known returns its
// exit code; a task containerd no longer knows (it ended while containerd
// was away), or a Kill meanwhile, ends the run with an error.
func (i *instance) rewait(ctx context.Context, waitErr error) (<-chan containerd.ExitStatus, uint32, error) {
	for {
		i.asked.Add(1)
		st, err := i.task.Status(ctx)
		switch {
		case err == nil && st.Status == containerd.Stopped:
			return nil, st.ExitStatus, nil
		case err == nil:
			statusC, err := i.task.Wait(ctx)
			if err != nil {
				return nil, 0, err
			}
			return statusC, 0, nil
		case errdefs.IsNotFound(err):
			// containerd, restarting, removes the tasks whose process ended
			// while it was away, exit status and all.
			return nil, 0, fmt.Errorf("the task ended while containerd was away, its exit status unknown: %w", err)
		}
		select {
		case <-i.killed:
			return nil, 0, fmt.Errorf("killed while containerd did not answer: %w", waitErr)
		case <-time.After(rewaitInterval):
		}
	}
}

func (i *instance) Exited() <-chan supervisor.Exit { return i.exited }
func (i *instance) Pid() int                       { return int(i.task.Pid()) }

func (i *instance) Signal(sig syscall.Signal) error {
	return i.task.Kill(namespaces.WithNamespace(context.Background(), Namespace), sig)
}

// Kill ends every process of the container.
func (i *instance) Kill() error {
	i.killOnce.Do(func() { close(i.killed) })
	err := i.task.Kill(namespaces.WithNamespace(context.Background(), Namespace), syscall.SIGKILL, containerd.WithKillAll)
	if errdefs.IsNotFound(err) {
		return nil
	}
	return err
}
