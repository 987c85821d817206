package kubelet

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/cairn-os/cairn/agent/node"
	"github.com/cairn-os/cairn/machineconfig"
	"github.com/cairn-os/cairn/test/kube"
	"github.com/cairn-os/cairn/test/mounts"
)

// readyRuntime is a container runtime that is ready, as far as the
// Node's status tells.
type readyRuntime struct{}

func (readyRuntime) RuntimeVersion(context.Context) (string, error) {
	return "containerd://2.4.2-test", nil
}

func (readyRuntime) RuntimeStatus(context.Context) (bool, bool, string, error) {
	return true, true, "", nil
}

// testNode is a node of a test: its membership and its pod loop.
type testNode struct {
	Config // the pod loop's
	// RuntimeStatus is the runtime's status the Node reports; nil, with
	// no RuntimeInfo either, means readyRuntime's.
	RuntimeStatus node.RuntimeStatus
	// join is the membership's config, but for the runtime, the state
	// directory, the log and the metrics, which are the pod loop's.
	join node.Config
}

// agent is a running node of a test.
type agent struct {
	cancel context.CancelFunc
	done   chan struct{}
	k      *Kubelet // startStatic's
}

// stop stops the agent and waits until everything it started returned.
func (a *agent) stop() {
	a.cancel()
	<-a.done
}

// testConfig returns the config of a node called name that joins c with
// the bootstrap token, keeping its state in dir, and renews and reports
// every 200 ms.
func testConfig(t testing.TB, c *kube.Cluster, name, dir string) testNode {
	mounts.UnmountAtEnd(t, dir) // the volumes of the pods left running
	return testNode{
		Config: Config{
			Dir: dir,
			Log: slog.New(slog.NewTextHandler(testWriter{t}, nil)).With("test", t.Name()),
		},
		join: node.Config{
			NodeName: name,
			Cluster: machineconfig.Cluster{
				Server: c.URL, CA: string(c.CAPEM), BootstrapToken: c.BootstrapToken,
				ClusterDomain: machineconfig.DefaultClusterDomain,
			},
			Version:        "test",
			LeaseInterval:  200 * time.Millisecond,
			StatusInterval: 200 * time.Millisecond,
		},
	}
}

// start joins the node of cfg and runs its pods (with a ready runtime
// unless cfg has one) until the test ends or stop.
func start(t *testing.T, cfg testNode) *agent {
	t.Helper()
	return startWith(t, cfg)
}

// startWith is start with more of the node's components.
func startWith(t testing.TB, cfg testNode, more ...node.Component) *agent {
	t.Helper()
	if cfg.RuntimeInfo == nil && cfg.RuntimeStatus == nil {
		cfg.RuntimeInfo, cfg.RuntimeStatus = readyRuntime{}, readyRuntime{}
	}
	join := cfg.join
	join.RuntimeInfo, join.RuntimeStatus = cfg.RuntimeInfo, cfg.RuntimeStatus
	join.Dir, join.Log, join.Metrics = cfg.Dir, cfg.Log, cfg.Metrics
	pods := node.Component{Name: "kubelet", Run: func(ctx context.Context, m *node.Member) error {
		err := Run(ctx, m, cfg.Config)
		if err != nil {
			t.Errorf("Run() = %v", err)
		}
		return err
	}}
	ctx, cancel := context.WithCancel(context.Background())
	a := &agent{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(a.done)
		if err := node.Run(ctx, join, append([]node.Component{pods}, more...)); err != nil {
			t.Errorf("node.Run() = %v", err)
		}
	}()
	t.Cleanup(a.stop)
	return a
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

func TestRunBadConfig(t *testing.T) {
	err := Run(context.Background(), &node.Member{}, Config{})
	if got, want := err.Error(), "kubelet config: no state directory\nno runtime info\nno pod worker"; got != want {
		t.Errorf("Run(Config{}) = %q, want %q", got, want)
	}
}

// TestRunWorkerCannotBeMade wants a pod loop that cannot start to say why
// and be started again by the node's restart policy, not to end quietly
// with the node running no pods.
func TestRunWorkerCannotBeMade(t *testing.T) {
	c := kube.Start(t, kube.Options{})
	cfg := testConfig(t, c, "no-worker-1", t.TempDir())
	cfg.RuntimeInfo = readyRuntime{}
	cfg.Pods = &PodConfig{} // no runtime, no images, no log root
	join := cfg.join
	join.RuntimeInfo, join.RuntimeStatus, join.Dir, join.Log = readyRuntime{}, readyRuntime{}, cfg.Dir, cfg.Log
	errs := make(chan error, 10)
	pods := node.Component{Name: "kubelet", Run: func(ctx context.Context, m *node.Member) error {
		err := Run(ctx, m, cfg.Config)
		errs <- err
		return err
	}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- node.Run(ctx, join, []node.Component{pods}) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("node.Run() = %v", err)
		}
	}()
	for run := 1; run <= 2; run++ {
		select {
		case err := <-errs:
			if err == nil || !strings.HasPrefix(err.Error(), "pod worker: ") {
				t.Fatalf("run %d: Run() = %v, want the error of the pod worker that cannot be made", run, err)
			}
		case <-time.After(time.Minute):
			t.Fatalf("run %d of the pod loop did not end within a minute of the node's start", run)
		}
	}
}
