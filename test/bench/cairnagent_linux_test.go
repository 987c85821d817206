//go:build bench

package bench

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
	"testing"
	"time"

	"github.com/google/nftables"
	"google.golang.org/grpc"

	"github.com/cairn-os/cairn/api/client"
	"github.com/cairn-os/cairn/api/machine"
	"github.com/cairn-os/cairn/machineconfig"
	"github.com/cairn-os/cairn/test/kube"
	"github.com/cairn-os/cairn/test/repo"
	"github.com/cairn-os/cairn/test/runtime"
)

// buildNodeBinary builds the package pkg (such as ./agent) as make build
// builds the node binaries: static, without paths, VCS stamp or build ID.
func buildNodeBinary(b *testing.B, pkg, name string) string {
	b.Helper()
	root, err := repo.Root()
	if err != nil {
		b.Fatal(err)
	}
	bin := filepath.Join(b.TempDir(), name)
	cmd := exec.Command("go", "build", "-trimpath", "-buildvcs=false", "-ldflags=-s -w -buildid=", "-o", bin, pkg)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("build %s: %v\n%s", pkg, err, out)
	}
	return bin
}

// cniPluginDir is the directory of the CNI plugins that test/runtime's
// containerd runs, which make components built.
func cniPluginDir(b *testing.B) string {
	b.Helper()
	dir := os.Getenv(runtime.EnvBin)
	if dir == "" {
		root, err := repo.Root()
		if err != nil {
			b.Fatal(err)
		}
		dir = filepath.Join(root, "_out", "bin")
	}
	return filepath.Join(dir, "cni")
}

// proxyTable is the nftables table (family inet) that cairn-agent's
// proxier programs in its network namespace, the host's here.
const proxyTable = "cairn"

// agentNode is a running cairn-agent with what reaches its management API
// and its metrics.
type agentNode struct {
	client      *machineconfig.ClientConfig
	endpoint    string // the management API, 127.0.0.1:PORT
	metricsPort int
}

// startCairnAgent starts cairn-agent, the binary built from ./agent, as
// Node node with its state in dir: the whole process, with its management
// API, its metrics and its Service proxier, as init starts it on a node
// but for the paths its flags point elsewhere. Its machine config is one
// that machineconfig.Generate makes (as `cairn config gen` does) with free
// ports for the API, the metrics and the kubelet server, and a cluster
// section that joins c with its bootstrap token, whose pod range is rt's
// bridge subnet.
//
// Everything it writes is in dir but two things. Its proxier programs the
// table inet cairn in the host's network namespace: there must be none
// before, and it is deleted after. The pod network it writes goes to a
// directory of dir that containerd does not read, so that its pods, like
// the other contenders', use rt's bridge network. No init runs: the
// benchmark serves init's control socket with serveInit.
func startCairnAgent(b *testing.B, c *kube.Cluster, rt *runtime.Runtime, bin, cniBin, dir, node string) *proc {
	b.Helper()
	if exists, err := hasNFTable(proxyTable); err != nil {
		b.Fatalf("list the host's nftables tables: %v", err)
	} else if exists {
		b.Fatalf("the host has an nftables table inet %s already, which cairn-agent's proxier would take over: delete it (nft delete table inet %[1]s) or run the benchmark where there is none", proxyTable)
	}
	apiPort, metricsPort := freePort(b), freePort(b)
	endpoint := net.JoinHostPort("127.0.0.1", strconv.Itoa(apiPort))
	bundle, err := machineconfig.Generate(machineconfig.GenerateOptions{Hostname: node, Endpoints: []string{endpoint}})
	if err != nil {
		b.Fatal(err)
	}
	bundle.Config.Machine.API.Port, bundle.Config.Machine.API.MetricsPort = apiPort, metricsPort
	subnet := rt.Subnet.String()
	bundle.Config.Cluster = &machineconfig.Cluster{
		Server: c.URL, CA: string(c.CAPEM), BootstrapToken: c.BootstrapToken,
		PodCIDR: subnet, ClusterCIDRs: []string{subnet},
		// The upstream kubelet beside it may hold 10250.
		KubeletPort: freePort(b),
	}
	if err := bundle.Write(filepath.Join(dir, "config"), false); err != nil {
		b.Fatal(err)
	}
	config := filepath.Join(dir, "config", machineconfig.MachineConfigFile)
	if _, err := machineconfig.Load(config); err != nil {
		b.Fatalf("the agent's machine config: %v", err)
	}
	cniConf := filepath.Join(dir, "cni-net.d")
	if err := os.Mkdir(cniConf, 0o755); err != nil {
		b.Fatal(err)
	}
	initSocket := filepath.Join(dir, "init.sock")
	serveInit(b, initSocket)
	cmd := exec.Command(bin,
		"-config", config,
		"-init-socket", initSocket,
		"-kubelet-dir", filepath.Join(dir, "kubelet"),
		"-cri-socket", rt.Socket,
		"-pod-log-root", filepath.Join(dir, "pods"),
		"-cni-bin-dir", cniBin,
		"-cni-conf-dir", cniConf,
	)
	p := startProc(b, "cairn-agent", filepath.Join(dir, "cairn-agent.log"), cmd, func() {
		var errs []error
		if err := removeSandboxes(context.Background(), rt); err != nil {
			errs = append(errs, err)
		}
		if err := deleteNFTable(proxyTable); err != nil {
			errs = append(errs, err)
		}
		if err := errors.Join(errs...); err != nil {
			b.Errorf("after cairn-agent: %v", err)
		}
	})
	a := &agentNode{client: bundle.Client, endpoint: endpoint, metricsPort: metricsPort}
	p.ready = a.ready
	p.summary = a.summary
	return p
}

// ready waits until the management API answers and the proxier has
// written its table once: the whole agent is at work.
func (a *agentNode) ready(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	c, err := client.Dial(a.client, a.endpoint)
	if err != nil {
		return err
	}
	defer c.Close()
	for {
		_, verr := c.Version(ctx, &machine.VersionRequest{})
		var m map[string]float64
		merr := verr
		if verr == nil {
			if m, merr = a.metrics(ctx); merr == nil && m[`cairn_proxy_sync_duration_seconds_count{kind="full"}`] == 0 {
				merr = errors.New("the proxier has not synced yet")
			}
		}
		if merr == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cairn-agent at %s not ready: %w", a.endpoint, merr)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// summary is a line on what the agent's own metrics say it did.
func (a *agentNode) summary(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	m, err := a.metrics(ctx)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("its metrics (scraped over mTLS): pods started %.0f, Lease renewals %.0f, proxier syncs %.0f full + %.0f partial, %.0f rules",
		m["cairn_kubelet_pod_start_duration_seconds_count"], m[`cairn_kubelet_lease_renewals_total{result="success"}`],
		m[`cairn_proxy_sync_duration_seconds_count{kind="full"}`], m[`cairn_proxy_sync_duration_seconds_count{kind="partial"}`],
		m["cairn_proxy_rules"]), nil
}

// metrics scrapes the agent's metrics, as `cairn node metrics` does, and
// returns the samples by name and labels as printed.
func (a *agentNode) metrics(ctx context.Context) (map[string]float64, error) {
	var out strings.Builder
	if err := client.Metrics(ctx, a.client, a.endpoint, a.metricsPort, &out); err != nil {
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
// management API needs here: a boot timeline with no steps, for Version
// (which asks init for it and fails without); every other call answers
// Unimplemented. It runs in the benchmark's process, as init runs in a
// process of its own on a node.
type initStub struct {
	machine.UnimplementedInitServer
}

func (initStub) BootTimeline(context.Context, *machine.BootTimelineRequest) (*machine.BootTimelineResponse, error) {
	return &machine.BootTimelineResponse{}, nil
}

// serveInit serves initStub on the unix socket path until b ends.
func serveInit(b *testing.B, path string) {
	b.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		b.Fatal(err)
	}
	srv := grpc.NewServer()
	machine.RegisterInitServer(srv, initStub{})
	go srv.Serve(l)
	b.Cleanup(srv.Stop)
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
