//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/cairn-os/cairn/api/client"
	"github.com/cairn-os/cairn/api/machine"
	"github.com/cairn-os/cairn/internal/layout"
	"github.com/cairn-os/cairn/test/registry"
)

// upgradeUKIs are the UKIs an upgrade test sends: a good one of a newer
// version, and a broken one of that version whose agent exits at once.
type upgradeUKIs struct {
	version      string
	good, broken string
}

// upgradeAssets are the node binaries at a newer version, built once per
// run: good, and broken (its agent exits at once).
var upgradeAssets struct {
	sync.Mutex
	version, dir string
	ukis         map[string]upgradeUKIs // by machine config
}

// buildUpgradeUKIs builds the node binaries at version running+".1-e2e"
// (once per run) and from them the two UKIs for the machine config (once
// per config: its kernel settings go into the UKI).
func buildUpgradeUKIs(tb testing.TB, config, running string) upgradeUKIs {
	tb.Helper()
	a := &upgradeAssets
	a.Lock()
	defer a.Unlock()
	if a.dir == "" {
		dir, err := buildAssets(running + ".1-e2e")
		if err != nil {
			tb.Fatal(err)
		}
		a.version, a.dir, a.ukis = running+".1-e2e", dir, map[string]upgradeUKIs{}
	}
	if u, ok := a.ukis[config]; ok {
		return u
	}
	out := tb.TempDir()
	u := upgradeUKIs{version: a.version, good: filepath.Join(out, "good.efi"), broken: filepath.Join(out, "broken.efi")}
	for _, b := range []struct{ assets, out string }{{"bin", u.good}, {"broken", u.broken}} {
		if err := run(exec.Command(filepath.Join(a.dir, "bin", "cairn"), "image", "build", "--uki", "-c", config, "-o", b.out, "--assets", filepath.Join(a.dir, b.assets))); err != nil {
			tb.Fatal(err)
		}
	}
	a.ukis[config] = u
	return u
}

// buildAssets builds into a new directory's bin/ the binaries of `make
// build` at version, and beside it broken/, the same with a node binary
// whose agent exits at once.
func buildAssets(version string) (string, error) {
	// Under TestMain's directory, which it removes.
	dir, err := os.MkdirTemp(filepath.Dir(binDir), "upgrade-")
	if err != nil {
		return "", err
	}
	// The components as they are (cp -a keeps their times: make finds
	// them up to date); cairn, init and the agent rebuilt at version.
	good, broken := filepath.Join(dir, "bin"), filepath.Join(dir, "broken")
	if err := run(exec.Command("cp", "-a", binDir, good)); err != nil {
		return "", err
	}
	mk := exec.Command("make", "--no-print-directory", "build", "OUT="+dir, "VERSION="+version)
	mk.Dir = "../.."
	if err := run(mk); err != nil {
		return "", err
	}
	if err := run(exec.Command("cp", "-a", good, broken)); err != nil {
		return "", err
	}
	gb := exec.Command("go", "build", "-o", filepath.Join(broken, "init"),
		"-ldflags", "-X github.com/cairn-os/cairn/internal/version.Version="+version, "./testdata/brokennode")
	gb.Env = append(os.Environ(), "CGO_ENABLED=0")
	return dir, run(gb)
}

// run runs cmd, its output in the error if it fails.
func run(cmd *exec.Cmd) error {
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%v: %v\n%s", cmd.Args, err, out)
	}
	return nil
}

// upgradeTimes are the figures of an upgrade cycle, from the call.
type upgradeTimes struct {
	brokenRolledBack time.Duration // a broken upgrade → the old version's API, rolled back
	upgraded         time.Duration // a good upgrade → the new version's API
	blessed          time.Duration // a good upgrade → the new UKI blessed
	rolledBack       time.Duration // cairn node rollback → the old version's API
}

// upgradeCycle drives a node running a blessed UKI through the CLI: an
// upgrade to a broken UKI, which rolls back by itself after its one try;
// an upgrade to a good one, blessed with the old one kept; and a rollback
// to the old one. The node ends on the UKI it started with.
//
// If kc is the node's cluster (the node named nodeName in it), each
// upgrade drains the node first and the node uncordons its Node once back.
// If reg is a registry the node reaches (containerd.registries), the good
// UKI goes there (cairn image push) and the node pulls it from there.
func upgradeCycle(tb testing.TB, ctx context.Context, c *client.Client, cairnconfig, config string, kc kubernetes.Interface, nodeName string, reg *registry.Registry) upgradeTimes {
	tb.Helper()
	v0, err := c.Version(ctx, &machine.VersionRequest{})
	if err != nil {
		tb.Fatal(err)
	}
	a := v0.CairnVersion
	if b := v0.Boot; !b.GetBlessed() || b.Entry != "cairn-"+a+".efi" {
		tb.Fatalf("Version().Boot = %v before the upgrades, want cairn-%s.efi blessed", b, a)
	}
	u := buildUpgradeUKIs(tb, config, a)
	cli := func(args ...string) (string, error) {
		return cairnCLI(ctx, append([]string{"node", "--cairnconfig", cairnconfig}, args...)...)
	}
	// poll polls Version until cond holds, through reboots.
	poll := func(ctx context.Context, what string, cond func(*machine.VersionResponse) bool) (*machine.VersionResponse, error) {
		for deadline := time.Now().Add(10 * time.Minute); time.Now().Before(deadline) && ctx.Err() == nil; time.Sleep(time.Second) {
			callCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
			v, err := c.Version(callCtx, &machine.VersionRequest{})
			cancel()
			if err == nil && cond(v) {
				return v, nil
			}
		}
		return nil, fmt.Errorf("no %s within 10 minutes", what)
	}
	waitFor := func(what string, cond func(*machine.VersionResponse) bool) *machine.VersionResponse {
		tb.Helper()
		v, err := poll(ctx, what, cond)
		if err != nil {
			tb.Fatal(err)
		}
		return v
	}
	var times upgradeTimes

	// Refused before anything is sent: not a UKI.
	if out, err := cli("upgrade", "--image", config); err == nil || !strings.Contains(out, "not a UKI") {
		tb.Errorf("upgrade --image machine.yaml: %v\n%s", err, out)
	}

	// A broken UKI: one boot, not healthy within 30 s, back to a.
	start := time.Now()
	out, err := cli("upgrade", "--image", u.broken, "--tries", "1", "--health-timeout", "30s", "--wait", "10m")
	times.brokenRolledBack = time.Since(start)
	tb.Logf("cairn node upgrade (broken): %v\n%s", err, out)
	want := fmt.Sprintf("rolled back to %s: its 1 boots did not become healthy: %s did not become healthy", a, u.version)
	if err == nil || !strings.Contains(out, want) {
		tb.Errorf("upgrade to the broken UKI: %v, want a failure with %q", err, want)
	}
	if kc != nil {
		for _, step := range []string{"cordoned", "drained"} {
			if !strings.Contains(out, step) {
				tb.Errorf("upgrade output lacks %q: the node in a cluster did not drain", step)
			}
		}
	}
	v := waitFor("rollback to "+a, func(v *machine.VersionResponse) bool { return v.CairnVersion == a })
	waitUncordoned(tb, ctx, kc, nodeName, "after the rollback from the broken upgrade")
	if b := v.Boot; b.RolledBackFrom != u.version || b.Entry != "cairn-"+a+".efi" || !b.Blessed || b.Other != "cairn-"+u.version+"+0-1.efi" {
		tb.Errorf("Version().Boot after the broken upgrade = %v, want %s blessed, rolled back from %s, which is spent", b, a, u.version)
	}

	// A good UKI: its API, then blessed; a kept beside it. A pod on
	// the node is evicted by the drain before the write.
	if kc != nil {
		runPausePod(tb, ctx, kc, nodeName, "drained")
	}
	start = time.Now()
	polled := make(chan error, 1)
	pollCtx, stopPolling := context.WithCancel(ctx)
	defer stopPolling()
	go func() {
		_, err := poll(pollCtx, u.version+"'s API", func(v *machine.VersionResponse) bool { return v.CairnVersion == u.version })
		times.upgraded = time.Since(start)
		polled <- err
	}()
	source := []string{"--image", u.good}
	if reg != nil {
		repo := "/cairn/node:" + u.version
		if out, err := cairnCLI(ctx, "image", "push", "--uki", u.good, "--insecure", reg.Addr+repo); err != nil {
			tb.Fatalf("cairn image push: %v\n%s", err, out)
		}
		source = []string{"--image-ref", fmt.Sprintf("%s:%d%s", guestHost, reg.Port(), repo)}
	}
	out, err = cli(append([]string{"upgrade", "--wait", "10m"}, source...)...)
	times.blessed = time.Since(start)
	if err != nil {
		stopPolling()
	}
	if perr := <-polled; perr != nil && err == nil {
		tb.Error(perr)
	}
	tb.Logf("cairn node upgrade: %v\n%s", err, out)
	if err != nil {
		tb.Fatalf("upgrade to %s: %v", u.version, err)
	}
	steps := []string{"received", "verified", "written", "rebooting", "healthy", "blessed   cairn-" + u.version + ".efi"}
	if reg != nil {
		steps = append(steps, "pulled "+guestHost)
	}
	if kc != nil {
		steps = append(steps, "cordoned", "drained")
	}
	for _, step := range steps {
		if !strings.Contains(out, step) {
			tb.Errorf("upgrade output lacks %q", step)
		}
	}
	waitUncordoned(tb, ctx, kc, nodeName, "after the upgrade")
	if kc != nil {
		if !strings.Contains(out, "pods left: default/drained") {
			tb.Errorf("upgrade output does not name the pod it drained, default/drained")
		}
		if _, err := kc.CoreV1().Pods("default").Get(ctx, "drained", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			tb.Errorf("the pod default/drained after the upgrade: %v; want it evicted", err)
		}
	}
	v, err = c.Version(ctx, &machine.VersionRequest{})
	if err != nil {
		tb.Fatal(err)
	}
	if b := v.Boot; v.CairnVersion != u.version || !b.Blessed || b.Entry != "cairn-"+u.version+".efi" || b.Other != "cairn-"+a+".efi" || b.RolledBackFrom != "" {
		tb.Errorf("Version after the upgrade = %s, Boot %v; want %s blessed, %s kept", v.CairnVersion, b, u.version, a)
	}

	// Rollback: back to a, and from then on.
	start = time.Now()
	if out, err := cli("rollback"); err != nil || !strings.Contains(out, "rebooting from "+u.version+" into "+a) {
		tb.Fatalf("rollback: %v\n%s", err, out)
	}
	v = waitFor("rollback to "+a, func(v *machine.VersionResponse) bool { return v.CairnVersion == a })
	times.rolledBack = time.Since(start)
	if b := v.Boot; !b.Blessed || b.Entry != "cairn-"+a+".efi" || b.RolledBackFrom != u.version || !strings.Contains(b.RollbackReason, "cairn node rollback") {
		tb.Errorf("Version().Boot after the rollback = %v", b)
	}
	// What happened, as the node tells it since this boot.
	out, err = cli("events")
	if err != nil {
		tb.Fatalf("events: %v\n%s", err, out)
	}
	for _, want := range []string{
		"upgrade  cairn-" + a + ".efi", "booted after a rollback from " + u.version,
		"step     start services", "service  cairn-agent",
	} {
		if !strings.Contains(out, want) {
			tb.Errorf("cairn node events after the rollback lacks %q:\n%s", want, out)
		}
	}
	tb.Logf("broken upgrade → %s's API rolled back %s; upgrade → %s's API %s, blessed %s; rollback → %s's API %s",
		a, times.brokenRolledBack.Round(time.Second), u.version, times.upgraded.Round(time.Second), times.blessed.Round(time.Second), a, times.rolledBack.Round(time.Second))
	return times
}

// waitUncordoned waits until the node uncordoned its Node in kc, if any.
func waitUncordoned(tb testing.TB, ctx context.Context, kc kubernetes.Interface, nodeName, when string) {
	tb.Helper()
	if kc == nil {
		return
	}
	var last error
	for deadline := time.Now().Add(3 * time.Minute); time.Now().Before(deadline); time.Sleep(2 * time.Second) {
		n, err := kc.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		if err == nil && !n.Spec.Unschedulable {
			return
		}
		last = fmt.Errorf("Node %s unschedulable (%v)", nodeName, err)
	}
	tb.Errorf("%s: the Node is still cordoned 3 minutes on: %v", when, last)
}

// runPausePod runs a pod of the node's own sandbox image on the node, and
// waits until it runs.
func runPausePod(tb testing.TB, ctx context.Context, kc kubernetes.Interface, nodeName, name string) {
	tb.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{
			Name: "pause", Image: layout.SandboxImage, ImagePullPolicy: corev1.PullNever,
		}}},
	}
	if _, err := kc.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		tb.Fatal(err)
	}
	var last error
	for deadline := time.Now().Add(3 * time.Minute); time.Now().Before(deadline); time.Sleep(2 * time.Second) {
		p, err := kc.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			last = err
			continue
		}
		if p.Status.Phase == corev1.PodRunning {
			return
		}
		last = fmt.Errorf("pod %s phase %s", name, p.Status.Phase)
	}
	tb.Fatalf("the pod never ran: %v", last)
}
