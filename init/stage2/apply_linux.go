package stage2

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/opencontainers/cgroups"

	"github.com/cairn-os/cairn/api/machine"
	"github.com/cairn-os/cairn/internal/atomicfile"
	"github.com/cairn-os/cairn/machineconfig"
)

// configs is the node's machine config as it runs and as STATE holds it
// for the next boot, and what changes them while the node runs
// (ApplyConfig): init owns both. Each config written to STATE or tried
// gets the next generation, recorded in the file's first line.
type configs struct {
	// statePath is STATE's config (layout.MachineConfig); runningPath is
	// the config the node runs, which the agent reads and watches
	// (layout.RunningConfig).
	statePath, runningPath string
	// live is where live changes go.
	live liveTargets
	// reboot asks for a reboot; the call that asked returns first.
	reboot func()

	// mu is held by one change at a time, for all of it; a second is
	// refused rather than queued (see lock).
	mu sync.Mutex
	// sysctlsBefore holds each sysctl's value from before the node first
	// set it, given back when the config drops it; under mu.
	sysctlsBefore map[string]string
	// guard protects the fields below, which Status reads while a change
	// holds mu.
	guard      sync.Mutex
	cur        *machineconfig.Config
	raw        []byte // cur's document, without the generation line
	recovering bool   // cur is what recovery mode salvaged
	generation uint64 // cur's
	bootGen    uint64 // STATE's
	try        *pendingTry
	lastErr    string
	// onTrial is set while the config the node booted with waits to be
	// healthy (keepIfHealthy).
	onTrial bool
	// res writes resolv.conf; nil until the network is configured.
	res *resolver
	// links changes the network's links (network.interfaces); nil
	// until the network is configured.
	links linkChanger
	// services changes the node's services (services,
	// machine.resources); nil until they are started.
	services serviceChanger
	// clock keeps the time with machine.time.servers; nil until the
	// clock is set.
	clock *timeKeeper
	// note records an event (kind, subject, message); nil records none.
	note func(kind, subject, message string)
}

// event records a config event about generation gen.
func (c *configs) event(gen uint64, message string) {
	if c.note != nil {
		c.note("config", fmt.Sprintf("generation %d", gen), message)
	}
}

// liveTargets are where a live change is applied: the kernel's
// parameters, the root that machine.files and containerd's config are
// under, the static pods' directory. Tests point them at their own.
type liveTargets struct {
	procSys, root, staticPodDir string
}

// pendingTry is a config tried live and not yet confirmed.
type pendingTry struct {
	prev       running // what the node ran before
	until      time.Time
	generation uint64
	timer      *time.Timer
}

// generationLine starts the first line of a config that ApplyConfig
// wrote to STATE: a YAML comment, so the document reads the same.
const generationLine = "# cairn: generation "

// splitGeneration returns the generation that data's first line records
// (1 when it records none: the config the image was built with) and the
// document without that line.
func splitGeneration(data []byte) (uint64, []byte) {
	line, rest, _ := bytes.Cut(data, []byte("\n"))
	num, ok := bytes.CutPrefix(line, []byte(generationLine))
	if !ok {
		return 1, data
	}
	gen, err := strconv.ParseUint(string(bytes.TrimSpace(num)), 10, 64)
	if err != nil || gen == 0 {
		return 1, rest
	}
	return gen, rest
}

// withGeneration is doc with its generation line.
func withGeneration(gen uint64, doc []byte) []byte {
	return append([]byte(fmt.Sprintf("%s%d\n", generationLine, gen)), doc...)
}

// newConfigs starts from the config the node booted with: cfg, parsed
// from STATE's file data, or salvaged from it in recovery mode; it writes
// the running config for the agent.
func newConfigs(statePath, runningPath string, live liveTargets, cfg *machineconfig.Config, data []byte, recovering bool, reboot func()) (*configs, error) {
	gen, doc := splitGeneration(data)
	c := &configs{statePath: statePath, runningPath: runningPath, live: live, reboot: reboot,
		cur: cfg, raw: doc, recovering: recovering, generation: gen, bootGen: gen, sysctlsBefore: map[string]string{}}
	return c, c.writeRunning()
}

// writeRunning writes the running config for the agent, with its
// generation. In recovery mode it is STATE's document as it is: the agent
// salvages from it what init did.
func (c *configs) writeRunning() error {
	if err := os.MkdirAll(filepath.Dir(c.runningPath), 0o700); err != nil {
		return err
	}
	c.guard.Lock()
	doc := withGeneration(c.generation, c.raw)
	c.guard.Unlock()
	if err := atomicfile.WriteFile(c.runningPath, doc, 0o600); err != nil {
		return fmt.Errorf("write the running machine config: %w", err)
	}
	return nil
}

// rememberSysctls keeps the values the boot replaced, for when a config
// drops a sysctl.
func (c *configs) rememberSysctls(was map[string]string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for name, v := range was {
		if _, ok := c.sysctlsBefore[name]; !ok {
			c.sysctlsBefore[name] = v
		}
	}
}

// setResolver hands over the resolver that the network configuration
// made, for the config's nameservers and search domains; c may be nil
// (no config loaded: nothing to apply).
func (c *configs) setResolver(r *resolver) {
	if c == nil {
		return
	}
	c.guard.Lock()
	defer c.guard.Unlock()
	c.res = r
}

// serviceChanger changes the node's running services (liveServices).
type serviceChanger interface {
	// SetResources changes a service's cgroup limits while it runs.
	SetResources(name string, res *cgroups.Resources) error
	// Replace makes the image-backed services go from old to new.
	Replace(old, new []machineconfig.Service) error
}

// setServices hands over the services' supervisor, for
// machine.resources; c may be nil.
func (c *configs) setServices(s serviceChanger) {
	if c == nil {
		return
	}
	c.guard.Lock()
	defer c.guard.Unlock()
	c.services = s
}

// linkChanger changes the node's links while it runs (liveLinks).
type linkChanger interface {
	Reconfigure(old, new machineconfig.Network) error
}

// setLinks hands over what changes the links, for the interfaces'
// addresses, routes, MTU and VLANs; c may be nil.
func (c *configs) setLinks(l linkChanger) {
	if c == nil {
		return
	}
	c.guard.Lock()
	defer c.guard.Unlock()
	c.links = l
}

// setTimeKeeper hands over the time keeper, for machine.time.servers; c
// may be nil.
func (c *configs) setTimeKeeper(k *timeKeeper) {
	if c == nil {
		return
	}
	c.guard.Lock()
	defer c.guard.Unlock()
	c.clock = k
}

// lock takes mu for a change, or says why it cannot: another change is
// under way.
func (c *configs) lock() error {
	if !c.mu.TryLock() {
		return status.Error(codes.Aborted, "another config change is in progress on this node: try again once it ends")
	}
	return nil
}

// Status is the config's generations and what is pending.
func (c *configs) Status() *machine.ConfigState {
	c.guard.Lock()
	defer c.guard.Unlock()
	s := &machine.ConfigState{Generation: c.generation, BootGeneration: c.bootGen, LastError: c.lastErr, OnTrial: c.onTrial}
	if c.try != nil {
		s.TryUntil = timestamppb.New(c.try.until)
	}
	return s
}

// Apply checks the config in req, compares it with the running one and
// applies it as req.Mode says. Whatever fails, the node keeps the config
// it ran and STATE keeps the one it held.
func (c *configs) Apply(req *machine.ApplyConfigRequest) (*machine.ApplyConfigResponse, error) {
	resp, err := c.apply(req)
	if err == nil && req.Mode != machine.ApplyMode_APPLY_MODE_DRY_RUN && len(resp.Changes) > 0 {
		c.event(resp.Generation, fmt.Sprintf("%s (%d changes)", resp.Outcome, len(resp.Changes)))
	}
	return resp, err
}

func (c *configs) apply(req *machine.ApplyConfigRequest) (*machine.ApplyConfigResponse, error) {
	next, err := machineconfig.Parse(req.Config)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "the config is refused, nothing changed: %v", err)
	}
	if req.Mode == machine.ApplyMode_APPLY_MODE_TRY && req.TryTimeout.AsDuration() <= 0 {
		return nil, status.Error(codes.InvalidArgument, "a try needs a timeout (--timeout), after which it is reverted unless confirmed")
	}
	if err := c.lock(); err != nil {
		return nil, err
	}
	defer c.mu.Unlock()
	c.guard.Lock()
	try, recovering, gen := c.try, c.recovering, max(c.generation, c.bootGen)+1
	c.guard.Unlock()
	cur := c.running()
	to := running{next, req.Config, gen}

	changes := machineconfig.Diff(cur.cfg, next)
	resp := &machine.ApplyConfigResponse{Generation: gen}
	for _, ch := range changes {
		resp.Changes = append(resp.Changes, &machine.ConfigChange{Path: ch.Path, Text: ch.String(), Reboot: ch.Effect() == machineconfig.Reboot})
	}
	// In recovery mode the node runs on what it salvaged, not on STATE's
	// config: only a boot applies one, whatever the diff says.
	needsBoot := recovering || len(machineconfig.NeedsReboot(changes)) > 0
	mode := req.Mode
	switch {
	case mode == machine.ApplyMode_APPLY_MODE_DRY_RUN:
		resp.Outcome, resp.Generation = "dry run: nothing changed", cur.gen
		return resp, nil
	case try != nil:
		return nil, status.Errorf(codes.FailedPrecondition, "generation %d is being tried until %s: confirm it (cairn node confirm) or wait for its revert, then apply again",
			try.generation, try.until.Format(time.RFC3339))
	case len(changes) == 0 && !recovering && mode != machine.ApplyMode_APPLY_MODE_REBOOT && mode != machine.ApplyMode_APPLY_MODE_STAGED:
		resp.Outcome, resp.Generation = "no change", cur.gen
		return resp, nil
	case mode == machine.ApplyMode_APPLY_MODE_AUTO && needsBoot:
		mode = machine.ApplyMode_APPLY_MODE_REBOOT
	case mode == machine.ApplyMode_APPLY_MODE_AUTO:
		mode = machine.ApplyMode_APPLY_MODE_NO_REBOOT
	case (mode == machine.ApplyMode_APPLY_MODE_NO_REBOOT || mode == machine.ApplyMode_APPLY_MODE_TRY) && needsBoot:
		return nil, status.Errorf(codes.FailedPrecondition, "nothing changed: %s", needReboot(machineconfig.NeedsReboot(changes), recovering))
	}

	switch mode {
	case machine.ApplyMode_APPLY_MODE_STAGED:
		if err := c.save(to, true); err != nil {
			return nil, err
		}
		resp.Outcome = "staged for the next boot"
	case machine.ApplyMode_APPLY_MODE_REBOOT:
		if err := c.save(to, true); err != nil {
			return nil, err
		}
		slog.Info("machine config written: rebooting to apply it", "generation", gen)
		resp.Outcome = "rebooting"
		c.reboot()
	case machine.ApplyMode_APPLY_MODE_NO_REBOOT:
		if err := c.switchTo(cur, to, ""); err != nil {
			return nil, err
		}
		if err := c.save(to, false); err != nil {
			c.switchTo(to, cur, "")
			return nil, err
		}
		resp.Outcome = "applied live"
	case machine.ApplyMode_APPLY_MODE_TRY:
		timeout := req.TryTimeout.AsDuration()
		if err := c.switchTo(cur, to, ""); err != nil {
			return nil, err
		}
		t := &pendingTry{prev: cur, generation: gen, until: time.Now().Add(timeout)}
		c.guard.Lock()
		c.try = t
		t.timer = time.AfterFunc(timeout, func() { c.expire(t) })
		c.guard.Unlock()
		resp.Outcome = fmt.Sprintf("trying until %s: confirm it with cairn node confirm, or it is reverted", t.until.Format(time.RFC3339))
	default:
		return nil, status.Errorf(codes.InvalidArgument, "unknown mode %v", req.Mode)
	}
	return resp, nil
}

// needReboot says which changes keep a config from being applied live.
func needReboot(changes []machineconfig.Change, recovering bool) string {
	if recovering {
		return "the node runs in recovery mode, where only a reboot applies a config: apply it with --mode reboot"
	}
	var paths []string
	for _, ch := range changes {
		paths = append(paths, ch.Path)
	}
	return fmt.Sprintf("these changes take effect only at a boot: %s; apply with --mode reboot or staged", strings.Join(paths, ", "))
}

// running is a config the node runs, with its document and generation.
type running struct {
	cfg *machineconfig.Config
	doc []byte
	gen uint64
}

func (c *configs) running() running {
	c.guard.Lock()
	defer c.guard.Unlock()
	return running{c.cur, c.raw, c.generation}
}

// switchTo makes the node run to instead of from: its live fields
// applied, the running config written for the agent. If a part fails,
// what was applied is undone and the node keeps running from. why, if
// set, is why from is left (a revert), kept as Status's last error.
func (c *configs) switchTo(from, to running, why string) error {
	err := c.applyLive(from.cfg, to.cfg)
	if err == nil {
		c.set(to, why)
		if err = c.writeRunning(); err == nil {
			return nil
		}
	}
	c.applyLive(to.cfg, from.cfg)
	c.set(from, "")
	c.writeRunning()
	return status.Errorf(codes.FailedPrecondition, "not applied, the node keeps generation %d: %v", from.gen, err)
}

// set makes r the running config.
func (c *configs) set(r running, lastErr string) {
	c.guard.Lock()
	defer c.guard.Unlock()
	c.cur, c.raw, c.generation, c.lastErr = r.cfg, r.doc, r.gen, lastErr
}

// expire reverts the try t when its time is up, unless it was confirmed
// meanwhile.
func (c *configs) expire(t *pendingTry) {
	c.mu.Lock()
	c.guard.Lock()
	current := c.try == t
	c.guard.Unlock()
	if !current {
		c.mu.Unlock()
		return
	}
	cur := c.running()
	why := fmt.Sprintf("generation %d reverted: not confirmed by %s", cur.gen, t.until.Format(time.RFC3339))
	if err := c.switchTo(cur, t.prev, why); err != nil {
		slog.Error("the tried machine config could not be reverted", "generation", cur.gen, "err", err)
		c.set(cur, why+"; the revert failed: "+err.Error())
	} else {
		slog.Warn("tried machine config reverted", "generation", cur.gen, "to", t.prev.gen, "why", "not confirmed in time")
		c.event(cur.gen, fmt.Sprintf("reverted to generation %d: not confirmed in time", t.prev.gen))
	}
	// The try ends with the revert, all of it: Status shows no try only
	// once the next change can start.
	c.guard.Lock()
	c.try = nil
	c.mu.Unlock()
	c.guard.Unlock()
}

// Confirm keeps the config being tried: it is written to STATE.
func (c *configs) Confirm() (*machine.ConfirmConfigResponse, error) {
	if err := c.lock(); err != nil {
		return nil, err
	}
	defer c.mu.Unlock()
	c.guard.Lock()
	t := c.try
	c.guard.Unlock()
	if t == nil {
		return nil, status.Error(codes.FailedPrecondition, "no config is being tried: nothing to confirm (apply one with --mode try)")
	}
	cur := c.running()
	if err := c.save(cur, false); err != nil {
		return nil, err
	}
	t.timer.Stop()
	c.guard.Lock()
	c.try = nil
	c.guard.Unlock()
	slog.Info("tried machine config confirmed", "generation", cur.gen)
	c.event(cur.gen, "confirmed: written to STATE")
	return &machine.ConfirmConfigResponse{Generation: cur.gen}, nil
}

// save writes r to STATE, whole or not at all, and keeps the config it
// replaces beside it (previousSuffix). A config for a boot (trial) is on
// trial until a boot with it is healthy (see checkTrial); one applied live
// has shown itself already.
func (c *configs) save(r running, trial bool) error {
	old, err := os.ReadFile(c.statePath)
	if err == nil {
		err = atomicfile.WriteFile(c.statePath+previousSuffix, old, 0o600)
	} else if errors.Is(err, fs.ErrNotExist) {
		err = nil
	}
	if err == nil && trial {
		// Before the config: a power cut between the two leaves a marker
		// of another generation, which the boot drops.
		err = atomicfile.WriteFile(c.statePath+trialSuffix, []byte(fmt.Sprintf("%d\n", r.gen)), 0o600)
	}
	if err == nil {
		err = atomicfile.WriteFile(c.statePath, withGeneration(r.gen, r.doc), 0o600)
	}
	if err == nil && !trial {
		if err = os.Remove(c.statePath + trialSuffix); errors.Is(err, fs.ErrNotExist) {
			err = nil
		}
	}
	if err != nil {
		return status.Errorf(codes.Internal, "write the machine config to STATE, nothing changed: %v", err)
	}
	c.guard.Lock()
	c.bootGen = r.gen
	c.guard.Unlock()
	slog.Info("machine config written to STATE", "generation", r.gen, "path", c.statePath, "trial", trial)
	return nil
}

// Files beside STATE's config: the config it held before the last write,
// and the marker of a config on trial, which holds its generation, and
// "booted" once a boot started with it.
const (
	previousSuffix = ".previous"
	trialSuffix    = ".trial"
)

// trialDeadline is how long a boot with a config on trial has to become
// healthy: containerd and cairn-agent Ready.
const trialDeadline = 5 * time.Minute

// checkTrial runs at boot, before STATE's config at statePath is loaded.
// A config on trial that a boot already started with, and that never
// became healthy, is replaced by the previous one: it returns why. A
// config on trial that no boot started with yet is marked as booted now.
func checkTrial(statePath string) (reverted string, err error) {
	marker, err := os.ReadFile(statePath + trialSuffix)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read the config's trial marker: %w", err)
	}
	data, err := os.ReadFile(statePath)
	if err != nil {
		return "", err // loadConfig says it
	}
	gen, _ := splitGeneration(data)
	f := strings.Fields(string(marker))
	switch {
	case len(f) == 0 || f[0] != strconv.FormatUint(gen, 10):
		// Of a config that was not written after all (a power cut).
		return "", os.Remove(statePath + trialSuffix)
	case len(f) == 1:
		return "", atomicfile.WriteFile(statePath+trialSuffix, []byte(f[0]+" booted\n"), 0o600)
	}
	prev, err := os.ReadFile(statePath + previousSuffix)
	if err != nil {
		return "", fmt.Errorf("generation %d did not become healthy at its last boot, and there is no previous config to go back to: %w", gen, err)
	}
	if err := atomicfile.WriteFile(statePath, prev, 0o600); err != nil {
		return "", fmt.Errorf("go back from generation %d, which did not become healthy: %w", gen, err)
	}
	if err := os.Remove(statePath + trialSuffix); err != nil {
		return "", err
	}
	prevGen, _ := splitGeneration(prev)
	why := fmt.Sprintf("generation %d reverted to %d at boot: the boot with it did not become healthy (containerd and cairn-agent Ready) within %s", gen, prevGen, trialDeadline)
	slog.Warn(why)
	return why, nil
}

// keepIfHealthy ends the trial of the config the node booted with, if it
// is on trial: once healthy() holds, the config is kept; if it does not
// within deadline, the node reboots, and the next boot goes back to the
// previous config. stop ends the wait (the shutdown).
func (c *configs) keepIfHealthy(healthy func() bool, deadline time.Duration, stop <-chan struct{}) {
	marker, err := os.ReadFile(c.statePath + trialSuffix)
	if err != nil {
		return // none on trial
	}
	gen := c.Status().Generation
	if f := strings.Fields(string(marker)); len(f) != 2 || f[0] != strconv.FormatUint(gen, 10) {
		return // a config staged meanwhile for the next boot
	}
	c.setOnTrial(true)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	timeout := time.After(deadline)
	for !healthy() {
		select {
		case <-stop:
			if healthy() { // a shutdown soon after the boot
				break
			}
			return
		case <-timeout:
			why := fmt.Sprintf("generation %d did not become healthy (containerd and cairn-agent Ready) within %s: rebooting into the previous config", gen, deadline)
			slog.Error(why)
			c.guard.Lock()
			c.lastErr = why
			c.guard.Unlock()
			c.reboot()
			return
		case <-tick.C:
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if now, err := os.ReadFile(c.statePath + trialSuffix); err != nil || !bytes.Equal(now, marker) {
		c.setOnTrial(false)
		return // a config was written to STATE meanwhile
	}
	// Kept only once the marker's removal is on disk: a power cut before
	// the journal commits it would revert the config at the next boot.
	if err := errors.Join(os.Remove(c.statePath+trialSuffix), atomicfile.SyncDir(filepath.Dir(c.statePath))); err != nil {
		slog.Error("the config's trial marker not removed", "err", err)
		return
	}
	c.setOnTrial(false)
	slog.Info("machine config healthy: kept", "generation", gen)
	c.event(gen, "healthy: kept")
}

func (c *configs) setOnTrial(on bool) {
	c.guard.Lock()
	defer c.guard.Unlock()
	c.onTrial = on
}

// noteReverted records why the boot went back to the previous config.
func (c *configs) noteReverted(why string) {
	if c == nil || why == "" {
		return
	}
	c.guard.Lock()
	defer c.guard.Unlock()
	c.lastErr = why
}

// applyLive makes the running node's live fields (machineconfig's effects
// table) go from old to new: sysctls, files, containerd's registries,
// DNS, /etc/hosts entries, static pods, the limits of containerd and the
// agent, the image-backed services, the links' addresses, routes, MTU
// and VLANs. Node labels are the agent's,
// which watches the running config. It goes on past a
// failure and returns every error.
func (c *configs) applyLive(old, new *machineconfig.Config) error {
	var errs []error
	if !maps.Equal(old.Machine.Sysctls, new.Machine.Sysctls) {
		want := maps.Clone(new.Machine.Sysctls)
		if want == nil {
			want = map[string]string{}
		}
		for name := range old.Machine.Sysctls {
			if _, ok := want[name]; !ok {
				if before, ok := c.sysctlsBefore[name]; ok {
					want[name] = before
				}
			}
		}
		was, err := applySysctls(c.live.procSys, want)
		for name, v := range was {
			if _, ok := c.sysctlsBefore[name]; !ok {
				c.sysctlsBefore[name] = v
			}
		}
		errs = append(errs, err)
	}
	if !slices.Equal(old.Machine.Files, new.Machine.Files) {
		_, err := writeFiles(c.live.root, new.Machine.Files)
		errs = append(errs, err, removeFiles(c.live.root, dropped(old.Machine.Files, new.Machine.Files)))
	}
	if !reflect.DeepEqual(old.Containerd, new.Containerd) {
		errs = append(errs, writeContainerdConfig(c.live.root, new))
	}
	if !slices.Equal(old.Network.Nameservers, new.Network.Nameservers) || !slices.Equal(old.Network.SearchDomains, new.Network.SearchDomains) {
		c.guard.Lock()
		res := c.res
		c.guard.Unlock()
		if res != nil {
			errs = append(errs, res.setConfig(new.Network))
		}
	}
	if !slices.Equal(old.Machine.Time.Servers, new.Machine.Time.Servers) {
		c.guard.Lock()
		k := c.clock
		c.guard.Unlock()
		if k != nil {
			k.setServers(new.Machine.Time.Servers)
		}
	}
	c.guard.Lock()
	sup, links := c.services, c.links
	c.guard.Unlock()
	if links != nil && !reflect.DeepEqual(old.Network.Interfaces, new.Network.Interfaces) {
		errs = append(errs, links.Reconfigure(old.Network, new.Network))
	}
	if sup != nil {
		for name, r := range map[string][2]machineconfig.Resources{
			"containerd":  {old.Machine.Resources.Containerd, new.Machine.Resources.Containerd},
			"cairn-agent": {old.Machine.Resources.Agent, new.Machine.Resources.Agent},
		} {
			if r[0] != r[1] {
				errs = append(errs, sup.SetResources(name, cgroupResources(r[1])))
			}
		}
		if !reflect.DeepEqual(old.Services, new.Services) {
			errs = append(errs, sup.Replace(old.Services, new.Services))
		}
	}
	if !reflect.DeepEqual(old.Network.ExtraHostEntries, new.Network.ExtraHostEntries) {
		errs = append(errs, writeHostEntries(new.Network.ExtraHostEntries))
	}
	if !staticPodsEqual(old.Machine.StaticPods, new.Machine.StaticPods) {
		errs = append(errs, writeStaticPods(c.live.staticPodDir, new.Machine.StaticPods))
	}
	return errors.Join(errs...)
}

// dropped are the paths of old's files that new does not have.
func dropped(old, new []machineconfig.File) []string {
	var out []string
	for _, f := range old {
		if !slices.ContainsFunc(new, func(n machineconfig.File) bool { return n.Path == f.Path }) {
			out = append(out, f.Path)
		}
	}
	return out
}

func staticPodsEqual(a, b []machineconfig.StaticPod) bool {
	return slices.EqualFunc(a, b, func(x, y machineconfig.StaticPod) bool { return bytes.Equal(x, y) })
}
