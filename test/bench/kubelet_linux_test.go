//go:build bench

package bench

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/cairn-os/cairn/agent/node/host"
	"github.com/cairn-os/cairn/test/agentnode"
	"github.com/cairn-os/cairn/test/kube"
	"github.com/cairn-os/cairn/test/runtime"
)

// kubeletSysctls are the kernel settings the kubelet sets when it starts
// (as it does unless protectKernelDefaults, which fails when they differ).
var kubeletSysctls = []string{
	"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes",
}

// kubeletHostDirs are where the kubelet writes whatever its flags: the
// device plugins' socket and the container log links.
var kubeletHostDirs = []string{"/var/lib/kubelet", "/var/log/containers"}

// startKubelet starts the upstream kubelet bin as Node node, joining c with
// its bootstrap token and running pods on rt, with its state in dir.
//
// It runs in a mount namespace of its own in which kubeletSysctls and
// kubeletHostDirs are copies in dir, so that the host's kernel settings
// stay as they are and nothing is written outside dir; host mounts still
// propagate to it, and what it mounts goes with it. Its cgroups go under
// a cgroup root of its own, removed with whatever is under it when b ends.
func startKubelet(b *testing.B, c *kube.Cluster, rt *runtime.Runtime, bin, dir, node string) *proc {
	b.Helper()
	root := filepath.Join(dir, "root")
	shadow := filepath.Join(dir, "host")
	for _, d := range []string{root, shadow} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			b.Fatal(err)
		}
	}
	suffix := make([]byte, 3)
	rand.Read(suffix)
	cgroupRoot := "/cairn-bench-" + hex.EncodeToString(suffix)
	port := agentnode.FreePort(b)
	// It listens where cairn-agent is reached, the host's address, so that
	// the API server reaches both alike for exec and port-forward; only
	// the cluster CA's certificates (the API server's) authenticate.
	addrs, err := host.Addresses()
	if err != nil || len(addrs) == 0 {
		b.Fatalf("the host's addresses: %v %v", addrs, err)
	}
	caFile := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(caFile, c.CAPEM, 0o600); err != nil {
		b.Fatal(err)
	}
	cfg := map[string]any{
		"apiVersion":               "kubelet.config.k8s.io/v1beta1",
		"kind":                     "KubeletConfiguration",
		"containerRuntimeEndpoint": "unix://" + rt.Socket,
		"cgroupDriver":             "cgroupfs",
		"cgroupRoot":               cgroupRoot,
		"failCgroupV1":             false,
		"failSwapOn":               false,
		"address":                  addrs[0].String(),
		"port":                     port,
		"readOnlyPort":             0,
		"healthzPort":              0,
		"authentication": map[string]any{
			"anonymous": map[string]any{"enabled": false},
			"x509":      map[string]any{"clientCAFile": caFile},
			"webhook":   map[string]any{"enabled": false},
		},
		"authorization":       map[string]any{"mode": "AlwaysAllow"},
		"podLogsDir":          filepath.Join(dir, "pods"),
		"resolvConf":          "/etc/resolv.conf",
		"serializeImagePulls": false,
	}
	cfgJSON, err := json.Marshal(cfg)
	if err != nil {
		b.Fatal(err)
	}
	cfgFile := filepath.Join(dir, "config.json")
	if err := os.WriteFile(cfgFile, cfgJSON, 0o600); err != nil {
		b.Fatal(err)
	}

	// sh binds each SOURCE TARGET pair before the "--", then execs the
	// kubelet in the namespace that unshare made.
	var binds []string
	for _, s := range kubeletSysctls {
		host := "/proc/sys/" + s
		v, err := os.ReadFile(host)
		if err != nil {
			b.Fatal(err)
		}
		copy := filepath.Join(shadow, strings.ReplaceAll(s, "/", "_"))
		if err := os.WriteFile(copy, v, 0o644); err != nil {
			b.Fatal(err)
		}
		binds = append(binds, copy, host)
		b.Cleanup(func() {
			if now, err := os.ReadFile(host); err != nil || string(now) != string(v) {
				b.Errorf("kernel setting %s changed from %q to %q (%v)", host, v, now, err)
			}
		})
	}
	for _, d := range kubeletHostDirs {
		copy := filepath.Join(shadow, strings.ReplaceAll(d, "/", "_"))
		if err := os.Mkdir(copy, 0o755); err != nil {
			b.Fatal(err)
		}
		makeDirOnHost(b, d)
		binds = append(binds, copy, d)
	}
	script := `while [ "$1" != -- ]; do mount --bind "$1" "$2" || exit 1; shift 2; done; shift; exec "$@"`
	args := append([]string{"--mount", "--propagation", "slave", "sh", "-c", script, "sh"}, binds...)
	args = append(args, "--", bin,
		"--config", cfgFile,
		"--bootstrap-kubeconfig", c.BootstrapKubeconfig,
		"--kubeconfig", filepath.Join(dir, "kubeconfig"),
		"--cert-dir", filepath.Join(dir, "pki"),
		"--root-dir", root,
		"--hostname-override", node,
		"--node-ip", addrs[0].String(),
	)
	cgroups := makeCgroups(b, cgroupRoot)
	return startProc(b, "kubelet", filepath.Join(dir, "kubelet.log"), exec.Command("unshare", args...), func() {
		// The kubelet's pods leave their cgroups busy until they are gone.
		if err := removeSandboxes(context.Background(), rt); err != nil {
			b.Errorf("after the kubelet: %v", err)
		}
		for _, d := range cgroups {
			if err := removeCgroups(d); err != nil {
				b.Errorf("remove the kubelet's cgroups: %v", err)
			}
		}
	})
}

// makeDirOnHost makes dir if it does not exist, and removes it when b
// ends if it is empty then.
func makeDirOnHost(b *testing.B, dir string) {
	b.Helper()
	if _, err := os.Stat(dir); err == nil {
		return
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := os.Remove(dir); err != nil {
			b.Errorf("remove %s made for the kubelet: %v", dir, err)
		}
	})
}

// makeCgroups makes the cgroup name in every cgroup hierarchy and returns
// their directories.
func makeCgroups(b *testing.B, name string) []string {
	b.Helper()
	hierarchies, err := cgroupHierarchies()
	if err != nil {
		b.Fatal(err)
	}
	var dirs []string
	for _, h := range hierarchies {
		dir := h.mountPoint + name
		err := os.Mkdir(dir, 0o755)
		if err == nil {
			dirs = append(dirs, dir)
		}
		// A new cpuset cgroup (v1) has no CPUs and no memory nodes.
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			if err != nil || !h.cpuset {
				break
			}
			var v []byte
			if v, err = os.ReadFile(filepath.Join(h.mountPoint, f)); err == nil {
				err = os.WriteFile(filepath.Join(dir, f), v, 0o644)
			}
		}
		if err != nil {
			for _, d := range dirs {
				os.Remove(d)
			}
			b.Fatalf("cgroup %s: %v", dir, err)
		}
	}
	return dirs
}

type hierarchy struct {
	mountPoint string
	cpuset     bool // a cgroup v1 hierarchy with the cpuset controller
}

// cgroupHierarchies lists the mounted cgroup hierarchies, v1 and v2.
func cgroupHierarchies() ([]hierarchy, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []hierarchy
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTIONS
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		pf, qf := strings.Fields(pre), strings.Fields(post)
		if !ok || len(pf) < 5 || len(qf) < 3 || (qf[0] != "cgroup" && qf[0] != "cgroup2") {
			continue
		}
		out = append(out, hierarchy{
			mountPoint: pf[4],
			cpuset:     qf[0] == "cgroup" && slices.Contains(strings.Split(qf[2], ","), "cpuset"),
		})
	}
	return out, sc.Err()
}

// removeCgroups removes the cgroup dir and those under it, deepest first.
func removeCgroups(dir string) error {
	var dirs []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			dirs = append(dirs, path)
		}
		return nil
	})
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	var errs []error
	if err != nil {
		errs = append(errs, err)
	}
	slices.Reverse(dirs)
	for _, d := range dirs {
		if err := syscall.Rmdir(d); err != nil {
			errs = append(errs, fmt.Errorf("rmdir %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}
