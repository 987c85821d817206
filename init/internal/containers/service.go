// Package containers is init's side of containerd. It runs system services
// from OCI images: a Launcher pulls the image (through the registry hosts of
// containerd's certs.d), makes a container on the host network in the
// service's own cgroup, and starts its task; each Launch is one run, so the
// supervisor restarts it with backoff and a failed pull is retried, its
// error the reason shown for the service. List reports what containerd
// holds.
package containers

import (
	"context"
	"fmt"
	"strings"
	"syscall"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/containerd/containerd/v2/core/remotes/docker/config"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

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
	Service  machineconfig.Service
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
	task, err := ctr.NewTask(ctx, cio.NewCreator(cio.WithStreams(nil, opts.Output, opts.Output)), containerd.WithShimCgroup(ShimCgroup))
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
	inst := &instance{client: c, ctr: ctr, task: task, exited: make(chan supervisor.Exit, 1)}
	go inst.wait(statusC)
	return inst, nil
}

type instance struct {
	client *containerd.Client
	ctr    containerd.Container
	task   containerd.Task
	exited chan supervisor.Exit
}

// wait reports the task's exit once, after removing the task and container
// so the next run starts clean.
func (i *instance) wait(statusC <-chan containerd.ExitStatus) {
	st := <-statusC
	ctx := namespaces.WithNamespace(context.Background(), Namespace)
	i.task.Delete(ctx)
	i.ctr.Delete(ctx, containerd.WithSnapshotCleanup)
	i.client.Close()
	code, _, err := st.Result()
	e := supervisor.Exit{Err: err}
	if err == nil {
		e.Status = syscall.WaitStatus(code << 8) // an exit status, as wait(2) encodes it
		if code > 128 {
			e.Status = syscall.WaitStatus(code - 128) // killed by signal code-128
		}
	}
	i.exited <- e
}

func (i *instance) Exited() <-chan supervisor.Exit { return i.exited }
func (i *instance) Pid() int                       { return int(i.task.Pid()) }

func (i *instance) Signal(sig syscall.Signal) error {
	return i.task.Kill(namespaces.WithNamespace(context.Background(), Namespace), sig)
}

// Kill ends every process of the container.
func (i *instance) Kill() error {
	err := i.task.Kill(namespaces.WithNamespace(context.Background(), Namespace), syscall.SIGKILL, containerd.WithKillAll)
	if errdefs.IsNotFound(err) {
		return nil
	}
	return err
}
