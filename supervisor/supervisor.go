package supervisor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/cairn-os/cairn/supervisor/safe"
	"github.com/opencontainers/cgroups"

	"github.com/cairn-os/cairn/internal/backoff"
	"github.com/cairn-os/cairn/internal/broker"
)

// Options configure a Supervisor. The zero value works: processes waited
// for directly, real time, slog.Default, no cgroups, logs in memory only.
type Options struct {
	// Starter starts every process, services and probes alike: the Reaper
	// under PID 1. Default DirectStarter.
	Starter Starter
	// Clock drives backoff, probe polling and stop timeouts. Default: real
	// time.
	Clock Clock
	Log   *slog.Logger
	// CgroupRoot is where cgroup v2 is mounted, e.g. /sys/fs/cgroup; empty
	// turns cgroups off and Service.Cgroup is ignored.
	CgroupRoot string
	// LogDir holds the services' log files, e.g. /var/log; it is created if
	// needed.
	LogDir string
	// LogMaxBytes is the size past which a log file is rotated (default
	// 10 MiB); LogKeep the number of rotated files kept (default 3).
	LogMaxBytes int64
	LogKeep     int
	// RingBytes is how much of each service's latest output is kept in
	// memory (default 256 KiB).
	RingBytes int
}

// Supervisor runs services: Add them, Start, and Stop at the end.
type Supervisor struct {
	opts           Options
	restartBackoff backoff.Backoff
	events         broker.Broker[Event]

	mu       sync.Mutex
	services map[string]*service
	order    []*service // as added
	started  bool
	stopping bool
	changed  chan struct{} // closed and replaced at each state change
}

// service is a Service and its life.
type service struct {
	spec     Service
	launcher Launcher        // spec's, wrapped
	cgroup   *cgroupLauncher // in launcher, if the service has a cgroup
	logs     *logSink
	log      *slog.Logger

	// ctx ends when the service is to stop; Launch and probes get it.
	ctx     context.Context
	cancel  context.CancelFunc
	restart chan chan struct{} // a restart request, closed once done
	done    chan struct{}      // closed once stopped
	begun   bool

	status ServiceStatus // guarded by Supervisor.mu
}

// New returns a Supervisor with opts, defaults filled in.
func New(opts Options) *Supervisor {
	if opts.Starter == nil {
		opts.Starter = DirectStarter{}
	}
	if opts.Clock == nil {
		opts.Clock = backoff.RealClock
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.LogMaxBytes <= 0 {
		opts.LogMaxBytes = 10 << 20
	}
	if opts.LogKeep <= 0 {
		opts.LogKeep = 3
	}
	if opts.RingBytes <= 0 {
		opts.RingBytes = 256 << 10
	}
	return &Supervisor{
		opts:           opts,
		restartBackoff: restartBackoff,
		services:       make(map[string]*service),
		changed:        make(chan struct{}),
	}
}

// Add registers svc. Once the supervisor is started, svc starts at once
// (when its dependencies are Ready); before that, Start starts it.
func (s *Supervisor) Add(svc Service) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.check(svc); err != nil {
		return fmt.Errorf("add service %q: %w", svc.Name, err)
	}
	if s.started {
		if err := s.checkDeps(append(slices.Clone(s.order), &service{spec: svc})); err != nil {
			return err
		}
	}
	sv, err := s.newService(svc)
	if err != nil {
		return fmt.Errorf("add service %q: %w", svc.Name, err)
	}
	s.services[svc.Name] = sv
	s.order = append(s.order, sv)
	s.setLocked(sv, StateWaiting, "")
	if s.started {
		s.begin(sv)
	}
	return nil
}

func (s *Supervisor) check(svc Service) error {
	switch {
	case s.stopping:
		return errors.New("the supervisor is stopping")
	case svc.Name == "":
		return errors.New("no name")
	case s.services[svc.Name] != nil:
		return errors.New("a service by this name exists")
	case (svc.Path == "") == (svc.Launcher == nil):
		return errors.New("set one of Path and Launcher")
	case svc.LogFile != "" && s.opts.LogDir == "":
		return errors.New("a log file needs Options.LogDir")
	case svc.LogFile != "" && (svc.LogFile != filepath.Base(svc.LogFile) || svc.LogFile == ".." || svc.LogFile == "."):
		return fmt.Errorf("log file %q is not a plain file name", svc.LogFile)
	case svc.Cgroup != "" && (path.IsAbs(svc.Cgroup) || path.Clean(svc.Cgroup) != svc.Cgroup || svc.Cgroup == "." || svc.Cgroup == ".." || strings.HasPrefix(svc.Cgroup, "../")):
		return fmt.Errorf("cgroup %q is not a clean relative path", svc.Cgroup)
	}
	for _, other := range s.order {
		if svc.Cgroup != "" && other.spec.Cgroup == svc.Cgroup {
			return fmt.Errorf("cgroup %s is service %q's", svc.Cgroup, other.spec.Name)
		}
	}
	return nil
}

func (s *Supervisor) newService(svc Service) (*service, error) {
	log := s.opts.Log.With("service", svc.Name)
	var file *rotator
	if svc.LogFile != "" {
		if err := os.MkdirAll(s.opts.LogDir, 0o755); err != nil {
			return nil, fmt.Errorf("create log directory: %w", err)
		}
		file = &rotator{path: filepath.Join(s.opts.LogDir, svc.LogFile), max: s.opts.LogMaxBytes, keep: s.opts.LogKeep, log: log}
	}
	l := svc.Launcher
	if l == nil {
		l = processLauncher{starter: s.opts.Starter, path: svc.Path, args: svc.Args, env: svc.Env, dir: svc.Dir, log: log}
	}
	if svc.OOMScoreAdj != nil {
		l = oomLauncher{Launcher: l, adj: *svc.OOMScoreAdj, log: log}
	}
	var cg *cgroupLauncher
	switch {
	case svc.Cgroup != "" && s.opts.CgroupRoot != "":
		root := filepath.Clean(s.opts.CgroupRoot)
		cg = &cgroupLauncher{Launcher: l, root: root, dir: filepath.Join(root, svc.Cgroup), res: svc.Resources, log: log}
		l = cg
	case svc.Cgroup != "":
		log.Info("cgroups are off, the service runs in the supervisor's cgroup", "cgroup", svc.Cgroup)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &service{
		spec:     svc,
		launcher: l,
		cgroup:   cg,
		logs:     newLogSink(s.opts.RingBytes, file, svc.Output),
		log:      log,
		ctx:      ctx,
		cancel:   cancel,
		restart:  make(chan chan struct{}),
		done:     make(chan struct{}),
		status:   ServiceStatus{Name: svc.Name},
	}, nil
}

// Start begins every added service, each once its dependencies are Ready.
// It returns at once, or with an error naming an unknown dependency or a
// dependency cycle, in which case nothing is started.
func (s *Supervisor) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.stopping:
		return errors.New("start services: the supervisor is stopping")
	case s.started:
		return errors.New("start services: already started")
	}
	if err := s.checkDeps(s.order); err != nil {
		return err
	}
	s.started = true
	for _, sv := range s.order {
		s.begin(sv)
	}
	return nil
}

func (s *Supervisor) begin(sv *service) {
	sv.begun = true
	safe.Go(sv.log, "run service", func() { s.run(sv) })
}

// checkDeps returns an error naming the first unknown dependency or
// dependency cycle among svcs.
func (s *Supervisor) checkDeps(svcs []*service) error {
	byName := make(map[string]*service, len(svcs))
	for _, sv := range svcs {
		byName[sv.spec.Name] = sv
	}
	for _, sv := range svcs {
		for _, d := range sv.spec.DependsOn {
			if byName[d] == nil {
				return fmt.Errorf("service %q depends on unknown service %q", sv.spec.Name, d)
			}
		}
	}
	// Depth-first search; a service met again on the current path closes a
	// cycle.
	const (
		unseen = iota
		onPath
		done
	)
	mark := make(map[string]int, len(svcs))
	var path []string
	var visit func(name string) error
	visit = func(name string) error {
		switch mark[name] {
		case onPath:
			i := slices.Index(path, name)
			return fmt.Errorf("dependency cycle: %s", strings.Join(append(path[i:], name), " -> "))
		case done:
			return nil
		}
		mark[name] = onPath
		path = append(path, name)
		for _, d := range byName[name].spec.DependsOn {
			if err := visit(d); err != nil {
				return err
			}
		}
		path = path[:len(path)-1]
		mark[name] = done
		return nil
	}
	for _, sv := range svcs {
		if err := visit(sv.spec.Name); err != nil {
			return err
		}
	}
	return nil
}

// Restart stops the named service's current run, if any, and starts it
// again at once, without backoff; a service waiting for its dependencies
// goes on waiting. It returns once the old run has ended.
func (s *Supervisor) Restart(name string) error {
	s.mu.Lock()
	sv := s.services[name]
	stopping := s.stopping
	s.mu.Unlock()
	switch {
	case sv == nil:
		return fmt.Errorf("restart %q: no such service", name)
	case stopping:
		return fmt.Errorf("restart %q: the supervisor is stopping", name)
	case !sv.begun:
		return fmt.Errorf("restart %q: not started", name)
	}
	ack := make(chan struct{})
	select {
	case sv.restart <- ack:
	case <-sv.done:
		return fmt.Errorf("restart %q: stopped", name)
	}
	<-ack
	return nil
}

// Remove stops the named service, as Stop does, and forgets it: its
// status, its logs in memory. It is refused while another service depends
// on it. It returns once the service stopped, or when ctx ends.
func (s *Supervisor) Remove(ctx context.Context, name string) error {
	s.mu.Lock()
	sv := s.services[name]
	var dependents []string
	for _, other := range s.order {
		if slices.Contains(other.spec.DependsOn, name) {
			dependents = append(dependents, other.spec.Name)
		}
	}
	switch {
	case sv == nil:
		s.mu.Unlock()
		return fmt.Errorf("remove %q: no such service", name)
	case len(dependents) > 0:
		s.mu.Unlock()
		return fmt.Errorf("remove %q: %s depend on it", name, strings.Join(dependents, ", "))
	}
	if !sv.begun {
		sv.begun = true
		close(sv.done)
	}
	s.mu.Unlock()
	sv.cancel()
	select {
	case <-sv.done:
	case <-ctx.Done():
		return fmt.Errorf("remove %q: %w", name, ctx.Err())
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.services, name)
	s.order = slices.DeleteFunc(s.order, func(o *service) bool { return o == sv })
	return nil
}

// Stop stops every service, each after the services that depend on it,
// and waits for them until ctx ends. Each gets its stop signal, then after
// its timeout every process of it is killed and its cgroup removed.
func (s *Supervisor) Stop(ctx context.Context) error {
	s.mu.Lock()
	s.stopping = true
	svcs := slices.Clone(s.order)
	for _, sv := range svcs {
		if !sv.begun {
			sv.begun = true
			s.setLocked(sv, StateStopped, "")
			close(sv.done)
		}
	}
	s.mu.Unlock()

	dependents := make(map[string][]*service)
	for _, sv := range svcs {
		for _, d := range slices.Concat(sv.spec.DependsOn, sv.spec.StopBefore) {
			dependents[d] = append(dependents[d], sv)
		}
	}
	for _, sv := range svcs {
		safe.Go(sv.log, "stop service", func() {
			for _, d := range dependents[sv.spec.Name] {
				select {
				case <-d.done:
				case <-ctx.Done():
					return
				}
			}
			sv.cancel()
		})
	}
	var stuck []string
	for _, sv := range svcs {
		select {
		case <-sv.done:
		case <-ctx.Done():
			select {
			case <-sv.done:
			default:
				stuck = append(stuck, sv.spec.Name)
			}
		}
	}
	if len(stuck) > 0 {
		return fmt.Errorf("stop %s: %w", strings.Join(stuck, ", "), ctx.Err())
	}
	return nil
}

// Status returns the status of every service, in the order they were
// added.
func (s *Supervisor) Status() []ServiceStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := make([]ServiceStatus, len(s.order))
	for i, sv := range s.order {
		st[i] = sv.status
	}
	return st
}

// Subscribe returns every state change from now on, in order, until cancel
// is called. A slow reader delays nothing: events queue for it.
func (s *Supervisor) Subscribe() (events <-chan Event, cancel func()) {
	return s.events.Subscribe(s.opts.Log)
}

// Logs returns the last tail lines of the named service's output kept in
// memory, or all of them when tail <= 0.
func (s *Supervisor) Logs(name string, tail int) ([]byte, error) {
	sv, err := s.lookup(name)
	if err != nil {
		return nil, fmt.Errorf("logs of %q: %w", name, err)
	}
	return sv.logs.tail(tail), nil
}

// Follow sends the last tail lines of the named service's output, then
// every new line as it comes, one line per receive, until ctx ends.
func (s *Supervisor) Follow(ctx context.Context, name string, tail int) (<-chan []byte, error) {
	sv, err := s.lookup(name)
	if err != nil {
		return nil, fmt.Errorf("follow logs of %q: %w", name, err)
	}
	return sv.logs.follow(ctx, sv.log, tail), nil
}

// SetResources changes the cgroup limits of the service name: of its
// running process at once, and of its runs to come. A limit that res does
// not set is lifted.
func (s *Supervisor) SetResources(name string, res *cgroups.Resources) error {
	sv, err := s.lookup(name)
	if err != nil {
		return err
	}
	if sv.cgroup == nil {
		return fmt.Errorf("service %s has no cgroup of its own: no limits to change", name)
	}
	return sv.cgroup.setResources(res)
}

func (s *Supervisor) lookup(name string) (*service, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sv := s.services[name]; sv != nil {
		return sv, nil
	}
	return nil, errors.New("no such service")
}
