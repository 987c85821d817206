package api

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cairn-os/cairn/api/client"
	"github.com/cairn-os/cairn/api/machine"
	"github.com/cairn-os/cairn/machineconfig"
	"github.com/cairn-os/cairn/test/need"
	"github.com/cairn-os/cairn/test/poll"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// reader serves the API on loopback and returns a client with the least
// role, the one every inspection call needs.
func reader(t *testing.T) *client.Client {
	t.Helper()
	b, endpoint := serve(t, &recordingInit{}, t.TempDir())
	return clientWithRole(t, b, endpoint, machineconfig.RoleReader)
}

// recvAll reads a server stream to its end.
func recvAll[T any](stream grpc.ServerStreamingClient[T]) ([]*T, error) {
	var out []*T
	for {
		m, err := stream.Recv()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out = append(out, m)
	}
}

// writeKmsg logs msg at level warning from user space, as a record of
// facility user. The newline ends the record: without it the kernel holds
// it open for a continuation, and readers see it only once another record
// is logged.
func writeKmsg(t *testing.T, msg string) {
	t.Helper()
	if err := os.WriteFile(kmsgPath, []byte("<4>"+msg+"\n"), 0); err != nil {
		t.Fatalf("write %s: %v", kmsgPath, err)
	}
}

// TestDmesg reads the kernel log back with a record the test wrote to
// /dev/kmsg, and follows it to see one written after the call started.
func TestDmesg(t *testing.T) {
	need.Root(t, "writes to /dev/kmsg")
	c := reader(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	marker := fmt.Sprintf("cairn-inspect-test %d", time.Now().UnixNano())
	writeKmsg(t, marker+" before")

	stream, err := c.Dmesg(ctx, &machine.DmesgRequest{})
	if err != nil {
		t.Fatal(err)
	}
	recs, err := recvAll(stream)
	if err != nil {
		t.Fatalf("Dmesg() = %v, want the kept records and the end of the stream", err)
	}
	var found *machine.DmesgRecord
	for _, r := range recs {
		if r.Message == marker+" before" {
			found = r
		}
	}
	if found == nil {
		t.Fatalf("Dmesg() = %d records without the test's", len(recs))
	}
	if found.Level != 4 || found.Facility != 1 || found.Time.AsDuration() <= 0 || found.Sequence == 0 {
		t.Errorf("Dmesg() has the test's record as %v, want it at level 4, facility 1, with a time and a sequence", found)
	}

	follow, err := c.Dmesg(ctx, &machine.DmesgRequest{Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	// Once the first record has come, the node reads /dev/kmsg: a record
	// written now is new to it.
	if _, err := follow.Recv(); err != nil {
		t.Fatalf("Dmesg(follow) = %v, want the records kept first", err)
	}
	writeKmsg(t, marker+" after")
	for {
		r, err := follow.Recv()
		if err != nil {
			t.Fatalf("Dmesg(follow) = %v, want the record written after it started", err)
		}
		if r.Message == marker+" after" {
			if r.Sequence <= found.Sequence {
				t.Errorf("followed record's sequence = %d, want past %d", r.Sequence, found.Sequence)
			}
			break
		}
	}
}

func TestParseKmsg(t *testing.T) {
	for _, tt := range []struct {
		raw  string
		want string
	}{
		{"6,339,5140900,-;NET: Registered protocol family 10\n", "level 6 facility 0 seq 339 at 5.1409s: NET: Registered protocol family 10"},
		{"30,340,5690716,-;udevd[80]: starting version 181\n SUBSYSTEM=acpi\n DEVICE=+acpi:PNP0A03:00\n", "level 6 facility 3 seq 340 at 5.690716s: udevd[80]: starting version 181"},
		{"12,7,0,c;a\\x0ab\n", "level 4 facility 1 seq 7 at 0s: a\\x0ab"},
	} {
		r, err := parseKmsg([]byte(tt.raw))
		if err != nil {
			t.Errorf("parseKmsg(%q) = %v", tt.raw, err)
			continue
		}
		got := fmt.Sprintf("level %d facility %d seq %d at %s: %s", r.Level, r.Facility, r.Sequence, r.Time.AsDuration(), r.Message)
		if got != tt.want {
			t.Errorf("parseKmsg(%q) = %s, want %s", tt.raw, got, tt.want)
		}
	}
	for _, raw := range []string{"no header\n", "6,x,1,-;m\n", "6,1;m\n"} {
		if _, err := parseKmsg([]byte(raw)); err == nil {
			t.Errorf("parseKmsg(%q) = nil error, want one", raw)
		}
	}
}

// TestMounts finds a tmpfs the test mounts, with its options.
func TestMounts(t *testing.T) {
	need.Root(t, "mounts a tmpfs")
	dir := t.TempDir()
	if err := unix.Mount("cairn-inspect-test", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=1m,mode=0711"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, 0); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	resp, err := reader(t).Mounts(context.Background(), &machine.MountsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var got *machine.Mount
	var root bool
	for _, m := range resp.Mounts {
		if m.Target == dir {
			got = m
		}
		root = root || m.Target == "/"
	}
	if got == nil || got.Source != "cairn-inspect-test" || got.Type != "tmpfs" ||
		!strings.Contains(","+got.Options+",", ",nosuid,nodev,") || !strings.Contains(got.SuperOptions, "size=1024k") || !strings.Contains(got.SuperOptions, "mode=711") {
		t.Errorf("Mounts() has %v at %s, want the tmpfs cairn-inspect-test with nosuid,nodev and size=1024k,mode=711", got, dir)
	}
	if !root {
		t.Errorf("Mounts() = %d mounts without /", len(resp.Mounts))
	}
}

// TestProcesses finds a child the test starts, the test itself and a
// kernel thread.
func TestProcesses(t *testing.T) {
	sleep := exec.Command(need.Tool(t, "sleep", "coreutils"), "3600")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sleep.Process.Kill()
		sleep.Wait()
	})
	own := ownCgroup(t)
	c := reader(t)
	byPid := map[int32]*machine.Process{}
	// The child is in /proc at once, but may not have exec'd sleep yet.
	poll.Until(t, 10*time.Second, "the child sleeping in Processes()", func() error {
		resp, err := c.Processes(context.Background(), &machine.ProcessesRequest{})
		if err != nil {
			return err
		}
		clear(byPid)
		for _, p := range resp.Processes {
			byPid[p.Pid] = p
		}
		if p := byPid[int32(sleep.Process.Pid)]; p.GetState() != "S" {
			return fmt.Errorf("the child is %v", p)
		}
		return nil
	})
	child := byPid[int32(sleep.Process.Pid)]
	if !strings.HasSuffix(child.Command, "sleep 3600") || child.Parent != int32(os.Getpid()) || child.Cgroup != own || child.Rss == 0 {
		t.Errorf("Processes() has the child as %v, want sleep 3600, parent %d, cgroup %s, some RSS", child, os.Getpid(), own)
	}
	self := byPid[int32(os.Getpid())]
	if self.GetCpuTime().AsDuration() <= 0 || self.GetRss() == 0 || !strings.Contains(self.GetCommand(), os.Args[0]) {
		t.Errorf("Processes() has the test as %v, want its command, CPU time and RSS", self)
	}
	if comm, err := os.ReadFile("/proc/2/comm"); err == nil && strings.TrimSpace(string(comm)) == "kthreadd" {
		if p := byPid[2]; p.GetCommand() != "[kthreadd]" || p.GetParent() != 0 {
			t.Errorf("Processes() has pid 2 as %v, want the kernel thread [kthreadd], parent 0", p)
		}
	}
}

func ownCgroup(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if cg, ok := strings.CutPrefix(line, "0::"); ok {
			return cg
		}
	}
	t.Fatal("no cgroup v2 line in /proc/self/cgroup")
	return ""
}

// TestNetwork reads loopback's link, address and local route, and a table
// the test programs, rendered as nft would.
func TestNetwork(t *testing.T) {
	need.Root(t, "programs an nftables table")
	name := "cairn_inspect_test_" + strconv.Itoa(os.Getpid())
	programTestTable(t, name)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()

	resp, err := reader(t).Network(context.Background(), &machine.NetworkRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var lo *machine.Link
	for _, l := range resp.Links {
		if l.Name == "lo" {
			lo = l
		}
	}
	if lo == nil || lo.Mtu != 65536 || lo.State != "unknown" || !slices.Contains(lo.Addresses, "127.0.0.1/8") {
		t.Errorf("Network() has lo as %v, want MTU 65536, state unknown, 127.0.0.1/8", lo)
	}
	var local bool
	for _, r := range resp.Routes {
		local = local || (r.Destination == "127.0.0.1/32" && r.Table == unix.RT_TABLE_LOCAL && r.Type == "local" && r.Device == "lo")
	}
	if !local {
		t.Errorf("Network() routes = %v, want the local route of 127.0.0.1 on lo", resp.Routes)
	}
	for _, r := range resp.Routes {
		if strings.HasSuffix(r.Destination, "/0") {
			t.Errorf("Network() has route %v, want a default route written as default", r)
		}
	}
	// The test's listener, as ss -tlp shows it.
	if !slices.ContainsFunc(resp.Sockets, func(s *machine.Socket) bool {
		return s.Protocol == "tcp" && s.State == "LISTEN" && s.Local == l.Addr().String() && s.Pid == int32(os.Getpid()) && s.Command != ""
	}) {
		t.Errorf("Network() sockets = %v, want the listener on %s of pid %d", resp.Sockets, l.Addr(), os.Getpid())
	}
	// nft's own words for what programTestTable wrote.
	for _, want := range []string{
		"table inet " + name + " {",
		"elements = { 203.0.113.7 . tcp . 443 : jump svc }",
		"type filter hook input priority filter; policy accept;",
		"ip daddr . meta l4proto . th dport vmap @services",
		"dnat ip to 10.244.1.5:8080",
	} {
		if !strings.Contains(resp.Nftables, want) {
			t.Errorf("Network() nftables =\n%s\nwant it to hold %q", resp.Nftables, want)
		}
	}
}

// programTestTable adds a table whose base chain only jumps for
// addresses in an empty set or of TEST-NET-3, and accepts: the host's
// traffic is not changed. Its chain unused is jumped to by none.
func programTestTable(t *testing.T, name string) {
	t.Helper()
	need.Tool(t, "nft", "nftables")
	script := "table inet " + name + ` {
	set addrs { type ipv4_addr; }
	map services { type ipv4_addr . inet_proto . inet_service : verdict; elements = { 203.0.113.7 . tcp . 443 : jump svc }; }
	chain svc { tcp dport 443 ip daddr 203.0.113.7 counter accept; }
	chain input {
		type filter hook input priority filter; policy accept;
		ip daddr @addrs jump svc
		ip daddr . meta l4proto . th dport vmap @services
	}
	chain unused { meta l4proto tcp dnat ip to 10.244.1.5:8080; }
}
`
	cmd := exec.Command("nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft -f: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("nft", "delete", "table", "inet", name).CombinedOutput(); err != nil {
			t.Errorf("delete table %s: %v\n%s", name, err, out)
		}
	})
}

// readFile reads path through the API, with the given limit.
func readFile(c *client.Client, path string, limit int64) (string, bool, error) {
	stream, err := c.Read(context.Background(), &machine.ReadRequest{Path: path, Limit: limit})
	if err != nil {
		return "", false, err
	}
	chunks, err := recvAll(stream)
	var data strings.Builder
	truncated := false
	for _, ch := range chunks {
		data.Write(ch.Data)
		truncated = truncated || ch.Truncated
	}
	return data.String(), truncated, err
}

// TestRead reads files under the allowed trees, and is refused every
// secret of the deny list that this host has, a path outside the trees,
// and each through a link from /var/log.
func TestRead(t *testing.T) {
	need.Root(t, "makes a directory in /var/log")
	dir, err := os.MkdirTemp("/var/log", "cairn-inspect-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	outside := filepath.Join(t.TempDir(), "outside.log")
	content := strings.Repeat("0123456789", 10000) // more than a chunk
	for _, f := range []struct{ name, data string }{{"app.log", content}, {"client.key", "k"}, {"server-key.pem", "k"}} {
		if err := os.WriteFile(filepath.Join(dir, f.name), []byte(f.data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(outside, []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "key"), []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(dir, "key"), filepath.Join(dir, "twin.log")); err != nil {
		t.Fatal(err)
	}
	for link, target := range map[string]string{"escape": outside, "shadow": "/etc/shadow", "up": "../../tmp", "ok": "app.log"} {
		if err := os.Symlink(target, filepath.Join(dir, link)); err != nil {
			t.Fatal(err)
		}
	}
	c := reader(t)

	t.Run("Allowed", func(t *testing.T) {
		for _, tt := range []struct {
			path          string
			limit         int64
			want          string
			wantTruncated bool
		}{
			{path: filepath.Join(dir, "app.log"), want: content},
			{path: filepath.Join(dir, "ok"), want: content},
			{path: filepath.Join(dir, "app.log"), limit: 15, want: content[:15], wantTruncated: true},
			{path: filepath.Join(dir, "app.log"), limit: int64(len(content)), want: content},
		} {
			got, truncated, err := readFile(c, tt.path, tt.limit)
			if err != nil || got != tt.want || truncated != tt.wantTruncated {
				t.Errorf("Read(%s, limit %d) = %d bytes, truncated %t, %v; want %d bytes, truncated %t", tt.path, tt.limit, len(got), truncated, err, len(tt.want), tt.wantTruncated)
			}
		}
		// Files of /proc and /sys have no size, but content.
		for _, p := range []string{"/proc/self/status", "/proc/sys/kernel/ostype", "/etc/passwd"} {
			want, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			if got, _, err := readFile(c, p, 0); err != nil || (p != "/proc/self/status" && got != string(want)) || got == "" {
				t.Errorf("Read(%s) = %q, %v; want %q", p, got, err, want)
			}
		}
	})

	t.Run("Refused", func(t *testing.T) {
		tid := strconv.Itoa(unix.Gettid())
		for _, tt := range []struct {
			path     string
			wantCode codes.Code
			wantErr  string
		}{
			{"/etc/shadow", codes.PermissionDenied, "/etc/shadow is never served: password hashes"},
			{"/etc/gshadow", codes.PermissionDenied, "password hashes"},
			{"/proc/self/environ", codes.PermissionDenied, "environment"},
			{"/proc/self/task/" + tid + "/environ", codes.PermissionDenied, "environment"},
			{"/proc/self/mem", codes.PermissionDenied, "memory"},
			{"/proc/kmsg", codes.PermissionDenied, "(use dmesg)"},
			{filepath.Join(dir, "client.key"), codes.PermissionDenied, "a private key"},
			{filepath.Join(dir, "server-key.pem"), codes.PermissionDenied, "a private key"},
			{filepath.Join(dir, "shadow"), codes.PermissionDenied, "(through a link, to /etc/shadow) is never served: password hashes"},
			{filepath.Join(dir, "escape"), codes.PermissionDenied, "(through a link, to " + outside + ") is not under /var/log, /proc, /sys or /etc"},
			{filepath.Join(dir, "up", "x"), codes.NotFound, "does not exist"},
			{"/var/log/../../" + outside, codes.PermissionDenied, "is not under /var/log, /proc, /sys or /etc"},
			{"/usr/bin/env", codes.PermissionDenied, "/usr/bin/env is not under /var/log, /proc, /sys or /etc"},
			{"var/log/x", codes.InvalidArgument, "not an absolute path"},
			{dir, codes.InvalidArgument, "is not a regular file"},
			{filepath.Join(dir, "twin.log"), codes.PermissionDenied, "twin.log has 2 hard links: under /var/log, only a file of one name is served"},
			{filepath.Join(dir, "none"), codes.NotFound, "does not exist"},
		} {
			got, _, err := readFile(c, tt.path, 0)
			if status.Code(err) != tt.wantCode || !strings.Contains(status.Convert(err).Message(), tt.wantErr) || got != "" {
				t.Errorf("Read(%s) = %q, %v; want code %v, error with %q", tt.path, got, err, tt.wantCode, tt.wantErr)
			}
		}
		// Through /proc/PID/root, a link to the process's root: resolved,
		// the real path is refused.
		if _, _, err := readFile(c, "/proc/self/root/etc/shadow", 0); status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "password hashes") {
			t.Errorf("Read(/proc/self/root/etc/shadow) = %v, want it refused as password hashes", err)
		}
	})
}

// TestDenied proves each deny list entry refuses what it names, and only
// that, on paths this host may not have (the API refuses those as
// missing before it checks).
func TestDenied(t *testing.T) {
	examples := map[string][]string{
		"/system/state":              {"/system/state", "/system/state/config.yaml"},
		"/var/lib/cairn/kubelet/pki": {"/var/lib/cairn/kubelet/pki/kubelet-server.pem"},
		"/etc/shadow":                {"/etc/shadow"},
		"/etc/shadow-":               {"/etc/shadow-"},
		"/etc/gshadow":               {"/etc/gshadow"},
		"/etc/gshadow-":              {"/etc/gshadow-"},
		"/etc/ssh":                   {"/etc/ssh/ssh_host_ed25519_key"},
		"*.key":                      {"/etc/containerd/certs.d/registry.example.com/client.key"},
		"*-key.pem":                  {"/var/log/admin-key.pem"},
		"/proc/*/environ":            {"/proc/1/environ"},
		"/proc/*/task/*/environ":     {"/proc/1/task/1/environ"},
		"/proc/*/mem":                {"/proc/1/mem"},
		"/proc/*/task/*/mem":         {"/proc/1/task/1/mem"},
		"/proc/kcore":                {"/proc/kcore"},
		"/proc/kmsg":                 {"/proc/kmsg"},
		"/sys/firmware/efi/efivars":  {"/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"},
		"/sys/kernel/debug":          {"/sys/kernel/debug/tracing/trace"},
	}
	for _, d := range readDenied {
		paths, ok := examples[d.pattern]
		if !ok {
			t.Errorf("deny list entry %s has no example here", d.pattern)
		}
		for _, p := range paths {
			if reason, ok := denied(p); !ok || reason != d.reason {
				t.Errorf("denied(%s) = %q, %t; want %q", p, reason, ok, d.reason)
			}
		}
	}
	for _, p := range []string{"/etc/hostname", "/etc/shadowsocks.conf", "/proc/1/status", "/proc/1/cmdline", "/proc/meminfo", "/var/log/containerd.log", "/sys/kernel/mm", "/system/statefile", "/etc/keys.txt"} {
		if reason, ok := denied(p); ok {
			t.Errorf("denied(%s) = %q, want it allowed", p, reason)
		}
	}
}
