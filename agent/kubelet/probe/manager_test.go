package probe

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cairn-os/cairn/test/poll"
)

// stopper records the containers the Manager stops.
type stopper struct {
	mu      sync.Mutex
	stopped []string
}

func (s *stopper) StopUnhealthy(_ context.Context, _ *corev1.Pod, _, containerID string, _ time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopped = append(s.stopped, containerID)
	return nil
}

// waitUpdate waits for the next update, which must be want.
func waitUpdate(t *testing.T, r *Results, want Update) {
	t.Helper()
	select {
	case u := <-r.Updates():
		if u != want {
			t.Fatalf("update %+v, want %+v", u, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("no update %+v within 10 s", want)
	}
}

// TestManager probes an HTTP server: the verdicts land in the Results,
// each change is told on Updates, and a failing liveness probe has the
// container stopped; Probed is told every run.
func TestManager(t *testing.T) {
	var healthy atomic.Bool
	healthy.Store(true)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !healthy.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	host, portStr, _ := net.SplitHostPort(srv.Listener.Addr().String())
	port, _ := strconv.Atoi(portStr)
	get := corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/", Port: intstr.FromInt(port)}}

	results := NewResults()
	st := &stopper{}
	var runsMu sync.Mutex
	runs := map[string]int{} // by kind and result
	probed := func(_ *corev1.Pod, _ string, kind Kind, err error) {
		runsMu.Lock()
		defer runsMu.Unlock()
		runs[fmt.Sprintf("%s ok=%v", kind, err == nil)]++
	}
	m, err := New(Config{Runtime: struct{ criv1.RuntimeServiceClient }{}, Results: results, Stopper: st, Probed: probed})
	if err != nil {
		t.Fatal(err)
	}
	defer m.RemoveAll()
	pod := &corev1.Pod{}
	pod.UID = types.UID("uid-1")
	pod.Spec.Containers = []corev1.Container{{
		Name:           "app",
		ReadinessProbe: &corev1.Probe{ProbeHandler: get, PeriodSeconds: 1, FailureThreshold: 1},
		LivenessProbe:  &corev1.Probe{ProbeHandler: get, PeriodSeconds: 1, FailureThreshold: 1},
	}}
	if results.Ready(pod, "app", "c1") {
		t.Fatal("Ready before any probe ran")
	}
	m.Update(pod, host, []Running{{Name: "app", ContainerID: "c1"}})
	waitUpdate(t, results, Update{UID: "uid-1", Container: "app", Kind: Readiness})
	if !results.Ready(pod, "app", "c1") {
		t.Error("not Ready after the readiness probe succeeded")
	}
	if results.Ready(pod, "app", "c2") {
		t.Error("Ready for another container than the one probed")
	}

	healthy.Store(false)
	// Both probes fail once, in either order: readiness turns false, and
	// liveness stops the container.
	got := map[Kind]bool{}
	for range 2 {
		select {
		case u := <-results.Updates():
			got[u.Kind] = true
		case <-time.After(10 * time.Second):
			t.Fatalf("updates %v, want readiness and liveness", got)
		}
	}
	if !got[Readiness] || !got[Liveness] {
		t.Errorf("updates %v, want readiness and liveness", got)
	}
	if results.Ready(pod, "app", "c1") {
		t.Error("Ready after the readiness probe failed")
	}
	st.mu.Lock()
	if len(st.stopped) != 1 || st.stopped[0] != "c1" {
		t.Errorf("stopped %v, want [c1]", st.stopped)
	}
	st.mu.Unlock()
	runsMu.Lock()
	// Each was told before the update it led to; liveness's first success
	// may come after the server turned unhealthy.
	for _, want := range []string{"readiness ok=true", "readiness ok=false", "liveness ok=false"} {
		if runs[want] < 1 {
			t.Errorf("Probed told of runs %v, want at least one %s", runs, want)
		}
	}
	runsMu.Unlock()

	m.Remove(pod.UID)
	if results.Ready(pod, "app", "c1") || !results.Started(pod, "app", "c1") {
		t.Error("after Remove: want not Ready, Started (no startup probe)")
	}
}

// TestReadyOnceStarted wants the readiness probe, whose period is long,
// to run as soon as the startup probe succeeds: the container is ready
// within a second of being started, not a readiness period later.
func TestReadyOnceStarted(t *testing.T) {
	var started atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/startup" && !started.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	host, portStr, _ := net.SplitHostPort(srv.Listener.Addr().String())
	port, _ := strconv.Atoi(portStr)
	get := func(path string) corev1.ProbeHandler {
		return corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: path, Port: intstr.FromInt(port)}}
	}

	results := NewResults()
	var startupRuns atomic.Int32
	probed := func(_ *corev1.Pod, _ string, kind Kind, _ error) {
		if kind == Startup {
			startupRuns.Add(1)
		}
	}
	m, err := New(Config{Runtime: struct{ criv1.RuntimeServiceClient }{}, Results: results, Stopper: &stopper{}, Probed: probed})
	if err != nil {
		t.Fatal(err)
	}
	defer m.RemoveAll()
	pod := &corev1.Pod{}
	pod.UID = types.UID("uid-1")
	pod.Spec.Containers = []corev1.Container{{
		Name:           "app",
		StartupProbe:   &corev1.Probe{ProbeHandler: get("/startup"), PeriodSeconds: 1, FailureThreshold: 100},
		ReadinessProbe: &corev1.Probe{ProbeHandler: get("/ready"), PeriodSeconds: 600},
	}}
	m.Update(pod, host, []Running{{Name: "app", ContainerID: "c1"}})
	// The readiness probe's first period began with the container, held
	// back by the startup probe: once that failed twice, a second
	// apart, the next readiness run is not due for ten minutes.
	poll.Until(t, 10*time.Second, "two failed startup probes", func() error {
		if n := startupRuns.Load(); n < 2 {
			return fmt.Errorf("%d runs", n)
		}
		return nil
	})
	if results.Started(pod, "app", "c1") || results.Ready(pod, "app", "c1") {
		t.Fatal("started or ready before the startup probe succeeded")
	}
	started.Store(true)
	waitUpdate(t, results, Update{UID: "uid-1", Container: "app", Kind: Startup})
	startedAt := time.Now()
	waitUpdate(t, results, Update{UID: "uid-1", Container: "app", Kind: Readiness})
	if d := time.Since(startedAt); d > 2*time.Second {
		t.Errorf("ready %v after the startup probe succeeded, want at once (the readiness period is 600 s)", d)
	}
	if !results.Ready(pod, "app", "c1") {
		t.Error("not Ready after the readiness probe succeeded")
	}
}
