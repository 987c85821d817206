package agentnode

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"
	"google.golang.org/grpc"

	"github.com/cairn-os/cairn/api/client"
	"github.com/cairn-os/cairn/api/machine"
	"github.com/cairn-os/cairn/internal/version"
	"github.com/cairn-os/cairn/machineconfig"
	"github.com/cairn-os/cairn/test/kube"
	"github.com/cairn-os/cairn/test/mounts"
	"github.com/cairn-os/cairn/test/repo"
	"github.com/cairn-os/cairn/test/runtime"
)

// ProxyTable and PolicyTable are the nftables tables (family inet) that
// cairn-agent's proxier and NetworkPolicy enforcer program in its network
// namespace, the host's here.
const (
	ProxyTable  = "cairn"
	PolicyTable = "cairn-policy"
)

// Options say which agent to run and where.
type Options struct {
	// Name is the Node's name.
	Name string
	// Bin is the cairn-agent binary (see Build).
	Bin string
	// Dir holds the agent's config, state and log; default tb.TempDir().
	Dir string
	// CNIBin is the directory of the CNI plugins; default CNIPluginDir.
	CNIBin string
	// KubeletPort is the kubelet server's port; default a free one (the
	// upstream kubelet beside it may hold 10250).
	KubeletPort int
}

// Agent is a cairn-agent prepared by New, or running if Start started it.
type Agent struct {
	// Cmd runs the agent; New does not start it.
	Cmd *exec.Cmd
	// Client reaches its management API at Endpoint (127.0.0.1:PORT) and
	// its metrics on MetricsPort.
	Client      *machineconfig.ClientConfig
	Endpoint    string
	MetricsPort int
	// KubeletPort is its kubelet server's, on every address of the host.
	KubeletPort int
	// Log is where Start sends its output.
	Log string

	exited chan struct{}
}

// Build builds the node binary (./init) as make build builds it (static,
// without paths, VCS stamp or build ID) into a temporary directory of tb,
// named cairn-agent: the name it runs the agent by.
func Build(tb testing.TB) string { return BuildPackage(tb, "./init", "cairn-agent") }

// BuildPackage builds the main package pkg of the repository as Build
// builds the node binary, into a file named name.
func BuildPackage(tb testing.TB, pkg, name string) string {
	tb.Helper()
	root, err := repo.Root()
	if err != nil {
		tb.Fatal(err)
	}
	bin := filepath.Join(tb.TempDir(), name)
	cmd := exec.Command("go", "build", "-trimpath", "-buildvcs=false", "-ldflags=-s -w -buildid=", "-o", bin, pkg)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("build %s: %v\n%s", pkg, err, out)
	}
	return bin
}

// CNIPluginDir is the directory of the CNI plugins that test/runtime's
// containerd runs, which make components built.
func CNIPluginDir(tb testing.TB) string {
	tb.Helper()
	dir := os.Getenv(runtime.EnvBin)
	if dir == "" {
		root, err := repo.Root()
		if err != nil {
			tb.Fatal(err)
		}
		dir = filepath.Join(root, "_out", "bin")
	}
	return filepath.Join(dir, "cni")
}

// FreePort returns a TCP port of 127.0.0.1 that nothing listens on now.
func FreePort(tb testing.TB) int {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// New prepares cairn-agent as Node opts.Name of c with its pods on rt. Its
// machine config is one that machineconfig.Generate makes (as `cairn config
// gen` does) with free ports for the API and the metrics, and a cluster
// section that joins c with its bootstrap token, whose pod range is rt's
// bridge subnet.
//
// Everything it writes is in opts.Dir but two things. Its proxier and its
// NetworkPolicy enforcer program the tables inet cairn and cairn-policy
// (ProxyTable, PolicyTable) in the host's network namespace: there must be
// none before, and Cleanup deletes them. (Its pod routes route no other
// Node here: they all have the host's address, as it does.) The pod network it writes
// goes to a directory that containerd does not read, so that its pods use
// rt's bridge network. No init runs: New serves the least of init's
// control socket that the management API needs, until tb ends.
func New(tb testing.TB, c *kube.Cluster, rt *runtime.Runtime, opts Options) *Agent {
	tb.Helper()
	for _, table := range []string{ProxyTable, PolicyTable} {
		if exists, err := hasNFTable(table); err != nil {
			tb.Fatalf("list the host's nftables tables: %v", err)
		} else if exists {
			tb.Fatalf("the host has an nftables table inet %s already, which cairn-agent would take over: delete it (nft delete table inet %[1]s) or run where there is none", table)
		}
	}
	dir := opts.Dir
	if dir == "" {
		dir = tb.TempDir()
	}
	if opts.CNIBin == "" {
		opts.CNIBin = CNIPluginDir(tb)
	}
	if opts.KubeletPort == 0 {
		opts.KubeletPort = FreePort(tb)
	}
	apiPort, metricsPort := FreePort(tb), FreePort(tb)
	endpoint := net.JoinHostPort("127.0.0.1", strconv.Itoa(apiPort))
	bundle, err := machineconfig.Generate(machineconfig.GenerateOptions{Hostname: opts.Name, Endpoints: []string{endpoint}})
	if err != nil {
		tb.Fatal(err)
	}
	bundle.Config.Machine.API.Port, bundle.Config.Machine.API.MetricsPort = apiPort, metricsPort
	subnet := rt.Subnet.String()
	bundle.Config.Cluster = &machineconfig.Cluster{
		Server: c.URL, CA: string(c.CAPEM), BootstrapToken: c.BootstrapToken,
		PodCIDR: subnet, ClusterCIDRs: []string{subnet},
		KubeletPort: opts.KubeletPort,
	}
	if err := bundle.Write(filepath.Join(dir, "config"), false); err != nil {
		tb.Fatal(err)
	}
	config := filepath.Join(dir, "config", machineconfig.MachineConfigFile)
	if _, err := machineconfig.Load(config); err != nil {
		tb.Fatalf("the agent's machine config: %v", err)
	}
	cniConf := filepath.Join(dir, "cni-net.d")
	if err := os.Mkdir(cniConf, 0o755); err != nil {
		tb.Fatal(err)
	}
	// The volumes of the pods the agent leaves running.
	mounts.UnmountAtEnd(tb, filepath.Join(dir, "kubelet-root"))
	initSocket := filepath.Join(dir, "init.sock")
	serveInit(tb, initSocket)
	cmd := exec.Command(opts.Bin,
		"-config", config,
		"-init-socket", initSocket,
		"-kubelet-dir", filepath.Join(dir, "kubelet"),
		"-kubelet-root-dir", filepath.Join(dir, "kubelet-root"),
		"-cri-socket", rt.Socket,
		"-pod-log-root", filepath.Join(dir, "pods"),
		"-cni-bin-dir", opts.CNIBin,
		"-cni-conf-dir", cniConf,
	)
	return &Agent{Cmd: cmd, Client: bundle.Client, Endpoint: endpoint, MetricsPort: metricsPort,
		KubeletPort: opts.KubeletPort, Log: filepath.Join(dir, "cairn-agent.log")}
}

// stopGrace is how long the agent gets after SIGTERM before SIGKILL.
const stopGrace = 15 * time.Second

// Start prepares the agent with New, starts it in a process group of its
// own (killed if the test dies) with its output to a.Log, and returns once
// it is Ready. When tb ends it stops the agent (SIGTERM, then SIGKILL) and
// runs Cleanup; rt's own cleanup removes the pods it left.
func Start(tb testing.TB, c *kube.Cluster, rt *runtime.Runtime, opts Options) *Agent {
	tb.Helper()
	a := New(tb, c, rt, opts)
	f, err := os.Create(a.Log)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	a.Cmd.Stdout, a.Cmd.Stderr = f, f
	a.Cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := a.Cmd.Start(); err != nil {
		tb.Fatalf("start cairn-agent: %v", err)
	}
	a.exited = make(chan struct{})
	go func() { a.Cmd.Wait(); close(a.exited) }()
	tb.Cleanup(func() {
		pgid := -a.Cmd.Process.Pid
		syscall.Kill(pgid, syscall.SIGTERM)
		select {
		case <-a.exited:
		case <-time.After(stopGrace):
			syscall.Kill(pgid, syscall.SIGKILL)
			<-a.exited
		}
		if err := a.Cleanup(); err != nil {
			tb.Errorf("after cairn-agent: %v", err)
		}
	})
	if err := a.Ready(context.Background()); err != nil {
		tb.Fatalf("%v\n%s", err, a.Tail())
	}
	return a
}

// Running returns an error, with the end of its log, if the agent that
// Start started has exited.
func (a *Agent) Running() error {
	select {
	case <-a.exited:
		return fmt.Errorf("cairn-agent exited: %v\n%s", a.Cmd.ProcessState, a.Tail())
	default:
		return nil
	}
}

// Tail is the end of the agent's log, for failure messages.
func (a *Agent) Tail() string {
	b, _ := os.ReadFile(a.Log)
	if len(b) > 6000 {
		b = b[len(b)-6000:]
	}
	return fmt.Sprintf("--- last lines of cairn-agent (%s):\n%s", a.Log, b)
}

// Cleanup deletes what the agent leaves outside its directory once
// stopped: its nftables tables.
func (a *Agent) Cleanup() error {
	return errors.Join(deleteNFTable(ProxyTable), deleteNFTable(PolicyTable))
}

// Ready waits until the management API answers and the proxier has
// written its table once: the whole agent is at work.
func (a *Agent) Ready(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	c, err := client.Dial(a.Client, a.Endpoint)
	if err != nil {
		return err
	}
	defer c.Close()
	for {
		_, verr := c.Version(ctx, &machine.VersionRequest{})
		var m map[string]float64
		merr := verr
		if verr == nil {
			if m, merr = a.Metrics(ctx); merr == nil && m[`cairn_proxy_sync_duration_seconds_count{kind="full"}`] == 0 {
				merr = errors.New("the proxier has not synced yet")
			}
		}
		if merr == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cairn-agent at %s not ready: %w", a.Endpoint, merr)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Metrics scrapes the agent's metrics, as `cairn node metrics` does, and
// returns the samples by name and labels as printed.
func (a *Agent) Metrics(ctx context.Context) (map[string]float64, error) {
	var out strings.Builder
	if err := client.Metrics(ctx, a.Client, a.Endpoint, a.MetricsPort, &out); err != nil {
		return nil, err
	}
	m := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(out.String()))
	for sc.Scan() {
		line := sc.Text()
		i := strings.LastIndexByte(line, ' ')
		if strings.HasPrefix(line, "#") || i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			m[line[:i]] = v
		}
	}
	return m, sc.Err()
}

// initStub is the least of init's control socket that the agent's
// management API needs here: a boot timeline with no steps, the
// config's first generation and the image's UKI, for Version (which asks
// init for these and fails without); every other call answers
// Unimplemented. It runs in the test's process, as init runs in a process
// of its own on a node.
type initStub struct {
	machine.UnimplementedInitServer
}

func (initStub) BootTimeline(context.Context, *machine.BootTimelineRequest) (*machine.BootTimelineResponse, error) {
	return &machine.BootTimelineResponse{}, nil
}

func (initStub) ConfigStatus(context.Context, *machine.ConfigStatusRequest) (*machine.ConfigState, error) {
	return &machine.ConfigState{Generation: 1, BootGeneration: 1}, nil
}

func (initStub) BootStatus(context.Context, *machine.BootStatusRequest) (*machine.BootState, error) {
	return &machine.BootState{Entry: "cairn-" + version.Version + ".efi", Blessed: true}, nil
}

// serveInit serves initStub on the unix socket path until tb ends.
func serveInit(tb testing.TB, path string) {
	tb.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		tb.Fatal(err)
	}
	srv := grpc.NewServer()
	machine.RegisterInitServer(srv, initStub{})
	go srv.Serve(l)
	tb.Cleanup(srv.Stop)
}

// hasNFTable says whether the host's network namespace has the table inet
// name.
func hasNFTable(name string) (bool, error) {
	c, err := nftables.New()
	if err != nil {
		return false, err
	}
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return false, err
	}
	return slices.ContainsFunc(tables, func(t *nftables.Table) bool { return t.Name == name }), nil
}

// deleteNFTable deletes the table inet name of the host's network
// namespace if there is one.
func deleteNFTable(name string) error {
	if exists, err := hasNFTable(name); err != nil || !exists {
		return err
	}
	c, err := nftables.New()
	if err != nil {
		return err
	}
	c.DelTable(&nftables.Table{Name: name, Family: nftables.TableFamilyINet})
	if err := c.Flush(); err != nil {
		return fmt.Errorf("delete table inet %s: %w", name, err)
	}
	return nil
}
