package kube

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cairn-os/cairn/internal/controlplane"
)

// The tests of one package can share one cluster, since starting one takes
// seconds: TestMain runs them with Main, and each test that needs the
// cluster calls Shared, which starts it on first use. Main stops it after
// the last test, whatever the tests' outcome. Tests keep apart by working
// in a namespace of their own (Namespace), and leave the cluster running.
//
//	func TestMain(m *testing.M) { os.Exit(kube.Main(m, kube.Options{})) }
//
//	func TestX(t *testing.T) {
//		c := kube.Shared(t)
//		ns := c.Namespace()
//		c.Client.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{})
//	}
var shared struct {
	mu   sync.Mutex
	opts *Options // set by Main
	c    *Cluster // nil until started, and again once stopped
	err  error    // why the start failed (it is not tried again) or why Shared cannot start it
}

// Main runs the tests (m.Run) with opts for the shared cluster, stops the
// cluster if a test started it, removes its directory, and returns the exit
// code for os.Exit: non-zero if a test failed or the cluster did not stop.
// When a test failed, the last lines of the control plane's logs go to
// standard error first.
func Main(m *testing.M, opts Options) int {
	shared.mu.Lock()
	if shared.opts != nil {
		shared.mu.Unlock()
		panic("kube.Main called twice")
	}
	shared.opts = &opts
	shared.mu.Unlock()

	code := m.Run()
	if err := stopShared(code != 0); err != nil {
		fmt.Fprintf(os.Stderr, "kube: stopping the shared cluster: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// Shared returns the cluster shared by the tests of this test binary,
// starting it with the Options given to Main if no test has yet. Like
// Start, it skips tb without the binaries (fails it if CAIRN_NO_SKIP
// is set). It fails tb if the tests do not run under Main, if the cluster
// did not start (once failed, it is not tried again), or if one of its
// processes has exited.
//
// The Cluster it returns is tb's view: its methods report to tb. Stop is
// refused; a test that stops the API server must start it again.
func Shared(tb testing.TB) *Cluster {
	tb.Helper()
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.opts == nil {
		tb.Fatal("kube: Shared needs the tests to run under kube.Main: func TestMain(m *testing.M) { os.Exit(kube.Main(m, opts)) }")
	}
	bin := binaries(tb, *shared.opts)
	if shared.err != nil {
		tb.Fatalf("kube: shared cluster: %v", shared.err)
	}
	if shared.c == nil {
		start := time.Now()
		c, err := startShared(bin, *shared.opts)
		if err != nil {
			shared.err = err
			tb.Fatalf("kube: shared cluster: %v", err)
		}
		shared.c = c
		tb.Logf("kube: shared control plane at %s usable %v after start", c.URL, time.Since(start).Round(time.Millisecond))
	}
	for _, p := range shared.c.Processes() {
		if p.Exited != nil {
			tb.Fatalf("kube: shared cluster: %v; %s", p.Exited, shared.c.Tails(20))
		}
	}
	v := *shared.c
	v.tb, v.shared = tb, true
	return &v
}

// sharedDirPrefix starts the name of the shared cluster's directory,
// followed by the test binary's pid.
const sharedDirPrefix = "cairn-kube-shared-"

// startShared starts a cluster in a new temporary directory; on an error
// nothing is left running and the directory is gone.
func startShared(bin string, opts Options) (*Cluster, error) {
	removeStaleSharedDirs()
	dir, err := os.MkdirTemp("", sharedDirPrefix+strconv.Itoa(os.Getpid())+"-")
	if err != nil {
		return nil, err
	}
	cp, err := controlplane.Run(bin, dir, opts)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return &Cluster{ControlPlane: cp}, nil
}

// stopShared stops the shared cluster, if it runs, and removes its
// directory; after it, Shared fails.
func stopShared(showLogs bool) error {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	c := shared.c
	shared.c, shared.err = nil, errors.New("stopped: kube.Main has returned")
	if c == nil {
		return nil
	}
	if showLogs {
		fmt.Fprint(os.Stderr, c.Tails(40))
	}
	return errors.Join(c.ControlPlane.Stop(), os.RemoveAll(c.Dir))
}

// removeStaleSharedDirs removes the directories of shared clusters whose
// test binary is gone without Main removing them: it panicked, or timed
// out. (Its processes died with it: see sysProcAttr.)
func removeStaleSharedDirs() {
	if runtime.GOOS != "linux" { // alive knows no process elsewhere
		return
	}
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), sharedDirPrefix+"*-*"))
	for _, d := range dirs {
		pid, _, _ := strings.Cut(strings.TrimPrefix(filepath.Base(d), sharedDirPrefix), "-")
		if n, err := strconv.Atoi(pid); err == nil && n != os.Getpid() && !controlplane.Alive(n) {
			os.RemoveAll(d)
		}
	}
}

// sharedPIDs returns the process ids of the shared cluster's processes, if
// it runs.
func sharedPIDs() map[int]bool {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	pids := map[int]bool{}
	if shared.c != nil {
		for _, p := range shared.c.Processes() {
			pids[p.PID] = true
		}
	}
	return pids
}

var nsSeq atomic.Int64

// Namespace creates a namespace for c's test, named after the test, and
// deletes it when the test ends. The deletion does not wait for the
// namespace controller to remove the namespace's objects: a test whose
// objects must be gone before the next test starts (say, Services that
// hold IPs and ports) deletes them in a Cleanup registered after calling
// Namespace, which runs before the namespace's.
func (c *Cluster) Namespace() string {
	c.tb.Helper()
	name := namespaceName(c.tb.Name())
	ctx := context.Background()
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		c.tb.Fatalf("kube: create namespace %s: %v", name, err)
	}
	tb, client := c.tb, c.Client
	tb.Cleanup(func() {
		err := client.CoreV1().Namespaces().Delete(context.Background(), name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			tb.Errorf("kube: delete namespace %s: %v", name, err)
		}
	})
	return name
}

// namespaceName makes a DNS label of a test's name and a sequence number,
// unique within the test binary: "TestX/a_b" -> "testx-a-b-7".
func namespaceName(test string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(test) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
		} else {
			b.WriteByte('-')
		}
	}
	base := b.String()
	if len(base) > 40 {
		base = base[:40]
	}
	if base = strings.Trim(base, "-"); base == "" {
		base = "test"
	}
	return base + "-" + strconv.FormatInt(nsSeq.Add(1), 10)
}
