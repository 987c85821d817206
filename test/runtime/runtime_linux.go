package runtime

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cairn-os/cairn/internal/containerdconfig"
	"github.com/cairn-os/cairn/internal/criimage"
	"github.com/cairn-os/cairn/rootfs"
	"github.com/cairn-os/cairn/test/need"
	"github.com/cairn-os/cairn/test/repo"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/vishvananda/netlink"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cairn-os/cairn/image/oci"
	"github.com/cairn-os/cairn/internal/layout"
)

// Environment variables read by Start.
const (
	EnvBin = "CAIRN_BIN" // directory of the binaries
)

// Paths that containerd and the CNI plugins write whatever their config.
const (
	shimSocketDir  = "/run/containerd/s"
	fifoDir        = "/run/containerd/fifo"
	cniResultsDir  = "/var/lib/cni/results"
	runcRoot       = "/run/containerd/runc" // the shim's default runc --root
	readyTimeout   = 30 * time.Second
	containerdStop = 5 * time.Second
)

// Runtime is a running containerd with its CRI.
type Runtime struct {
	// Socket is containerd's gRPC socket (an absolute path).
	Socket        string
	RuntimeClient criv1.RuntimeServiceClient
	ImageClient   criv1.ImageServiceClient
	// Subnet is the pod range of its bridge network, such as 10.244.17.0/24.
	Subnet *net.IPNet
	// Dir is the temporary directory with root/, state/, cni/, logs and
	// containerd.log.
	Dir string

	tb        testing.TB
	cmd       *exec.Cmd
	exited    chan struct{}
	conn      *grpc.ClientConn
	bridge    string
	network   string
	made      []string // directories outside Dir that did not exist before
	sandboxes []string // IDs of the sandboxes seen in cleanup
	stopped   bool     // by Stop, until StartAgain
}

// Start starts containerd and returns when its CRI reports the runtime and
// the network ready. Everything is stopped and removed in tb.Cleanup.
func Start(tb testing.TB) *Runtime {
	tb.Helper()
	started := time.Now()
	bin := binaries(tb)
	need.Root(tb, "containerd")
	dir := tb.TempDir()
	r := &Runtime{tb: tb, Dir: dir, Socket: filepath.Join(dir, "containerd.sock")}
	for _, d := range []string{"/run/containerd", shimSocketDir, fifoDir, runcRoot, runcRoot + "/" + criimage.CRINamespace} {
		if _, err := os.Stat(d); os.IsNotExist(err) {
			r.made = append(r.made, d)
		}
	}
	if err := r.writeConfig(bin); err != nil {
		tb.Fatalf("runtime: %v", err)
	}
	archive, err := pauseArchive(dir)
	if err != nil {
		tb.Fatalf("runtime: %v", err)
	}
	tb.Cleanup(r.cleanup)
	if err := r.start(bin); err != nil {
		tb.Fatalf("runtime: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	if err := importPinned(ctx, r.Socket, archive, layout.SandboxImage); err != nil {
		tb.Fatalf("runtime: %v", err)
	}
	if err := r.waitReady(ctx); err != nil {
		tb.Fatalf("runtime: %v (log: %s)", err, r.logTail())
	}
	tb.Logf("runtime: containerd at %s ready %v after Start (pods in %s)", r.Socket, time.Since(started).Round(time.Millisecond), r.Subnet)
	return r
}

// binaries returns the directory of containerd, the shim and runc; the CNI
// plugins are in its cni/ subdirectory.
func binaries(tb testing.TB) string {
	tb.Helper()
	dir := os.Getenv(EnvBin)
	if dir == "" {
		root, err := repo.Root()
		if err != nil {
			tb.Fatalf("runtime: %v; set %s", err, EnvBin)
		}
		dir = filepath.Join(root, "_out", "bin")
	}
	need.Built(tb, filepath.Join(dir, "containerd"), "build", EnvBin) // the node binary
	for _, c := range rootfs.Components {
		need.Built(tb, filepath.Join(dir, c.Name), c.Make, EnvBin)
	}
	return dir
}

// writeConfig writes containerd's config, the registry hosts directory and
// the CNI network of a bridge and pod range of its own.
func (r *Runtime) writeConfig(bin string) error {
	suffix := make([]byte, 3)
	rand.Read(suffix)
	r.bridge = "cairnt" + hex.EncodeToString(suffix) // 12 of at most 15 characters
	r.network = "cairn-test-" + hex.EncodeToString(suffix)
	r.Subnet = freeSubnet(int(suffix[0]))

	cniConf := filepath.Join(r.Dir, "cni", "net.d")
	for _, d := range []string{cniConf, filepath.Join(r.Dir, "certs.d"), filepath.Join(r.Dir, "cni", "networks")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	conflist := map[string]any{
		"cniVersion": "1.0.0",
		"name":       r.network,
		"plugins": []any{map[string]any{
			"type":      "bridge",
			"bridge":    r.bridge,
			"isGateway": true,
			"ipMasq":    false,
			"ipam": map[string]any{
				"type":    "host-local",
				"ranges":  [][]map[string]string{{{"subnet": r.Subnet.String()}}},
				"routes":  []map[string]string{{"dst": "0.0.0.0/0"}},
				"dataDir": filepath.Join(r.Dir, "cni", "networks"),
			},
		}},
	}
	b, err := json.MarshalIndent(conflist, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(cniConf, "10-"+r.network+".conflist"), b, 0o644); err != nil {
		return err
	}
	// The node's config, with this runtime's paths; root here lacks
	// CAP_SYS_RESOURCE, hence restrict_oom_score_adj.
	cfg := containerdconfig.Config(containerdconfig.Paths{
		Root:       filepath.Join(r.Dir, "root"),
		State:      filepath.Join(r.Dir, "state"),
		Socket:     r.Socket,
		HostsDir:   filepath.Join(r.Dir, "certs.d"),
		CNIBinDir:  filepath.Join(bin, "cni"),
		CNIConfDir: cniConf,
	}, true)
	return os.WriteFile(filepath.Join(r.Dir, "config.toml"), []byte(cfg), 0o644)
}

// freeSubnet returns a /24 of 10.244.0.0/16, from the n-th on, that no
// route of the host covers yet, so that runtimes of tests running at the
// same time get different ranges.
func freeSubnet(n int) *net.IPNet {
	routes, _ := netlink.RouteList(nil, netlink.FAMILY_V4)
	for i := range 254 {
		_, subnet, _ := net.ParseCIDR(fmt.Sprintf("10.244.%d.0/24", 1+(n+i)%254))
		taken := false
		for _, rt := range routes {
			if rt.Dst != nil && rt.Dst.Contains(subnet.IP) && rt.Dst.String() != "0.0.0.0/0" {
				taken = true
			}
		}
		if !taken {
			return subnet
		}
	}
	_, subnet, _ := net.ParseCIDR(fmt.Sprintf("10.244.%d.0/24", 1+n%254))
	return subnet
}

// AllowHTTP lets the CRI pull from the plain-HTTP registry at host:port
// (such as test/registry's 127.0.0.1:PORT). containerd reads the hosts
// directory on each pull, so it can be called after Start.
func (r *Runtime) AllowHTTP(hostPort string) error {
	d := filepath.Join(r.Dir, "certs.d", hostPort)
	if err := os.MkdirAll(d, 0o755); err != nil {
		return err
	}
	hosts := fmt.Sprintf("server = %q\n", "http://"+hostPort)
	return os.WriteFile(filepath.Join(d, "hosts.toml"), []byte(hosts), 0o644)
}

func (r *Runtime) start(bin string) error {
	logf, err := os.OpenFile(filepath.Join(r.Dir, "containerd.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(filepath.Join(bin, "containerd"), "--config", filepath.Join(r.Dir, "config.toml"))
	cmd.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"))
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start containerd: %w", err)
	}
	r.cmd = cmd
	r.exited = make(chan struct{})
	go func() { cmd.Wait(); close(r.exited) }()
	conn, err := grpc.NewClient("unix://"+r.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("CRI client for %s: %w", r.Socket, err)
	}
	r.conn = conn
	r.RuntimeClient = criv1.NewRuntimeServiceClient(conn)
	r.ImageClient = criv1.NewImageServiceClient(conn)
	return nil
}

// Restart kills containerd, as a crash would, and starts it again; it
// returns once the CRI is ready. The shims, and so the containers, live on.
func (r *Runtime) Restart() {
	r.tb.Helper()
	r.Stop()
	r.StartAgain()
}

// Stop kills containerd, as a crash would, and returns once it has
// exited: its CRI is away until StartAgain. The shims, and so the
// containers, live on. (Cleanup starts it again, if it is stopped, to
// remove the sandboxes.)
func (r *Runtime) Stop() {
	r.tb.Helper()
	if r.stopped {
		r.tb.Fatal("runtime: Stop: containerd is already stopped")
	}
	r.cmd.Process.Kill()
	<-r.exited
	r.conn.Close()
	r.stopped = true
}

// StartAgain starts containerd again after Stop, with the same socket,
// state and network, and returns once the CRI is ready.
func (r *Runtime) StartAgain() {
	r.tb.Helper()
	if err := r.startAgain(); err != nil {
		r.tb.Fatalf("runtime: start again: %v", err)
	}
}

func (r *Runtime) startAgain() error {
	if !r.stopped {
		return errors.New("containerd is not stopped")
	}
	if err := r.start(binaries(r.tb)); err != nil {
		return err
	}
	r.stopped = false
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	if err := r.waitReady(ctx); err != nil {
		return fmt.Errorf("%w (log: %s)", err, r.logTail())
	}
	return nil
}

// waitReady waits for the socket, then for the CRI to report RuntimeReady
// and NetworkReady.
func (r *Runtime) waitReady(ctx context.Context) error {
	var last string
	for {
		select {
		case <-r.exited:
			return fmt.Errorf("containerd exited during start")
		default:
		}
		st, err := r.RuntimeClient.Status(ctx, &criv1.StatusRequest{})
		if err == nil {
			ready := 0
			for _, c := range st.GetStatus().GetConditions() {
				if c.Status && (c.Type == criv1.RuntimeReady || c.Type == criv1.NetworkReady) {
					ready++
				}
			}
			if ready == 2 {
				return nil
			}
			last = fmt.Sprint(st.GetStatus().GetConditions())
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("CRI not ready: %s", last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// importPinned waits for containerd's socket, then imports, unpacks and
// pins the sandbox image as init does on a node.
func importPinned(ctx context.Context, socket, archive, ref string) error {
	for { // the socket appears a moment after containerd starts
		c, err := containerd.New(socket)
		if err == nil {
			_, err = c.Version(ctx)
			c.Close()
		}
		if err == nil {
			return criimage.ImportPinned(ctx, socket, archive, ref)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("connect to containerd at %s: %w", socket, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// pauseArchive builds rootfs/pause and writes it as the sandbox image
// archive into dir.
func pauseArchive(dir string) (string, error) {
	root, err := repo.Root()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "pause")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", bin, "./rootfs/pause")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./rootfs/pause: %w\n%s", err, out)
	}
	b, err := os.ReadFile(bin)
	if err != nil {
		return "", err
	}
	img, err := oci.BinaryImage(b, "/pause", time.Unix(0, 0).UTC())
	if err != nil {
		return "", fmt.Errorf("sandbox image: %w", err)
	}
	archive := filepath.Join(dir, "pause.tar")
	return archive, oci.WriteArchive(img, layout.SandboxImage, archive)
}

// cleanup undoes Start, reporting what it could not undo.
func (r *Runtime) cleanup() {
	if r.stopped {
		if err := r.startAgain(); err != nil {
			r.tb.Errorf("runtime: start containerd again to remove the sandboxes: %v", err)
		}
	}
	if r.conn != nil {
		r.removeSandboxes()
		r.conn.Close()
	}
	if r.cmd != nil {
		r.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-r.exited:
		case <-time.After(containerdStop):
			r.cmd.Process.Kill()
			<-r.exited
		}
	}
	r.killShims()
	for _, m := range mountsUnder(r.Dir) {
		if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil {
			r.tb.Errorf("runtime: unmount %s: %v", m, err)
		}
	}
	if l, err := netlink.LinkByName(r.bridge); err == nil {
		if err := netlink.LinkDel(l); err != nil {
			r.tb.Errorf("runtime: delete bridge %s: %v", r.bridge, err)
		}
	}
	if ents, err := os.ReadDir(cniResultsDir); err == nil {
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), r.network+"-") || r.ownsResult(e.Name()) {
				os.Remove(filepath.Join(cniResultsDir, e.Name()))
			}
		}
	}
	// Deepest first; os.Remove leaves a directory that is not empty.
	for i := len(r.made) - 1; i >= 0; i-- {
		os.Remove(r.made[i])
	}
}

// ownsResult reports whether a CNI result cache file (network-ID-ifname)
// is of one of this runtime's sandboxes, such as the loopback's that
// containerd names cni-loopback.
func (r *Runtime) ownsResult(name string) bool {
	for _, id := range r.sandboxes {
		if strings.Contains(name, "-"+id+"-") {
			return true
		}
	}
	return false
}

// removeSandboxes stops and removes every pod sandbox, and with them their
// containers and network.
func (r *Runtime) removeSandboxes() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := r.RuntimeClient.ListPodSandbox(ctx, &criv1.ListPodSandboxRequest{})
	if err != nil {
		r.tb.Logf("runtime: list pod sandboxes: %v", err)
		return
	}
	for _, sb := range resp.Items {
		r.sandboxes = append(r.sandboxes, sb.Id)
		if _, err := r.RuntimeClient.StopPodSandbox(ctx, &criv1.StopPodSandboxRequest{PodSandboxId: sb.Id}); err != nil {
			r.tb.Errorf("runtime: stop pod sandbox %s: %v", sb.Id, err)
		}
		if _, err := r.RuntimeClient.RemovePodSandbox(ctx, &criv1.RemovePodSandboxRequest{PodSandboxId: sb.Id}); err != nil {
			r.tb.Errorf("runtime: remove pod sandbox %s: %v", sb.Id, err)
		}
	}
}

// killShims kills the shims that serve this containerd (they name its
// socket in their arguments) and outlive it if a task was left running.
func (r *Runtime) killShims() {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if !strings.HasSuffix(args[0], "containerd-shim-runc-v2") || !bytes.Contains(b, []byte("\x00"+r.Socket+"\x00")) {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		r.tb.Logf("runtime: killing leftover shim %d", pid)
		syscall.Kill(pid, syscall.SIGKILL)
	}
}

// mountsUnder lists the mount points under dir, deepest first.
func mountsUnder(dir string) []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		mp := unescape(f[4])
		if strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}

// unescape undoes mountinfo's octal escapes (\040 for a space).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func (r *Runtime) logTail() string {
	b, _ := os.ReadFile(filepath.Join(r.Dir, "containerd.log"))
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}
