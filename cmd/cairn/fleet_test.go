package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cairn-os/cairn/agent/api"
	"github.com/cairn-os/cairn/agent/drain"
	"github.com/cairn-os/cairn/api/machine"
	"github.com/cairn-os/cairn/image"
	"github.com/cairn-os/cairn/machineconfig"
	"github.com/cairn-os/cairn/test/poll"
)

// nodeInit stands in for one node's init, which only PID 1 serves, on a
// real control socket: its one service and log lines carry its name.
type nodeInit struct {
	machine.UnimplementedInitServer
	name string

	// refuse makes Upgrade fail; upgrades records when each began and
	// ended, in the fleet's shared log.
	refuse   bool
	upgrades *eventLog
}

// Upgrade reads the UKI to its end and stages it, or refuses it.
func (n *nodeInit) Upgrade(s grpc.BidiStreamingServer[machine.UpgradeRequest, machine.UpgradeProgress]) error {
	n.upgrades.add("begin " + n.name)
	defer n.upgrades.add("end " + n.name)
	var got uint64
	for {
		req, err := s.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		got += uint64(len(req.GetChunk()))
	}
	time.Sleep(100 * time.Millisecond) // long enough for waves to overlap if they did
	if n.refuse {
		return status.Error(codes.FailedPrecondition, "refused by "+n.name)
	}
	return s.Send(&machine.UpgradeProgress{Step: "staged", Message: fmt.Sprintf("%d bytes staged on %s", got, n.name), Bytes: got})
}

// eventLog is what nodes did, in order.
type eventLog struct {
	mu     sync.Mutex
	events []string
}

func (l *eventLog) add(e string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, e)
}

func (l *eventLog) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.events)
}

func (n *nodeInit) Services(context.Context, *machine.ServicesRequest) (*machine.ServicesResponse, error) {
	return &machine.ServicesResponse{Services: []*machine.ServiceStatus{{Name: "svc-" + n.name, State: "Running", Pid: 42}}}, nil
}

func (n *nodeInit) ServiceRestart(context.Context, *machine.ServiceRestartRequest) (*machine.ServiceRestartResponse, error) {
	return &machine.ServiceRestartResponse{}, nil
}

// Logs sends three lines, the second in two chunks, then waits for the
// client to end a followed stream.
func (n *nodeInit) Logs(req *machine.LogsRequest, s grpc.ServerStreamingServer[machine.LogsChunk]) error {
	for _, chunk := range []string{"one " + n.name + "\ntwo ", n.name + "\n", "three " + n.name + "\n"} {
		if err := s.Send(&machine.LogsChunk{Data: []byte(chunk)}); err != nil {
			return err
		}
	}
	if req.Follow {
		<-s.Context().Done()
	}
	return nil
}

// fleet is a client config and the nodes it reaches: real agent API
// servers on loopback, with real TLS, each with its own init stand-in.
type fleet struct {
	config string
	stop   map[string]func() // by endpoint
	inits  []*nodeInit
	events *eventLog
}

// startFleet serves n nodes, the first at [::1]:PORT and the others at
// 127.0.0.1:PORT, so that their names differ in length.
func startFleet(t *testing.T, n int) (*fleet, []string) {
	t.Helper()
	b, err := machineconfig.Generate(machineconfig.GenerateOptions{Hostname: "unit", Now: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	fl := &fleet{config: filepath.Join(t.TempDir(), "cairnconfig"), stop: map[string]func(){}, events: &eventLog{}}
	var endpoints []string
	for i := range n {
		sock := filepath.Join(t.TempDir(), "init.sock")
		il, err := net.Listen("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		is := grpc.NewServer()
		ni := &nodeInit{name: "node" + strconv.Itoa(i), upgrades: fl.events}
		fl.inits = append(fl.inits, ni)
		machine.RegisterInitServer(is, ni)
		go is.Serve(il)
		t.Cleanup(is.Stop)
		initc, err := api.DialInit(sock)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { initc.Close() })

		addr := "127.0.0.1:0"
		if i == 0 {
			addr = "[::1]:0"
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		creds, err := api.NewCredentials(&b.Config.Machine.API)
		srv := api.NewServer(creds, initc, drain.New(filepath.Join(t.TempDir(), "drain.json"), slog.Default()), t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		go srv.Serve(l)
		t.Cleanup(srv.Stop)
		e := l.Addr().String()
		endpoints = append(endpoints, e)
		fl.stop[e] = srv.Stop
	}
	// The operator's certificate, for restart and audit.
	cert, key, err := b.CA.IssueClient("fleet-operator", machineconfig.RoleOperator, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	cc := *b.Client
	cc.Cert, cc.Key, cc.Endpoints = string(cert), string(key), endpoints
	if err := cc.Write(fl.config); err != nil {
		t.Fatal(err)
	}
	return fl, endpoints
}

// cairn runs the CLI with args and returns its output and error.
func (fl *fleet) cairn(ctx context.Context, args ...string) (stdout, stderr string, err error) {
	var out, errOut bytes.Buffer
	cmd := rootCmd()
	cmd.SetArgs(append([]string{"node", "--cairnconfig", fl.config}, args...))
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	err = cmd.ExecuteContext(ctx)
	return out.String(), errOut.String(), err
}

// byNode splits prefixed output into each node's lines, the prefix
// removed, and fails on a line without one or one not aligned.
func byNode(t *testing.T, out string, endpoints []string) map[string][]string {
	t.Helper()
	width := 0
	for _, e := range endpoints {
		width = max(width, len(e)+2)
	}
	lines := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		node, _, ok := strings.Cut(line, ": ")
		if !ok || len(line) < width || strings.TrimSpace(line[:width]) != node+":" {
			t.Errorf("line %q: want it to start with its node and a colon, padded to %d", line, width)
			continue
		}
		lines[node] = append(lines[node], line[width:])
	}
	return lines
}

// TestNodesFanOut runs verbs on several real node APIs at once, one of
// them stopped and one that accepts connections but never answers: the
// others' output is whole and prefixed by node, the failures are named
// with their addresses, and nothing waits longer than the connect timeout.
func TestNodesFanOut(t *testing.T) {
	fl, endpoints := startFleet(t, 3)
	stopped := endpoints[2]
	fl.stop[stopped]()
	silentL, err := net.Listen("tcp", "127.0.0.1:0") // the kernel accepts; nobody speaks TLS
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { silentL.Close() })
	silent := silentL.Addr().String()
	all := append(slices.Clone(endpoints), silent)
	live := endpoints[:2]
	ctx := context.Background()

	// What each live node says alone, unprefixed, is what it says among others.
	alone := map[string][]string{}
	for _, e := range live {
		out, _, err := fl.cairn(ctx, "--nodes", e, "services")
		if err != nil {
			t.Fatalf("cairn node --nodes %s services: %v", e, err)
		}
		alone[e] = strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	}

	start := time.Now()
	out, stderr, err := fl.cairn(ctx, "--nodes", strings.Join(all, ","), "--connect-timeout", "1s", "services")
	took := time.Since(start)
	t.Logf("services on %d nodes, 2 of them failing, with --connect-timeout 1s: %v", len(all), took)
	if took > 5*time.Second {
		t.Errorf("services on %d nodes took %v, want about the connect timeout (1s)", len(all), took)
	}
	if diff := cmp.Diff(alone, byNode(t, out, all)); diff != "" {
		t.Errorf("services on several nodes, by node (-alone +together):\n%s", diff)
	}
	for i, e := range live {
		if !strings.Contains(strings.Join(alone[e], "\n"), fmt.Sprintf("svc-node%d", i)) {
			t.Errorf("services on %s alone = %q, want its service svc-node%d", e, alone[e], i)
		}
	}
	if err == nil {
		t.Fatal("services with a stopped node and a silent one succeeded, want an error")
	}
	summary := err.Error()
	if !strings.HasPrefix(summary, "2 of 4 nodes failed:") {
		t.Errorf("error = %q, want it to start with 2 of 4 nodes failed", summary)
	}
	for _, e := range []string{stopped, silent} {
		if !strings.Contains(summary, "\n  "+e+":") || !strings.Contains(stderr, e+":") {
			t.Errorf("error = %q, stderr = %q: want both to name %s", summary, stderr, e)
		}
	}
	if !strings.Contains(summary, "connection refused") {
		t.Errorf("error = %q, want the stopped node's connection refused", summary)
	}
	for _, e := range live {
		if strings.Contains(summary, e+":") {
			t.Errorf("error = %q names %s, which answered", summary, e)
		}
	}

	// A followed log: every node's lines arrive whole, interleaved by
	// line, while the streams go on; the stopped node's failure is
	// printed at once.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var outBuf, errBuf syncBuffer
	done := make(chan error, 1)
	go func() {
		cmd := rootCmd()
		cmd.SetArgs([]string{"node", "--cairnconfig", fl.config, "--nodes", strings.Join([]string{live[0], stopped, live[1]}, ","), "logs", "-f", "svc"})
		cmd.SetOut(&outBuf)
		cmd.SetErr(&errBuf)
		done <- cmd.ExecuteContext(ctx)
	}()
	want := map[string][]string{}
	for i, e := range live {
		want[e] = []string{fmt.Sprintf("one node%d", i), fmt.Sprintf("two node%d", i), fmt.Sprintf("three node%d", i)}
	}
	poll.Until(t, 10*time.Second, "every live node's log lines and the stopped node's error", func() error {
		if got := strings.Count(outBuf.String(), "\n"); got < 6 {
			return fmt.Errorf("%d lines: %q", got, outBuf.String())
		}
		if !strings.Contains(errBuf.String(), stopped+":") {
			return fmt.Errorf("stderr %q names no %s", errBuf.String(), stopped)
		}
		return nil
	})
	select {
	case err := <-done:
		t.Fatalf("logs -f ended before it was stopped: %v", err)
	default:
	}
	if diff := cmp.Diff(want, byNode(t, outBuf.String(), []string{live[0], stopped, live[1]})); diff != "" {
		t.Errorf("logs -f on several nodes, by node (-want +got):\n%s", diff)
	}
	cancel()
	if err := <-done; err == nil {
		t.Error("logs -f with a stopped node ended without an error")
	}
}

// TestUpgradeWaves stages a UKI on three nodes, --max-parallel at a
// time: a wave begins once the one before ended, and a wave with a
// failure stops the roll, naming the nodes not tried.
func TestUpgradeWaves(t *testing.T) {
	fl, endpoints := startFleet(t, 3)
	uki := filepath.Join(t.TempDir(), "node.efi")
	dir := t.TempDir()
	for _, f := range []string{"vmlinuz", "initrd"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte(f), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := image.WriteUKI(uki, image.UKI{Stub: "/usr/lib/systemd/boot/efi/linuxx64.efi.stub", OSRelease: []byte("ID=cairn\nVERSION_ID=9.9\n"),
		Cmdline: []byte("quiet"), Linux: filepath.Join(dir, "vmlinuz"), Initrd: filepath.Join(dir, "initrd")}); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	nodes := strings.Join(endpoints, ",")

	out, _, err := fl.cairn(ctx, "--nodes", nodes, "upgrade", "--image", uki, "--stage", "--max-parallel", "2")
	if err != nil {
		t.Fatalf("upgrade --max-parallel 2: %v\n%s", err, out)
	}
	ev := fl.events.all()
	if len(ev) != 6 || !slices.Contains(ev[:4], "end node0") || !slices.Contains(ev[:4], "end node1") || ev[4] != "begin node2" {
		t.Errorf("upgrade --max-parallel 2: events %v, want node0 and node1 ended before node2 began", ev)
	}
	fi, err := os.Stat(uki)
	if err != nil {
		t.Fatal(err)
	}
	lines := byNode(t, out, endpoints)
	for i, e := range endpoints {
		if want := fmt.Sprintf("staged    %d bytes staged on node%d", fi.Size(), i); !cmp.Equal(lines[e], []string{want}) {
			t.Errorf("%s printed %q, want %q", e, lines[e], want)
		}
	}

	fl.events.events = nil
	fl.inits[1].refuse = true
	out, _, err = fl.cairn(ctx, "--nodes", nodes, "upgrade", "--image", uki, "--stage", "--max-parallel", "1")
	if err == nil || !strings.Contains(err.Error(), "refused by node1") || !strings.Contains(err.Error(), "stopped: not tried on "+endpoints[2]) {
		t.Errorf("upgrade --max-parallel 1 with node1 refusing: %v, want its refusal and %s not tried\n%s", err, endpoints[2], out)
	}
	if ev := fl.events.all(); !cmp.Equal(ev, []string{"begin node0", "end node0", "begin node1", "end node1"}) {
		t.Errorf("events %v, want node0 then node1, and node2 never", ev)
	}
}

// TestNodesAudit restarts a service on two nodes at once as an operator
// and reads it back from each node's audit.
func TestNodesAudit(t *testing.T) {
	fl, endpoints := startFleet(t, 2)
	ctx := context.Background()
	nodes := strings.Join(endpoints, ",")
	out, _, err := fl.cairn(ctx, "--nodes", nodes, "restart", "containerd")
	if err != nil {
		t.Fatalf("restart on %s: %v", nodes, err)
	}
	for node, lines := range byNode(t, out, endpoints) {
		if !cmp.Equal(lines, []string{"restarted containerd"}) {
			t.Errorf("restart's output from %s = %q, want restarted containerd", node, lines)
		}
	}
	out, _, err = fl.cairn(ctx, "--nodes", nodes, "audit")
	if err != nil {
		t.Fatalf("audit on %s: %v", nodes, err)
	}
	got := byNode(t, out, endpoints)
	for _, e := range endpoints {
		lines := got[e]
		if len(lines) != 2 || !strings.HasPrefix(lines[0], "TIME") {
			t.Errorf("audit of %s = %q, want a header and one record", e, lines)
			continue
		}
		f := strings.Fields(lines[1])
		if len(f) < 8 || f[1] != "fleet-operator" || f[2] != "operator" || f[4] != "ServiceRestart" || f[5] != "name=containerd" || f[6] != "OK" {
			t.Errorf("audit record of %s = %q, want fleet-operator (operator) ServiceRestart name=containerd OK", e, lines[1])
		}
	}
}

// syncBuffer is output written by the nodes' goroutines and read by the
// test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestLinePrefixer writes lines in pieces: each comes out whole after the
// prefix, and a last line that did not end is ended by Flush.
func TestLinePrefixer(t *testing.T) {
	var out bytes.Buffer
	w := &linePrefixer{out: &out, prefix: "a: "}
	for _, p := range []string{"one\ntw", "o\n", "", "three\nfour\nfi", "ve"} {
		if _, err := w.Write([]byte(p)); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := out.String(), "a: one\na: two\na: three\na: four\n"; got != want {
		t.Errorf("before Flush: %q, want %q", got, want)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if got, want := out.String(), "a: one\na: two\na: three\na: four\na: five\n"; got != want {
		t.Errorf("after Flush: %q, want %q", got, want)
	}
}

func TestEndpoints(t *testing.T) {
	cc := &machineconfig.ClientConfig{Endpoints: []string{"10.0.0.1:50000", "10.0.0.2:50000"}}
	for _, tt := range []struct {
		nodes []string
		want  []string
	}{
		{nil, []string{"10.0.0.1:50000"}},
		{[]string{"b:1", " a:1", "b:1", ""}, []string{"b:1", "a:1"}},
	} {
		f := &nodeFlags{nodes: tt.nodes}
		if got, err := f.endpoints(cc); err != nil || !cmp.Equal(got, tt.want) {
			t.Errorf("endpoints with --nodes %q = %q, %v, want %q", tt.nodes, got, err, tt.want)
		}
	}
	f := &nodeFlags{cairnconfig: "empty"}
	if got, err := f.endpoints(&machineconfig.ClientConfig{}); err == nil {
		t.Errorf("endpoints without --nodes nor endpoints in the config = %q, want an error", got)
	}
}
