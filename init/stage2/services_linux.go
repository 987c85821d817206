package stage2

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"time"

	"github.com/opencontainers/cgroups"
	"sigs.k8s.io/yaml"

	"github.com/cairn-os/cairn/init/internal/boot"
	"github.com/cairn-os/cairn/init/internal/containers"
	"github.com/cairn-os/cairn/internal/atomicfile"
	"github.com/cairn-os/cairn/internal/containerdconfig"
	"github.com/cairn-os/cairn/internal/criimage"
	"github.com/cairn-os/cairn/internal/layout"
	"github.com/cairn-os/cairn/machineconfig"
	"github.com/cairn-os/cairn/supervisor"
)

const (
	cgroupRoot = "/sys/fs/cgroup"
	// runLogDir keeps service logs in memory when EPHEMERAL is missing.
	runLogDir = "/run/log"
)

// systemOOMScore is the OOM score adjustment of the node's own services.
var systemOOMScore = -999

var restartPolicies = map[string]supervisor.Policy{
	machineconfig.RestartAlways:    supervisor.RestartAlways,
	machineconfig.RestartOnFailure: supervisor.RestartOnFailure,
	machineconfig.RestartNever:     supervisor.RestartNever,
}

// startServices writes containerd's config and starts the services that
// nodeServices lists, handing the supervisor to the control socket and the
// shutdown.
func (n *node) startServices(cfg *machineconfig.Config, varErr error) error {
	logDir := filepath.Join(varDir, "log")
	if varErr != nil {
		logDir = runLogDir
	}
	sup := supervisor.New(supervisor.Options{
		Starter:    n.reaper,
		Log:        slog.Default(),
		CgroupRoot: cgroupRoot,
		LogDir:     logDir,
	})
	changes, _ := sup.Subscribe() // for as long as the node runs
	boot.Go("service events", func() { n.events.services(changes) })
	if err := os.MkdirAll(filepath.Join(cgroupRoot, containers.ShimCgroup), 0o755); err != nil {
		return err
	}
	if err := writeContainerdConfig("/", cfg); err != nil {
		return err
	}
	// The agent runs the static pods from their manifests, with or
	// without an API server: they are there before it starts.
	var errs []error
	if err := writeStaticPods(layout.StaticPodDir, cfg.Machine.StaticPods); err != nil {
		errs = append(errs, err)
	}
	services, images := nodeServices(cfg, varErr)
	for _, svc := range services {
		if err := sup.Add(svc); err != nil {
			errs = append(errs, err)
		}
	}
	errs = append(errs, sup.Start())
	n.mu.Lock()
	n.services, n.images = sup, images
	n.mu.Unlock()
	n.configs.setServices(liveServices{n: n, sup: sup})
	return errors.Join(errs...)
}

// writeContainerdConfig writes containerd's config files for cfg under
// root ("/" on a node): config.toml, and a hosts.toml for each registry,
// which containerd reads at each pull; the directories of registries no
// longer configured are removed.
func writeContainerdConfig(root string, cfg *machineconfig.Config) error {
	files := containerdconfig.Files(cfg)
	for _, p := range containerdconfig.SortedPaths(files) {
		p, data := filepath.Join(root, p), files[p]
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := atomicfile.WriteFile(p, data, 0o644); err != nil {
			return fmt.Errorf("write containerd's %s: %w", p, err)
		}
	}
	hostsDir := filepath.Join(root, containerdconfig.Node.HostsDir)
	ents, err := os.ReadDir(hostsDir)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	var errs []error
	for _, e := range ents {
		if !slices.ContainsFunc(cfg.Containerd.Registries, func(r machineconfig.Registry) bool { return r.Host == e.Name() }) {
			errs = append(errs, os.RemoveAll(filepath.Join(hostsDir, e.Name())))
		}
	}
	return errors.Join(errs...)
}

// nodeServices lists the node's services: containerd, the agent, and the
// machine config's image-backed services (after containerd is ready); and
// maps the latter to their image. The agent does not wait for containerd,
// so the API answers even when the runtime cannot start. Without EPHEMERAL
// (varErr) containerd does not start.
func nodeServices(cfg *machineconfig.Config, varErr error) ([]supervisor.Service, map[string]string) {
	containerd := supervisor.Service{
		Name:  "containerd",
		Path:  layout.ContainerdBinary,
		Args:  []string{"--config", layout.ContainerdConfig},
		Env:   []string{"PATH=/usr/bin:/sbin"},
		Ready: supervisor.UnixSocketProbe(containerdconfig.Node.Socket),
		// Its content lives on /var, which a reset or a new EPHEMERAL
		// empties: the pod sandbox image is put back at each start.
		OnReady: []supervisor.Action{{Name: "import the sandbox image", Run: importSandboxImage, Timeout: time.Minute}},
		// The node's own services are the last the OOM killer picks.
		OOMScoreAdj: &systemOOMScore,
		Cgroup:      "system/containerd",
		Resources:   cgroupResources(cfg.Machine.Resources.Containerd),
		LogFile:     "containerd.log",
	}
	if varErr != nil {
		// containerd keeps its data on /var: without EPHEMERAL it backs
		// off, showing why, rather than filling the root's overlay.
		containerd.Path, containerd.Args = "", nil
		containerd.Launcher = unavailable{fmt.Errorf("EPHEMERAL is not mounted on %s: %w", varDir, varErr)}
	}
	grace, _ := cfg.Machine.Shutdown.Periods()
	services := []supervisor.Service{containerd, {
		Name: "cairn-agent",
		Path: layout.AgentBinary,
		// At a node's shutdown the agent ends the pods, within the
		// shutdown's grace period, before containerd stops.
		StopBefore:  []string{"containerd"},
		StopTimeout: grace + agentStopTimeout,
		Ready:       supervisor.TCPProbe(fmt.Sprintf("127.0.0.1:%d", cfg.Machine.API.Port)),
		OOMScoreAdj: &systemOOMScore,
		Args:        []string{"--config", layout.RunningConfig, "--init-socket", layout.InitSocket},
		Env:         []string{"PATH=/usr/bin:/sbin"},
		Cgroup:      "system/cairn-agent",
		Resources:   cgroupResources(cfg.Machine.Resources.Agent),
		LogFile:     "cairn-agent.log",
		Output:      consoleLines("cairn-agent: "),
	}}
	images := map[string]string{}
	for _, s := range cfg.Services {
		images[s.Name] = s.Image
		services = append(services, imageService(s))
	}
	return services, images
}

// agentStopTimeout is how long the agent gets to stop, besides the time
// the pods get at a node's shutdown.
const agentStopTimeout = 15 * time.Second

// imageService is the supervisor's service of an image-backed service of
// the machine config, run by containerd.
func imageService(s machineconfig.Service) supervisor.Service {
	return supervisor.Service{
		Name:      s.Name,
		Launcher:  &containers.Launcher{Socket: containerdconfig.Node.Socket, HostsDir: containerdconfig.Node.HostsDir, ShimCgroup: containers.ShimCgroup, Service: s},
		DependsOn: []string{"containerd"},
		Restart:   restartPolicies[s.Restart],
		Cgroup:    "system/" + s.Name,
		Resources: cgroupResources(s.Resources),
		LogFile:   s.Name + ".log",
	}
}

// liveServices changes the node's running services for a config applied
// live.
type liveServices struct {
	n   *node
	sup *supervisor.Supervisor
}

func (l liveServices) SetResources(name string, res *cgroups.Resources) error {
	return l.sup.SetResources(name, res)
}

// Replace makes the image-backed services go from old to new: a removed
// service is stopped, an added one started, a changed one stopped and
// started anew; the others keep running.
func (l liveServices) Replace(old, new []machineconfig.Service) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	find := func(ss []machineconfig.Service, name string) (machineconfig.Service, bool) {
		i := slices.IndexFunc(ss, func(s machineconfig.Service) bool { return s.Name == name })
		if i < 0 {
			return machineconfig.Service{}, false
		}
		return ss[i], true
	}
	var errs []error
	for _, o := range old {
		if n, ok := find(new, o.Name); !ok || !reflect.DeepEqual(o, n) {
			errs = append(errs, l.sup.Remove(ctx, o.Name))
		}
	}
	for _, n := range new {
		if o, ok := find(old, n.Name); !ok || !reflect.DeepEqual(o, n) {
			errs = append(errs, l.sup.Add(imageService(n)))
		}
	}
	images := map[string]string{}
	for _, s := range new {
		images[s.Name] = s.Image
	}
	l.n.mu.Lock()
	l.n.images = images
	l.n.mu.Unlock()
	return errors.Join(errs...)
}

// cgroupResources turns a service's limits in the machine config into the
// supervisor's cgroup limits, nil for none. The config is validated: a
// quantity that does not parse is not set.
func cgroupResources(r machineconfig.Resources) *cgroups.Resources {
	if r == (machineconfig.Resources{}) {
		return nil
	}
	res := &cgroups.Resources{Memory: r.MemoryBytes(), CpuWeight: uint64(max(r.CPUWeight, 0))}
	if q := r.CPUQuota(); q > 0 {
		res.CpuQuota, res.CpuPeriod = q, machineconfig.CPUPeriod
	}
	if r.PidsMax > 0 {
		res.PidsLimit = &r.PidsMax
	}
	return res
}

// unavailable is a launcher that cannot start, for the reason it holds.
type unavailable struct{ err error }

func (u unavailable) Launch(context.Context, supervisor.LaunchOptions) (supervisor.Instance, error) {
	return nil, u.err
}

// consoleLines copies a service's output lines to the console, prefixed.
// The supervisor writes whole lines, one per Write.
func consoleLines(prefix string) io.Writer {
	return writerFunc(func(p []byte) (int, error) {
		os.Stdout.Write(append([]byte(prefix), p...))
		return len(p), nil
	})
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// importSandboxImage imports and pins the pod sandbox image, each time
// containerd becomes ready.
func importSandboxImage(ctx context.Context) error {
	if err := criimage.ImportPinned(ctx, containerdconfig.Node.Socket, layout.SandboxArchive, layout.SandboxImage); err != nil {
		return fmt.Errorf("import %s: %w", layout.SandboxImage, err)
	}
	return nil
}

// writeStaticPods makes dir hold exactly the manifests of pods, one
// <name>.yaml each (the config's names are unique), as written in the
// config: a manifest written at an earlier boot whose pod left the config
// is removed, so the agent stops that pod. The directory and its files
// are root's alone: a static pod runs with no API server to check who
// asked for it. Each file is replaced by a rename, so that a reader never
// sees half of one.
func writeStaticPods(dir string, pods []machineconfig.StaticPod) error {
	if _, err := os.Stat(dir); len(pods) == 0 && os.IsNotExist(err) {
		return nil // nothing to write, nothing to remove (STATE may be missing)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("static pods: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("static pods: %w", err)
	}
	want := map[string]bool{}
	var errs []error
	for i, pod := range pods {
		meta, err := pod.Meta()
		if err != nil {
			errs = append(errs, fmt.Errorf("machine.staticPods[%d]: %w", i, err))
			continue
		}
		name := meta.Name + ".yaml"
		want[name] = true
		data, err := yaml.JSONToYAML(pod)
		if err != nil {
			errs = append(errs, fmt.Errorf("static pod %s: %w", meta.Name, err))
			continue
		}
		if err := atomicfile.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			errs = append(errs, fmt.Errorf("static pod %s: %w", meta.Name, err))
		}
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("static pods: %w", err))...)
	}
	for _, e := range ents {
		if !want[e.Name()] {
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				errs = append(errs, fmt.Errorf("remove stale static pod manifest: %w", err))
			}
		}
	}
	return errors.Join(errs...)
}
