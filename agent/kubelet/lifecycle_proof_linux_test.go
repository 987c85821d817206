package kubelet

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cairn-os/cairn/internal/crilog"
	"github.com/cairn-os/cairn/test/poll"
)

// TestPodLifecycle proves, on a node of a real control plane running its
// pods on a real containerd, what the pod worker does as the Kubernetes
// API defines it: runtime changes seen through the CRI's events, probes'
// thresholds, delays, timeouts and the startup gate, init containers in
// order, the waiting reason of a container the runtime cannot create,
// preStop hooks within the grace period, status writes that meet a newer
// Pod, and the Node's Ready condition following the runtime.
//
// The node neither relists the runtime nor resyncs its pods on a timer
// here (the relist off, the resync an hour): whatever it does, it does
// because the CRI's events, the API's watch, a probe or a back-off woke
// it, which the pod_worker_wakeups_total metric tells by source.
func TestPodLifecycle(t *testing.T) {
	e, cfg := newPodEnv(t, "lifecycle-1")
	cfg.PodResync = time.Hour
	cfg.plegRelist = -1
	spy := &criSpy{RuntimeServiceClient: cfg.Pods.Runtime}
	cfg.Pods.Runtime = spy
	start(t, cfg)
	e.testNodeReady(t)

	t.Run("a container stopped through the CRI is seen through its event", func(t *testing.T) {
		e.testSeenByEvent(t, "pleg-stopped", func(t *testing.T, id string) { e.crash(t, id) })
	})
	t.Run("a container whose process is killed is seen through its event", func(t *testing.T) {
		e.testSeenByEvent(t, "pleg-killed", e.killProcess)
	})
	t.Run("probes: startup gate, thresholds, delays, timeouts, grpc", func(t *testing.T) { e.testProbes(t, spy) })
	t.Run("init containers run in order, each Completed, before the app", e.testInitContainers)
	t.Run("CreateContainerError when the runtime cannot create the container", e.testCreateContainerError)
	t.Run("preStop hooks within the grace period; FailedPreStopHook", func(t *testing.T) { e.testPreStopGrace(t, spy) })
	t.Run("a status write that meets a newer Pod is retried and lands", func(t *testing.T) { e.testStatusConflict(t, spy) })
	t.Run("Node Ready and NetworkUnavailable follow the runtime's pod network", e.testNodeNetwork)
	t.Run("Node Ready follows containerd stopping and starting", e.testNodeRuntimeDown)
}

// criSpy is the agent's CRI client of the real containerd, which notes
// the StopContainer calls and lets a test act when the agent reads a
// container's status.
type criSpy struct {
	criv1.RuntimeServiceClient
	mu       sync.Mutex
	stops    []stopCall
	execs    map[string]int               // ExecSync calls (exec probes, hooks) by container ID
	onStatus func(*criv1.ContainerStatus) // called, if set, with each status the agent reads
}

func (s *criSpy) ExecSync(ctx context.Context, req *criv1.ExecSyncRequest, opts ...grpc.CallOption) (*criv1.ExecSyncResponse, error) {
	s.mu.Lock()
	if s.execs == nil {
		s.execs = map[string]int{}
	}
	s.execs[req.ContainerId]++
	s.mu.Unlock()
	return s.RuntimeServiceClient.ExecSync(ctx, req, opts...)
}

// execCount is how many ExecSync calls the agent made in the container
// whose status ID is id (runtime://ID).
func (s *criSpy) execCount(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.execs[id[strings.Index(id, "://")+3:]]
}

// stopCall is one StopContainer of the agent.
type stopCall struct {
	id               string
	timeout          int64 // seconds from SIGTERM to SIGKILL
	called, returned time.Time
}

func (s *criSpy) StopContainer(ctx context.Context, req *criv1.StopContainerRequest, opts ...grpc.CallOption) (*criv1.StopContainerResponse, error) {
	called := time.Now()
	resp, err := s.RuntimeServiceClient.StopContainer(ctx, req, opts...)
	s.mu.Lock()
	s.stops = append(s.stops, stopCall{id: req.ContainerId, timeout: req.Timeout, called: called, returned: time.Now()})
	s.mu.Unlock()
	return resp, err
}

func (s *criSpy) ContainerStatus(ctx context.Context, req *criv1.ContainerStatusRequest, opts ...grpc.CallOption) (*criv1.ContainerStatusResponse, error) {
	resp, err := s.RuntimeServiceClient.ContainerStatus(ctx, req, opts...)
	s.mu.Lock()
	f := s.onStatus
	s.mu.Unlock()
	if f != nil && err == nil && resp.Status != nil {
		f(resp.Status)
	}
	return resp, err
}

// stopsOf returns the agent's StopContainer calls for the container id.
func (s *criSpy) stopsOf(id string) []stopCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []stopCall
	for _, c := range s.stops {
		if c.id == id {
			out = append(out, c)
		}
	}
	return out
}

func (s *criSpy) setOnStatus(f func(*criv1.ContainerStatus)) {
	s.mu.Lock()
	s.onStatus = f
	s.mu.Unlock()
}

// wakeups reads the node's pod_worker_wakeups_total by source.
func (e *podEnv) wakeups(t *testing.T) map[string]float64 {
	t.Helper()
	return e.counts(t, "cairn_kubelet_pod_worker_wakeups_total", "source")
}

// counts reads the node's counter called name, summed by the values of
// its label.
func (e *podEnv) counts(t *testing.T, name, label string) map[string]float64 {
	t.Helper()
	families, err := e.metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.Metric {
			for _, l := range m.Label {
				if l.GetName() == label {
					out[l.GetValue()] += m.Counter.GetValue()
				}
			}
		}
	}
	return out
}

// quietWakeups waits until the pods' workers stop waking (what a pod's
// start set going has settled) and returns the counts then.
func (e *podEnv) quietWakeups(t *testing.T) map[string]float64 {
	t.Helper()
	var last map[string]float64
	poll.Until(t, 20*time.Second, "the pods' workers quiet", func() error {
		now := e.wakeups(t)
		same := last != nil && fmt.Sprint(now) == fmt.Sprint(last)
		last = now
		if !same {
			time.Sleep(time.Second)
			return fmt.Errorf("wakeups still moving: %v", now)
		}
		return nil
	})
	return last
}

// diff is what each source added from before to after.
func diff(before, after map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range after {
		if d := v - before[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

// testSeenByEvent runs a pod, stops its container behind the agent's back
// with kill, and wants the Pod's status to show the end: with no relist
// and no resync, only a sync woken by the CRI's container event can tell,
// and the wakeups metric must say that event woke the worker and nothing
// else did.
func (e *podEnv) testSeenByEvent(t *testing.T, name string, kill func(t *testing.T, containerID string)) {
	grace := int64(1)
	pod := e.createPod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: &grace,
			Containers:                    []corev1.Container{{Name: "probee", Image: e.probee, ImagePullPolicy: corev1.PullIfNotPresent}},
		},
	})
	running := waitPod(t, e.c.Client, "default", name, 60*time.Second, "Running", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodRunning && len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].State.Running != nil
	})
	id := running.Status.ContainerStatuses[0].ContainerID
	before := e.quietWakeups(t)
	killed := time.Now()
	kill(t, id)
	ended := waitPod(t, e.c.Client, "default", name, 30*time.Second, "ended", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
	})
	t.Logf("Pod %s %v after the kill, seen through the watch", ended.Status.Phase, time.Since(killed).Round(time.Millisecond))
	cs := ended.Status.ContainerStatuses[0]
	if cs.ContainerID != id || cs.State.Terminated == nil {
		t.Errorf("container status %+v, want container %s terminated", cs, id)
	}
	got := diff(before, e.wakeups(t))
	if got["event"] < 1 || len(got) != 1 {
		t.Errorf("wakeups from the kill to the status: %v, want only event ones (no relist, resync, probe or other)", got)
	}
	e.deletePod(t, pod)
}

// killProcess kills the process of the container with the Pod status's
// containerID with SIGKILL, as the kernel's OOM killer or an operator on
// the host would.
func (e *podEnv) killProcess(t *testing.T, containerID string) {
	t.Helper()
	pid := e.containerPID(t, containerID)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill %d: %v", pid, err)
	}
}

// containerPID is the host's PID of the main process of the container
// containerID, from the runtime's verbose status.
func (e *podEnv) containerPID(t *testing.T, containerID string) int {
	t.Helper()
	id := strings.TrimPrefix(containerID, "containerd://")
	st, err := e.rt.RuntimeClient.ContainerStatus(context.Background(), &criv1.ContainerStatusRequest{ContainerId: id, Verbose: true})
	if err != nil {
		t.Fatalf("CRI status of container %s: %v", id, err)
	}
	var info struct {
		Pid int `json:"pid"`
	}
	if err := json.Unmarshal([]byte(st.Info["info"]), &info); err != nil || info.Pid <= 1 {
		t.Fatalf("pid of container %s from its verbose status %q: %v", id, st.Info["info"], err)
	}
	return info.Pid
}

// observed is one version of a Pod and when the test saw it.
type observed struct {
	pod *corev1.Pod
	at  time.Time
}

// podHistory is every version of a Pod that a watch told, from the
// version given on.
type podHistory struct {
	mu       sync.Mutex
	versions []observed
}

// record watches pod from its version on, until the test ends.
func (e *podEnv) record(t *testing.T, pod *corev1.Pod) *podHistory {
	h := &podHistory{versions: []observed{{pod, time.Now()}}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		rv := pod.ResourceVersion
		for ctx.Err() == nil {
			w, err := e.c.Client.CoreV1().Pods(pod.Namespace).Watch(ctx, metav1.ListOptions{
				FieldSelector:   fields.OneTermEqualSelector("metadata.name", pod.Name).String(),
				ResourceVersion: rv,
			})
			if err != nil {
				time.Sleep(100 * time.Millisecond)
				continue
			}
			for ev := range w.ResultChan() {
				if p, ok := ev.Object.(*corev1.Pod); ok && ev.Type != watch.Deleted && p.UID == pod.UID {
					h.mu.Lock()
					h.versions = append(h.versions, observed{p, time.Now()})
					h.mu.Unlock()
					rv = p.ResourceVersion
				}
			}
			w.Stop()
		}
	}()
	return h
}

// all returns the versions so far.
func (h *podHistory) all() []observed {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]observed(nil), h.versions...)
}

// until waits for ok to accept the versions so far, and returns them.
func (h *podHistory) until(t *testing.T, timeout time.Duration, what string, ok func([]observed) error) []observed {
	t.Helper()
	var vs []observed
	poll.Until(t, timeout, what, func() error {
		vs = h.all()
		return ok(vs)
	})
	return vs
}

// containerStatusOf is the status of the container named name in p,
// init containers included; nil if p's status has none.
func containerStatusOf(p *corev1.Pod, name string) *corev1.ContainerStatus {
	for _, cs := range [][]corev1.ContainerStatus{p.Status.InitContainerStatuses, p.Status.ContainerStatuses} {
		for i := range cs {
			if cs[i].Name == name {
				return &cs[i]
			}
		}
	}
	return nil
}

// logEntries reads the CRI log file at path, with the runtime's
// timestamps.
func logEntries(t *testing.T, path string) []crilog.Entry {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	entries, _, err := crilog.Tail(f, 0)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return entries
}

// criContainer is the runtime's status of the container with the Pod
// status's containerID.
func (e *podEnv) criContainer(t *testing.T, containerID string) *criv1.ContainerStatus {
	t.Helper()
	id := strings.TrimPrefix(containerID, "containerd://")
	st, err := e.rt.RuntimeClient.ContainerStatus(context.Background(), &criv1.ContainerStatusRequest{ContainerId: id})
	if err != nil {
		t.Fatalf("CRI status of container %s: %v", id, err)
	}
	return st.Status
}

// containerEvents waits up to 30 s for an event about the container of
// pod with reason whose message ok accepts, and returns the container's
// events of that reason.
func (e *podEnv) containerEvents(t *testing.T, pod *corev1.Pod, container, reason string, ok func(string) bool) []corev1.Event {
	t.Helper()
	var evs []corev1.Event
	poll.Until(t, 30*time.Second, fmt.Sprintf("a %s event about container %s", reason, container), func() error {
		list, err := e.c.Client.CoreV1().Events(pod.Namespace).List(context.Background(), metav1.ListOptions{
			FieldSelector: fields.Set{"involvedObject.uid": string(pod.UID), "reason": reason}.String(),
		})
		if err != nil {
			return err
		}
		evs = nil
		found := false
		for _, ev := range list.Items {
			if ev.InvolvedObject.FieldPath != "spec.containers{"+container+"}" && ev.InvolvedObject.FieldPath != "spec.initContainers{"+container+"}" {
				continue
			}
			evs = append(evs, ev)
			found = found || ok(ev.Message)
		}
		if !found {
			return fmt.Errorf("none that fits among %v", messages(evs))
		}
		return nil
	})
	return evs
}

// nodeConditions waits until the Node's conditions satisfy ok, and
// returns them.
func (e *podEnv) nodeConditions(t *testing.T, timeout time.Duration, what string, ok func(map[corev1.NodeConditionType]corev1.NodeCondition) error) map[corev1.NodeConditionType]corev1.NodeCondition {
	t.Helper()
	var conds map[corev1.NodeConditionType]corev1.NodeCondition
	poll.Until(t, timeout, what, func() error {
		node, err := e.c.Client.CoreV1().Nodes().Get(context.Background(), e.node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		conds = map[corev1.NodeConditionType]corev1.NodeCondition{}
		for _, c := range node.Status.Conditions {
			conds[c.Type] = c
		}
		return ok(conds)
	})
	return conds
}

// wantCondition says whether c has status and reason, and its message
// contains msg.
func wantCondition(c corev1.NodeCondition, status corev1.ConditionStatus, reason, msg string) error {
	if c.Status != status || c.Reason != reason || !strings.Contains(c.Message, msg) {
		return fmt.Errorf("%s = %s (%s: %q), want %s (%s: …%s…)", c.Type, c.Status, c.Reason, c.Message, status, reason, msg)
	}
	return nil
}

// testNodeNetwork takes the CNI config away from the real containerd,
// which then reports its network not ready, and wants the Node not Ready
// with the runtime's reason and NetworkUnavailable True; with the config
// back, Ready and the network available again.
func (e *podEnv) testNodeNetwork(t *testing.T) {
	confs, err := filepath.Glob(filepath.Join(e.rt.Dir, "cni", "net.d", "*.conflist"))
	if err != nil || len(confs) != 1 {
		t.Fatalf("CNI config of the runtime: %v %v, want one file", confs, err)
	}
	// Removed, and written again: containerd reloads its CNI config on
	// a write or a removal in its directory, not on a file renamed into
	// it (it ignores the creation, waiting for a write).
	conf := confs[0]
	data, err := os.ReadFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(conf); err != nil {
		t.Fatal(err)
	}
	restored := false
	restore := func() {
		if !restored {
			restored = true
			if err := os.WriteFile(conf, data, 0o644); err != nil {
				t.Error(err)
			}
		}
	}
	defer restore()
	took := time.Now()
	conds := e.nodeConditions(t, 30*time.Second, "Node not Ready for the pod network", func(cs map[corev1.NodeConditionType]corev1.NodeCondition) error {
		if err := wantCondition(cs[corev1.NodeReady], corev1.ConditionFalse, "NetworkNotReady", "NetworkReady=false"); err != nil {
			return err
		}
		return wantCondition(cs[corev1.NodeNetworkUnavailable], corev1.ConditionTrue, "NetworkPluginNotReady", "NetworkReady=false")
	})
	t.Logf("CNI config taken away: Ready %s %q after %v", conds[corev1.NodeReady].Status, conds[corev1.NodeReady].Message, time.Since(took).Round(time.Millisecond))
	restore()
	back := time.Now()
	e.nodeConditions(t, 30*time.Second, "Node Ready with the pod network back", func(cs map[corev1.NodeConditionType]corev1.NodeCondition) error {
		if err := wantCondition(cs[corev1.NodeReady], corev1.ConditionTrue, "KubeletReady", ""); err != nil {
			return err
		}
		return wantCondition(cs[corev1.NodeNetworkUnavailable], corev1.ConditionFalse, "NetworkReady", "")
	})
	t.Logf("CNI config back: Ready again after %v", time.Since(back).Round(time.Millisecond))
}

// testNodeRuntimeDown stops the real containerd and wants the Node not
// Ready because the runtime's status cannot be had (and the network's
// state Unknown); started again, Ready again.
func (e *podEnv) testNodeRuntimeDown(t *testing.T) {
	stopped := time.Now()
	e.rt.Stop()
	conds := e.nodeConditions(t, 30*time.Second, "Node not Ready with containerd stopped", func(cs map[corev1.NodeConditionType]corev1.NodeCondition) error {
		if err := wantCondition(cs[corev1.NodeReady], corev1.ConditionFalse, "RuntimeStatusUnknown", "CRI status"); err != nil {
			return err
		}
		return wantCondition(cs[corev1.NodeNetworkUnavailable], corev1.ConditionUnknown, "RuntimeStatusUnknown", "CRI status")
	})
	t.Logf("containerd stopped: Ready %s %q after %v", conds[corev1.NodeReady].Status, conds[corev1.NodeReady].Message, time.Since(stopped).Round(time.Millisecond))
	e.rt.StartAgain()
	started := time.Now()
	e.nodeConditions(t, 30*time.Second, "Node Ready with containerd started again", func(cs map[corev1.NodeConditionType]corev1.NodeCondition) error {
		if err := wantCondition(cs[corev1.NodeReady], corev1.ConditionTrue, "KubeletReady", ""); err != nil {
			return err
		}
		return wantCondition(cs[corev1.NodeNetworkUnavailable], corev1.ConditionFalse, "NetworkReady", "")
	})
	t.Logf("containerd started again: Ready after %v", time.Since(started).Round(time.Millisecond))
}
