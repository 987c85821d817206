package pods_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cairn-os/cairn/agent/kubelet/pods"
	"github.com/cairn-os/cairn/internal/crilog"
	"github.com/cairn-os/cairn/test/registry"
	"github.com/cairn-os/cairn/test/runtime"
	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// env is a real containerd with a registry holding the test images.
type env struct {
	rt          *runtime.Runtime
	cfg         pods.Config
	w           *pods.Worker
	hello, echo string // image references
	ctx         context.Context
}

func setup(t *testing.T) *env {
	t.Helper()
	rt := runtime.Start(t)
	reg := registry.Start(t)
	if err := rt.AllowHTTP(reg.Addr); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	if _, err := registry.BuildAndPush(ctx, reg, "./test/images/hello", "cairn-test/hello:v1"); err != nil {
		t.Fatal(err)
	}
	if _, err := registry.BuildAndPush(ctx, reg, "./agent/kubelet/pods/testdata/echoexit", "cairn-test/echoexit:v1"); err != nil {
		t.Fatal(err)
	}
	e := &env{
		rt:    rt,
		cfg:   pods.Config{Runtime: rt.RuntimeClient, Images: rt.ImageClient, LogRoot: filepath.Join(t.TempDir(), "pods")},
		hello: reg.Addr + "/cairn-test/hello:v1",
		echo:  reg.Addr + "/cairn-test/echoexit:v1",
		ctx:   ctx,
	}
	e.newWorker(t)
	return e
}

// newWorker makes e's worker anew, from e.cfg.
func (e *env) newWorker(t *testing.T) {
	t.Helper()
	w, err := pods.New(e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.w = w
}

func newPod(name string, policy corev1.RestartPolicy, containers ...corev1.Container) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name), Labels: map[string]string{"app": name}},
		Spec:       corev1.PodSpec{RestartPolicy: policy, Containers: containers},
	}
}

// syncUntil calls Sync until done accepts the status, as the kubelet's
// worker would on each event, and returns that status.
func (e *env) syncUntil(t *testing.T, pod *corev1.Pod, what string, done func(*pods.Status) bool) *pods.Status {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		st, err := e.w.Sync(e.ctx, pod)
		if err != nil {
			t.Fatalf("Sync(%s): %v", pod.Name, err)
		}
		if done(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod %s: not %s within 60s; last status %+v", pod.Name, what, st)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func phaseIs(p corev1.PodPhase) func(*pods.Status) bool {
	return func(st *pods.Status) bool { return st.Phase == p }
}

func TestPodRuns(t *testing.T) {
	e := setup(t)
	pod := newPod("hello", corev1.RestartPolicyAlways, corev1.Container{
		Name: "hello", Image: e.hello, ImagePullPolicy: corev1.PullIfNotPresent,
		Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")},
			Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
		},
	})
	start := time.Now()
	st := e.syncUntil(t, pod, "Running", phaseIs(corev1.PodRunning))
	t.Logf("pod start to Running: %v (image pull included)", time.Since(start).Round(time.Millisecond))

	if ip := net.ParseIP(st.PodIP); ip == nil || !e.rt.Subnet.Contains(ip) {
		t.Errorf("pod IP %q, want one in the CNI range %s", st.PodIP, e.rt.Subnet)
	}
	c := st.Containers[0]
	if c.State != pods.Running || c.ImageID == "" || c.StartedAt.IsZero() || c.RestartCount != 0 {
		t.Errorf("container status %+v, want Running with an image ID, a start time and no restarts", c)
	}
	lines := runtime.LogLines(t, c.LogPath, 1)
	if len(lines) == 0 || !strings.HasPrefix(lines[0], "hello from cairn-test-image pid=1 ") {
		t.Errorf("log %s = %q, want the hello line first", c.LogPath, lines)
	}
	if want := filepath.Join(e.cfg.LogRoot, "default_hello_uid-hello", "hello", "0.log"); c.LogPath != want {
		t.Errorf("log path %s, want %s", c.LogPath, want)
	}

	// The runtime got the resources as cgroup settings.
	resp, err := e.rt.RuntimeClient.ContainerStatus(e.ctx, &criv1.ContainerStatusRequest{ContainerId: c.ID})
	if err != nil {
		t.Fatal(err)
	}
	got := resp.Status.GetResources().GetLinux()
	if got.GetCpuShares() != 102 || got.GetCpuQuota() != 50000 || got.GetCpuPeriod() != 100000 || got.GetMemoryLimitInBytes() != 64<<20 {
		t.Errorf("resources shares=%d quota=%d period=%d memory=%d, want 102 50000 100000 %d",
			got.GetCpuShares(), got.GetCpuQuota(), got.GetCpuPeriod(), got.GetMemoryLimitInBytes(), 64<<20)
	}

	// A second Sync changes nothing.
	again, err := e.w.Sync(e.ctx, pod)
	if err != nil {
		t.Fatal(err)
	}
	if again.SandboxID != st.SandboxID || again.Containers[0].ID != c.ID {
		t.Errorf("second Sync made sandbox %s container %s, want the same %s %s", again.SandboxID, again.Containers[0].ID, st.SandboxID, c.ID)
	}
}

func TestInitContainerFirst(t *testing.T) {
	e := setup(t)
	pod := newPod("init", corev1.RestartPolicyAlways, corev1.Container{Name: "app", Image: e.hello})
	pod.Spec.InitContainers = []corev1.Container{{
		Name: "setup", Image: e.echo, Args: []string{"init"},
	}}
	st := e.syncUntil(t, pod, "Running", phaseIs(corev1.PodRunning))
	ic, app := st.InitContainers[0], st.Containers[0]
	if ic.State != pods.Terminated || ic.ExitCode != 0 || ic.Reason != "Completed" {
		t.Errorf("init container %+v, want Terminated Completed", ic)
	}
	if app.StartedAt.Before(ic.FinishedAt) {
		t.Errorf("app started at %v, before the init container finished at %v", app.StartedAt, ic.FinishedAt)
	}
	if lines := runtime.LogLines(t, ic.LogPath, 1); len(lines) == 0 || lines[0] != "args=init" {
		t.Errorf("init container log = %q, want args=init", lines)
	}
}

func TestEnvAndArgs(t *testing.T) {
	e := setup(t)
	pod := newPod("echo", corev1.RestartPolicyNever, corev1.Container{
		Name: "echo", Image: e.echo,
		Args: []string{"one", "two words"},
		Env:  []corev1.EnvVar{{Name: "CAIRN_B", Value: "bee"}, {Name: "CAIRN_A", Value: "a=b c"}},
	})
	st := e.syncUntil(t, pod, "Succeeded", phaseIs(corev1.PodSucceeded))
	want := []string{"args=one two words", "CAIRN_A=a=b c", "CAIRN_B=bee"}
	if diff := cmp.Diff(want, runtime.LogLines(t, st.Containers[0].LogPath, 3)); diff != "" {
		t.Errorf("container output (-want +got):\n%s", diff)
	}
}

func TestExitFailsWithRestartNever(t *testing.T) {
	e := setup(t)
	pod := newPod("fail", corev1.RestartPolicyNever, corev1.Container{
		Name: "fail", Image: e.echo, Env: []corev1.EnvVar{{Name: "EXIT_CODE", Value: "1"}},
	})
	st := e.syncUntil(t, pod, "Failed", phaseIs(corev1.PodFailed))
	c := st.Containers[0]
	if c.State != pods.Terminated || c.ExitCode != 1 || c.RestartCount != 0 || c.Reason != "Error" {
		t.Errorf("container %+v, want Terminated Error with exit code 1 and no restart", c)
	}
	// And stays so.
	again, err := e.w.Sync(e.ctx, pod)
	if err != nil || again.Phase != corev1.PodFailed || again.Containers[0].ID != c.ID {
		t.Errorf("Sync after failure = %+v, %v; want the same container, Failed", again, err)
	}
}

func TestCrashLoopBackOff(t *testing.T) {
	e := setup(t)
	var now time.Time // the backoff's clock; the zero time until the exit
	e.cfg.Now = func() time.Time { return now }
	e.newWorker(t)
	pod := newPod("crash", corev1.RestartPolicyOnFailure, corev1.Container{
		Name: "crash", Image: e.echo, Env: []corev1.EnvVar{{Name: "EXIT_CODE", Value: "3"}},
	})
	st := e.syncUntil(t, pod, "backing off", func(st *pods.Status) bool {
		return st.Containers[0].Reason == pods.ReasonCrashLoopBackOff
	})
	c := st.Containers[0]
	if c.State != pods.Waiting || c.ExitCode != 3 || c.RestartCount != 0 {
		t.Errorf("after the first exit: %+v, want Waiting in CrashLoopBackOff with exit code 3", c)
	}
	if st.Phase != corev1.PodRunning {
		t.Errorf("phase while backing off = %s, want Running", st.Phase)
	}
	now = c.FinishedAt.Add(pods.BackoffInitial - time.Millisecond)
	if st, err := e.w.Sync(e.ctx, pod); err != nil || st.Containers[0].ID != c.ID {
		t.Errorf("Sync %v after the exit = %+v, %v; want no restart yet", pods.BackoffInitial-time.Millisecond, st, err)
	}
	now = c.FinishedAt.Add(pods.BackoffInitial)
	st = e.syncUntil(t, pod, "restarted", func(st *pods.Status) bool {
		return st.Containers[0].RestartCount == 1
	})
	if st.Containers[0].LogPath == c.LogPath {
		t.Errorf("restart logs to %s as the first run did, want a file per attempt", c.LogPath)
	}
	// The second exit waits twice as long.
	st = e.syncUntil(t, pod, "backing off again", func(st *pods.Status) bool {
		return st.Containers[0].Reason == pods.ReasonCrashLoopBackOff && st.Containers[0].RestartCount == 1
	})
	c = st.Containers[0]
	now = c.FinishedAt.Add(2*pods.BackoffInitial - time.Millisecond)
	if st, err := e.w.Sync(e.ctx, pod); err != nil || st.Containers[0].ID != c.ID {
		t.Errorf("Sync %v after the second exit = %+v, %v; want no restart yet", 2*pods.BackoffInitial-time.Millisecond, st, err)
	}
	now = c.FinishedAt.Add(2 * pods.BackoffInitial)
	e.syncUntil(t, pod, "restarted twice", func(st *pods.Status) bool {
		return st.Containers[0].RestartCount == 2
	})
}

// TestExitedCollected has a container crash and restart, the backoff's
// clock far ahead, until its tenth run: the runtime keeps its latest six
// exited containers and their logs, the older ones are removed with
// theirs, and the restarts count on.
func TestExitedCollected(t *testing.T) {
	e := setup(t)
	later := time.Now().Add(24 * time.Hour) // every backoff has passed
	e.cfg.Now = func() time.Time { return later }
	e.newWorker(t)
	pod := newPod("crash", corev1.RestartPolicyAlways, corev1.Container{
		Name: "crash", Image: e.echo, Env: []corev1.EnvVar{{Name: "EXIT_CODE", Value: "3"}},
	})
	st := e.syncUntil(t, pod, "the tenth run", func(st *pods.Status) bool {
		return st.Containers[0].RestartCount == 9
	})
	ctrs, err := e.rt.RuntimeClient.ListContainers(e.ctx, &criv1.ListContainersRequest{
		Filter: &criv1.ContainerFilter{LabelSelector: map[string]string{pods.LabelPodUID: string(pod.UID)}},
	})
	if err != nil {
		t.Fatal(err)
	}
	var attempts []uint32
	for _, c := range ctrs.Containers {
		attempts = append(attempts, c.GetMetadata().GetAttempt())
	}
	slices.Sort(attempts)
	// The tenth (attempt 9) and the six exits before it: the latest may
	// have exited too, and then the one before it went.
	if len(attempts) < 6 || len(attempts) > 7 || attempts[len(attempts)-1] != 9 {
		t.Errorf("the runtime holds attempts %v, want the latest six exited and the tenth", attempts)
	}
	logs, err := filepath.Glob(filepath.Join(filepath.Dir(st.Containers[0].LogPath), "*.log"))
	if err != nil {
		t.Fatal(err)
	}
	if len(logs) != len(attempts) {
		t.Errorf("logs %v, want one for each of the attempts %v kept", logs, attempts)
	}
}

func TestTerminate(t *testing.T) {
	e := setup(t)
	pod := newPod("kill", corev1.RestartPolicyAlways, corev1.Container{Name: "hello", Image: e.hello})
	st := e.syncUntil(t, pod, "Running", phaseIs(corev1.PodRunning))
	// Its first line says it handles SIGTERM: as PID 1 it would ignore
	// the signal before.
	runtime.LogLines(t, st.Containers[0].LogPath, 1)
	start := time.Now()
	if err := e.w.Terminate(e.ctx, pod, 10*time.Second); err != nil {
		t.Fatalf("Terminate: %v", err)
	}
	// hello exits on SIGTERM, well within the grace period.
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Terminate took %v; hello exits on SIGTERM at once", d)
	}
	sbs, err := e.rt.RuntimeClient.ListPodSandbox(e.ctx, &criv1.ListPodSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	ctrs, err := e.rt.RuntimeClient.ListContainers(e.ctx, &criv1.ListContainersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(sbs.Items) != 0 || len(ctrs.Containers) != 0 {
		t.Errorf("after Terminate the runtime holds %d sandboxes and %d containers, want none", len(sbs.Items), len(ctrs.Containers))
	}
}

// TestCleanup has Cleanup remove the sandbox of a pod the node no longer
// has at once and its logs a minute later, and keep what the node's
// pods still use.
func TestCleanup(t *testing.T) {
	e := setup(t)
	now := time.Now() // of the orphaned logs
	e.cfg.Now = func() time.Time { return now }
	e.newWorker(t)
	kept := newPod("kept", corev1.RestartPolicyAlways, corev1.Container{Name: "hello", Image: e.hello})
	orphan := newPod("orphan", corev1.RestartPolicyAlways, corev1.Container{Name: "hello", Image: e.hello})
	for _, pod := range []*corev1.Pod{kept, orphan} {
		e.syncUntil(t, pod, "Running", phaseIs(corev1.PodRunning))
	}
	t.Cleanup(func() { e.w.Terminate(context.Background(), kept, 0) })
	logDir := func(pod *corev1.Pod) string {
		return crilog.PodDir(e.cfg.LogRoot, pod.Namespace, pod.Name, string(pod.UID))
	}
	sandboxes := func() map[string]int {
		t.Helper()
		sbs, err := e.rt.RuntimeClient.ListPodSandbox(e.ctx, &criv1.ListPodSandboxRequest{})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]int{}
		for _, sb := range sbs.Items {
			out[sb.GetMetadata().GetName()]++
		}
		return out
	}
	keep := func(uid types.UID) bool { return uid == kept.UID }

	e.w.Cleanup(e.ctx, keep)
	if got := sandboxes(); got["kept"] != 1 || got["orphan"] != 0 {
		t.Errorf("sandboxes by pod after Cleanup: %v, want kept's alone", got)
	}
	if _, err := os.Stat(logDir(orphan)); err != nil {
		t.Errorf("orphan's logs gone at once, want them kept a while: %v", err)
	}

	now = now.Add(time.Minute)
	e.w.Cleanup(e.ctx, keep)
	if _, err := os.Stat(logDir(orphan)); !os.IsNotExist(err) {
		t.Errorf("orphan's logs %s still there a minute later (%v)", logDir(orphan), err)
	}
	if _, err := os.Stat(logDir(kept)); err != nil {
		t.Errorf("kept's logs: %v, want them there", err)
	}
}

func TestSecurityContext(t *testing.T) {
	e := setup(t)
	user, group, yes := int64(1000), int64(2000), true
	pod := newPod("secure", corev1.RestartPolicyNever, corev1.Container{
		Name: "id", Image: e.echo, Env: []corev1.EnvVar{{Name: "ECHO_ID", Value: "1"}},
		SecurityContext: &corev1.SecurityContext{
			RunAsUser: &user, RunAsGroup: &group, ReadOnlyRootFilesystem: &yes,
			Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		},
	})
	st := e.syncUntil(t, pod, "Succeeded", phaseIs(corev1.PodSucceeded))
	want := []string{"uid=1000 gid=2000", "root=read-only", "args="}
	if diff := cmp.Diff(want, runtime.LogLines(t, st.Containers[0].LogPath, 3)); diff != "" {
		t.Errorf("container output (-want +got):\n%s", diff)
	}
}

func TestPullPolicyNever(t *testing.T) {
	e := setup(t)
	pod := newPod("never", corev1.RestartPolicyNever, corev1.Container{
		Name: "never", Image: e.echo, ImagePullPolicy: corev1.PullNever,
	})
	st, err := e.w.Sync(e.ctx, pod)
	if !errors.Is(err, pods.ErrImageNeverPull) {
		t.Fatalf("Sync with an absent image and imagePullPolicy Never: %v, want ErrImageNeverPull", err)
	}
	if c := st.Containers[0]; c.State != pods.Waiting || c.Reason != "ErrImageNeverPull" {
		t.Errorf("container %+v, want Waiting ErrImageNeverPull", c)
	}
	// Once another pod (Always) pulled it, Never finds it.
	always := newPod("always", corev1.RestartPolicyNever, corev1.Container{
		Name: "always", Image: e.echo, ImagePullPolicy: corev1.PullAlways,
	})
	e.syncUntil(t, always, "Succeeded", phaseIs(corev1.PodSucceeded))
	e.syncUntil(t, pod, "Succeeded", phaseIs(corev1.PodSucceeded))
}

func TestTerminateGracePeriod(t *testing.T) {
	e := setup(t)
	pod := newPod("stubborn", corev1.RestartPolicyAlways, corev1.Container{
		Name: "stubborn", Image: e.echo, Env: []corev1.EnvVar{{Name: "IGNORE_TERM", Value: "1"}},
	})
	st := e.syncUntil(t, pod, "Running", phaseIs(corev1.PodRunning))
	runtime.LogLines(t, st.Containers[0].LogPath, 2) // "waiting": SIGTERM is ignored from here on
	const grace = 2 * time.Second
	start := time.Now()
	if err := e.w.Terminate(e.ctx, pod, grace); err != nil {
		t.Fatalf("Terminate: %v", err)
	}
	if d := time.Since(start); d < grace || d > grace+5*time.Second {
		t.Errorf("Terminate of a container that ignores SIGTERM took %v, want about the grace period %v", d, grace)
	}
}

// TestEndedPodNotRunAgain stops the sandbox of pods that ended, as the
// pod worker does to release their network, and wants Sync to leave a
// pod that ended for good as it ended — no new sandbox, nothing run
// again, the same phase — and to run again, in a new sandbox, only a pod
// whose restartPolicy restarts its container.
func TestEndedPodNotRunAgain(t *testing.T) {
	e := setup(t)
	for _, tc := range []struct {
		name     string
		policy   corev1.RestartPolicy
		exitCode string
		ended    corev1.PodPhase // "" if it runs again
	}{
		{"never-failed", corev1.RestartPolicyNever, "1", corev1.PodFailed},
		{"never-succeeded", corev1.RestartPolicyNever, "0", corev1.PodSucceeded},
		{"onfailure-succeeded", corev1.RestartPolicyOnFailure, "0", corev1.PodSucceeded},
		{"always", corev1.RestartPolicyAlways, "0", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := newPod(tc.name, tc.policy, corev1.Container{
				Name: "c", Image: e.echo, ImagePullPolicy: corev1.PullIfNotPresent, Env: []corev1.EnvVar{{Name: "EXIT_CODE", Value: tc.exitCode}},
			})
			st := e.syncUntil(t, pod, "exited", func(st *pods.Status) bool {
				c := st.Containers[0]
				return c.State == pods.Terminated || c.Reason == pods.ReasonCrashLoopBackOff
			})
			first := st.Containers[0].ID
			if _, err := e.rt.RuntimeClient.StopPodSandbox(e.ctx, &criv1.StopPodSandboxRequest{PodSandboxId: st.SandboxID}); err != nil {
				t.Fatal(err)
			}
			again, err := e.w.Sync(e.ctx, pod)
			if err != nil {
				t.Fatalf("Sync after the sandbox stopped: %v", err)
			}
			sbs, err := e.rt.RuntimeClient.ListPodSandbox(e.ctx, &criv1.ListPodSandboxRequest{
				Filter: &criv1.PodSandboxFilter{LabelSelector: map[string]string{pods.LabelPodUID: string(pod.UID)}},
			})
			if err != nil {
				t.Fatal(err)
			}
			if tc.ended == "" {
				if len(sbs.Items) != 2 || again.SandboxID == "" || again.SandboxID == st.SandboxID {
					t.Errorf("%d sandboxes, Sync's %q: want a new one made for the pod that restarts", len(sbs.Items), again.SandboxID)
				}
				// Its container goes on counting in the new sandbox.
				if c := again.Containers[0]; c.ID == "" || c.ID == first || c.RestartCount != 1 {
					t.Errorf("container in the new sandbox %+v, want a new one, restart count 1", c)
				}
				return
			}
			if again.Phase != tc.ended || again.SandboxID != "" || again.Containers[0].ID != first || again.Containers[0].State != pods.Terminated {
				t.Errorf("Sync after the sandbox stopped = %+v, want %s with container %s terminated and no sandbox", again, tc.ended, first)
			}
			if len(sbs.Items) != 1 {
				t.Errorf("%d sandboxes of the pod, want only the stopped one: nothing run again", len(sbs.Items))
			}
		})
	}
}
