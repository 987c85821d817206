package kubelet

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cairn-os/cairn/agent/kubelet/pods"
)

func testSyncer() *podSyncer {
	node := &corev1.Node{Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: "192.0.2.10"},
		{Type: corev1.NodeInternalIP, Address: "192.0.2.11"},
		{Type: corev1.NodeInternalIP, Address: "2001:db8::10"},
		{Type: corev1.NodeHostName, Address: "n1"},
	}}}
	return &podSyncer{scheme: "containerd", node: func() *corev1.Node { return node }}
}

// roundTrip is status as the API server gives it back.
func roundTrip(t *testing.T, st corev1.PodStatus) corev1.PodStatus {
	t.Helper()
	b, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	var out corev1.PodStatus
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestPodStatusStable wants a status computed again from the same runtime
// view equal to the one written, so that it is not written again.
func TestPodStatusStable(t *testing.T) {
	s := testSyncer()
	pod := &corev1.Pod{Spec: corev1.PodSpec{
		InitContainers: []corev1.Container{{Name: "init", Image: "i"}},
		Containers:     []corev1.Container{{Name: "app", Image: "a"}},
	}}
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue}}
	started := time.Now().Add(-time.Minute)
	st := &pods.Status{Phase: corev1.PodRunning, SandboxID: "sb", PodIP: "10.244.0.5",
		InitContainers: []pods.ContainerStatus{{Name: "init", ID: "i1", State: pods.Terminated, Reason: "Completed", StartedAt: started, FinishedAt: started.Add(time.Second)}},
		Containers:     []pods.ContainerStatus{{Name: "app", ID: "a1", State: pods.Running, StartedAt: started.Add(1500 * time.Millisecond), ImageID: "sha256:x"}},
	}
	first := s.podStatus(pod, st, metav1.Now())
	pod.Status = roundTrip(t, first)
	second := s.podStatus(pod, st, metav1.NewTime(time.Now().Add(3*time.Second)))
	if !apiequality.Semantic.DeepEqual(pod.Status, second) {
		t.Errorf("status changed with nothing new:\nwritten %+v\nagain   %+v", pod.Status, second)
	}
	if first.HostIP != "192.0.2.10" || len(first.HostIPs) != 2 || first.HostIPs[1].IP != "2001:db8::10" {
		t.Errorf("hostIP %s, hostIPs %v: want the first address of each family", first.HostIP, first.HostIPs)
	}
	if len(first.Conditions) != 5 || first.Conditions[0].Type != corev1.PodScheduled {
		t.Errorf("conditions %v: want PodScheduled kept and four of the node's", first.Conditions)
	}
	for _, c := range first.Conditions {
		if c.Status != corev1.ConditionTrue {
			t.Errorf("condition %s = %s, want True", c.Type, c.Status)
		}
	}
	if cs := first.ContainerStatuses[0]; !cs.Ready || cs.ContainerID != "containerd://a1" || cs.Image != "a" || cs.State.Running == nil {
		t.Errorf("app status %+v", cs)
	}
	if cs := first.InitContainerStatuses[0]; !cs.Ready || cs.State.Terminated == nil {
		t.Errorf("init status %+v", cs)
	}
}

// TestLastState follows a container through a crash, its backoff and
// its restart.
func TestLastState(t *testing.T) {
	s := testSyncer()
	pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "a"}}}}
	t0 := time.Now().Add(-time.Minute).Truncate(time.Second)
	exited := pods.ContainerStatus{Name: "app", ID: "c0", State: pods.Terminated, ExitCode: 2, Reason: "Error", StartedAt: t0, FinishedAt: t0.Add(time.Second)}
	waiting := exited
	waiting.State, waiting.Reason = pods.Waiting, pods.ReasonCrashLoopBackOff
	restarted := pods.ContainerStatus{Name: "app", ID: "c1", State: pods.Running, RestartCount: 1, StartedAt: t0.Add(20 * time.Second)}

	for i, cs := range []pods.ContainerStatus{exited, waiting, restarted} {
		pod.Status = roundTrip(t, s.podStatus(pod, &pods.Status{Phase: corev1.PodRunning, SandboxID: "sb", PodIP: "10.0.0.1", Containers: []pods.ContainerStatus{cs}}, metav1.Now()))
		got := pod.Status.ContainerStatuses[0]
		lt := got.LastTerminationState.Terminated
		switch i {
		case 0:
			if got.State.Terminated == nil || lt != nil {
				t.Errorf("exited: %+v", got)
			}
		case 1, 2:
			if lt == nil || lt.ExitCode != 2 || lt.Reason != "Error" || lt.ContainerID != "containerd://c0" {
				t.Errorf("step %d: lastState %+v, want c0's exit 2", i, got.LastTerminationState)
			}
		}
		if i == 1 && (got.State.Waiting == nil || got.State.Waiting.Reason != pods.ReasonCrashLoopBackOff) {
			t.Errorf("waiting: state %+v", got.State)
		}
		if i == 2 && (got.State.Running == nil || got.RestartCount != 1 || !got.Ready) {
			t.Errorf("restarted: %+v", got)
		}
	}
}

// TestReadinessGates follows a ready pod whose two readiness gates others
// set: Ready only once both conditions are True, ContainersReady all the
// while, the gates' conditions kept as they were set, and every condition
// the node sets telling the spec's generation.
func TestReadinessGates(t *testing.T) {
	s := testSyncer()
	pod := &corev1.Pod{Spec: corev1.PodSpec{
		Containers:     []corev1.Container{{Name: "app", Image: "a"}},
		ReadinessGates: []corev1.PodReadinessGate{{ConditionType: "example.com/one"}, {ConditionType: "example.com/two"}},
	}}
	pod.Generation = 3
	st := &pods.Status{Phase: corev1.PodRunning, SandboxID: "sb", PodIP: "10.244.0.5",
		Containers: []pods.ContainerStatus{{Name: "app", ID: "a1", State: pods.Running, StartedAt: time.Now()}}}
	cond := func(st corev1.PodStatus, ct corev1.PodConditionType) corev1.PodCondition {
		for _, c := range st.Conditions {
			if c.Type == ct {
				return c
			}
		}
		return corev1.PodCondition{}
	}
	for _, step := range []struct {
		name     string
		one, two corev1.ConditionStatus // "" for none set
		ready    corev1.ConditionStatus
		message  string
	}{
		{"no gate set", "", "", corev1.ConditionFalse,
			`corresponding condition of pod readiness gate "example.com/one" does not exist., corresponding condition of pod readiness gate "example.com/two" does not exist.`},
		{"one True", corev1.ConditionTrue, "", corev1.ConditionFalse,
			`corresponding condition of pod readiness gate "example.com/two" does not exist.`},
		{"both True", corev1.ConditionTrue, corev1.ConditionTrue, corev1.ConditionTrue, ""},
		{"one False again", corev1.ConditionFalse, corev1.ConditionTrue, corev1.ConditionFalse,
			`the status of pod readiness gate "example.com/one" is not "True", but False`},
	} {
		pod.Status.Conditions = slices.DeleteFunc(pod.Status.Conditions, func(c corev1.PodCondition) bool { return c.Type == "example.com/one" || c.Type == "example.com/two" })
		for ct, v := range map[corev1.PodConditionType]corev1.ConditionStatus{"example.com/one": step.one, "example.com/two": step.two} {
			if v != "" {
				pod.Status.Conditions = append(pod.Status.Conditions, corev1.PodCondition{Type: ct, Status: v})
			}
		}
		got := roundTrip(t, s.podStatus(pod, st, metav1.Now()))
		ready := cond(got, corev1.PodReady)
		if ready.Status != step.ready || ready.Message != step.message {
			t.Errorf("%s: Ready %s %q, want %s %q", step.name, ready.Status, ready.Message, step.ready, step.message)
		}
		if want := "ReadinessGatesNotReady"; step.ready == corev1.ConditionFalse && ready.Reason != want {
			t.Errorf("%s: Ready's reason %q, want %q", step.name, ready.Reason, want)
		}
		if c := cond(got, corev1.ContainersReady); c.Status != corev1.ConditionTrue {
			t.Errorf("%s: ContainersReady %s, want True: the containers are ready", step.name, c.Status)
		}
		if c := cond(got, "example.com/one"); c.Status != step.one || c.ObservedGeneration != 0 {
			t.Errorf("%s: gate condition %+v changed, want status %q as set", step.name, c, step.one)
		}
		if got.ObservedGeneration != 3 {
			t.Errorf("%s: observedGeneration %d, want 3", step.name, got.ObservedGeneration)
		}
		for _, ct := range []corev1.PodConditionType{corev1.PodReadyToStartContainers, corev1.PodInitialized, corev1.ContainersReady, corev1.PodReady} {
			if c := cond(got, ct); c.ObservedGeneration != 3 {
				t.Errorf("%s: condition %s's observedGeneration %d, want 3", step.name, ct, c.ObservedGeneration)
			}
		}
		pod.Status = got
	}
}
