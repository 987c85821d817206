package main

import (
	"bytes"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentapi "github.com/cairn-os/cairn/agent/api"
	"github.com/cairn-os/cairn/agent/drain"
	"github.com/cairn-os/cairn/api/machine"
	"github.com/cairn-os/cairn/machineconfig"
	"github.com/cairn-os/cairn/test/need"
)

func TestDmesgLine(t *testing.T) {
	for _, tt := range []struct {
		r    *machine.DmesgRecord
		want string
	}{
		{&machine.DmesgRecord{Level: 6, Time: durationpb.New(5140900 * time.Microsecond), Message: "NET: Registered PF_INET6 protocol family"}, "[    5.140900] kern.info   NET: Registered PF_INET6 protocol family\n"},
		{&machine.DmesgRecord{Level: 4, Facility: 1, Time: durationpb.New(36271560883 * time.Microsecond), Message: "hello"}, "[36271.560883] user.warn   hello\n"},
		{&machine.DmesgRecord{Level: 3, Facility: 23, Message: "x"}, "[    0.000000] 23.err      x\n"},
	} {
		if got := dmesgLine(tt.r); got != tt.want {
			t.Errorf("dmesgLine(%v) = %q, want %q", tt.r, got, tt.want)
		}
	}
}

func TestEventLine(t *testing.T) {
	e := &machine.Event{Time: timestamppb.New(time.Date(2026, 12, 2, 8, 0, 1, 5e6, time.UTC)), Kind: "upgrade", Subject: "cairn-0.2.0.efi", Message: "healthy: blessed"}
	if got, want := eventLine(e), "2026-12-02T08:00:01.005Z  upgrade  cairn-0.2.0.efi          healthy: blessed\n"; got != want {
		t.Errorf("eventLine = %q, want %q", got, want)
	}
}

func TestPrintInspect(t *testing.T) {
	var b bytes.Buffer
	printMounts(&b, []*machine.Mount{
		{Source: "/dev/vda4", Target: "/var", Type: "ext4", Options: "rw,nosuid,nodev,relatime", SuperOptions: "rw"},
		{Source: "proc", Target: "/proc", Type: "proc", Options: "rw,nosuid,nodev,noexec,relatime", SuperOptions: "rw"},
	})
	printProcesses(&b, []*machine.Process{
		{Pid: 1, State: "S", CpuTime: durationpb.New(1234 * time.Millisecond), Rss: 9 << 20, Cgroup: "/init", Command: "/sbin/init"},
		{Pid: 2, State: "S", Command: "[kthreadd]", Cgroup: "/"},
	})
	printNetwork(&b, &machine.NetworkResponse{
		Links:    []*machine.Link{{Name: "lo", State: "unknown", Mtu: 65536, Type: "device", Addresses: []string{"127.0.0.1/8", "::1/128"}}},
		Routes:   []*machine.Route{{Destination: "default", Gateway: "10.0.2.2", Device: "eth0", Table: 254, Metric: 1024, Type: "unicast"}, {Destination: "10.0.0.0/8", Device: "eth0", Table: 100, Type: "unicast"}},
		Nftables: "table inet cairn {\n}\n",
		Sockets:  []*machine.Socket{{Protocol: "tcp6", State: "LISTEN", Local: "[::]:50000", Remote: "[::]:0", Pid: 412, Command: "cairn-agent"}},
	})
	want := `SOURCE     TARGET  TYPE  OPTIONS                          FS OPTIONS
/dev/vda4  /var    ext4  rw,nosuid,nodev,relatime         rw
proc       /proc   proc  rw,nosuid,nodev,noexec,relatime  rw
PID  PPID  STATE  CPU    RSS    CGROUP  COMMAND
1    0     S      1.23s  9.0Mi  /init   /sbin/init
2    0     S      0.00s  0.0Mi  /       [kthreadd]
LINK  STATE    MTU    MAC  TYPE    ADDRESSES
lo    unknown  65536       device  127.0.0.1/8, ::1/128

DESTINATION  GATEWAY   DEVICE  SOURCE  TABLE  METRIC  TYPE
default      10.0.2.2  eth0            main   1024    unicast
10.0.0.0/8             eth0            100    0       unicast

PROTO  STATE   LOCAL       REMOTE  PID  COMMAND
tcp6   LISTEN  [::]:50000  [::]:0  412  cairn-agent

nftables:
table inet cairn {
}
`
	if diff := cmp.Diff(want, b.String()); diff != "" {
		t.Errorf("output (-want +got):\n%s", diff)
	}
}

// cliOnAPI serves the real API server on loopback, with no init, and
// returns a runner of the CLI against it with a client of role.
func cliOnAPI(t *testing.T, role string) func(args ...string) (string, string, error) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	endpoint := l.Addr().String()
	bundle, err := machineconfig.Generate(machineconfig.GenerateOptions{Hostname: "unit", Endpoints: []string{endpoint}, Now: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	creds, err := agentapi.NewCredentials(&bundle.Config.Machine.API)
	if err != nil {
		t.Fatal(err)
	}
	srv := agentapi.NewServer(creds, nil, drain.New(filepath.Join(t.TempDir(), "drain.json"), slog.Default()), t.TempDir())
	go srv.Serve(l)
	t.Cleanup(srv.Stop)
	cert, key, err := bundle.CA.IssueClient("ops", role, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	cc := *bundle.Client
	cc.Cert, cc.Key = string(cert), string(key)
	cfgPath := filepath.Join(t.TempDir(), "cairnconfig")
	if err := cc.Write(cfgPath); err != nil {
		t.Fatal(err)
	}
	return func(args ...string) (string, string, error) {
		cmd := rootCmd()
		var out, errOut bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&errOut)
		cmd.SetArgs(append([]string{"node", "--cairnconfig", cfgPath}, args...))
		err := cmd.Execute()
		return out.String(), errOut.String(), err
	}
}

// TestInspectCommands runs `cairn node mounts|processes|network|dmesg|read`
// against the real API server on loopback, as a reader.
func TestInspectCommands(t *testing.T) {
	need.Root(t, "reads /dev/kmsg and nftables")
	run := cliOnAPI(t, machineconfig.RoleReader)
	for _, tt := range []struct {
		args []string
		want []string // lines, or parts of lines, the output has
	}{
		{[]string{"mounts"}, []string{"SOURCE ", " TARGET ", "proc ", " /proc "}},
		{[]string{"processes"}, []string{"PID ", " CGROUP ", " COMMAND", os.Args[0]}},
		{[]string{"network"}, []string{"LINK ", "lo ", "127.0.0.1/8", "\nDESTINATION ", "127.0.0.1/32", " local ", "\nPROTO ", "LISTEN", "\nnftables:\n"}},
		{[]string{"dmesg"}, []string{"] kern."}},
		{[]string{"read", "/proc/sys/kernel/ostype"}, []string{"Linux\n"}},
	} {
		out, _, err := run(tt.args...)
		if err != nil {
			t.Errorf("cairn node %s = %v", strings.Join(tt.args, " "), err)
			continue
		}
		for _, w := range tt.want {
			if !strings.Contains(out, w) {
				t.Errorf("cairn node %s printed\n%s\nwant it to hold %q", strings.Join(tt.args, " "), out, w)
			}
		}
		t.Logf("cairn node %s:\n%s", strings.Join(tt.args, " "), out)
	}

	out, errOut, err := run("read", "--limit", "10", "/etc/passwd")
	if want, _ := os.ReadFile("/etc/passwd"); err != nil || out != string(want[:10]) || !strings.Contains(errOut, "/etc/passwd goes on past the limit: truncated") {
		t.Errorf("cairn node read --limit 10 /etc/passwd = %q, %q, %v; want its first 10 bytes and a word that it was truncated", out, errOut, err)
	}
	if _, _, err := run("read", "/etc/shadow"); err == nil || !strings.Contains(err.Error(), "/etc/shadow is never served: password hashes") {
		t.Errorf("cairn node read /etc/shadow = %v, want it refused as password hashes", err)
	} else {
		t.Logf("cairn node read /etc/shadow: %v", err)
	}
	if _, _, err := run("read", "/usr/bin/env"); err == nil || !strings.Contains(err.Error(), "/usr/bin/env is not under /var/log, /proc, /sys or /etc") {
		t.Errorf("cairn node read /usr/bin/env = %v, want it refused as outside the trees", err)
	} else {
		t.Logf("cairn node read /usr/bin/env: %v", err)
	}
}

// TestProbeCommands runs `cairn node ping|lookup|connect` against the
// real API server on loopback, as an operator, on loopback addresses.
func TestProbeCommands(t *testing.T) {
	need.Root(t, "a raw ICMP socket for ping")
	run := cliOnAPI(t, machineconfig.RoleOperator)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, tt := range []struct {
		args []string
		want []string
	}{
		{[]string{"ping", "-c", "2", "-i", "200ms", "127.0.0.1"}, []string{"reply from 127.0.0.1: seq=1 time=", "reply from 127.0.0.1: seq=2 time=", "2 sent, 2 received"}},
		{[]string{"lookup", "localhost"}, []string{"localhost: "}},
		{[]string{"connect", l.Addr().String()}, []string{"connected to " + l.Addr().String() + " from 127.0.0.1:"}},
	} {
		out, _, err := run(tt.args...)
		if err != nil {
			t.Errorf("cairn node %s = %v", strings.Join(tt.args, " "), err)
			continue
		}
		for _, w := range tt.want {
			if !strings.Contains(out, w) {
				t.Errorf("cairn node %s printed\n%s\nwant it to hold %q", strings.Join(tt.args, " "), out, w)
			}
		}
	}
}
