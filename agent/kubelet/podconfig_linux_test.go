package kubelet

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/cairn-os/cairn/agent/kubelet/pods"
	"github.com/cairn-os/cairn/test/poll"
	"github.com/cairn-os/cairn/test/registry"
	"github.com/cairn-os/cairn/test/runtime"
)

// TestPodConfig wants containers configured from the API as the kubelet
// does — env from ConfigMaps, Secrets, the pod's fields and resources,
// $(VAR) in args, images from a private registry with imagePullSecrets —
// and, when that cannot be done, the kubelet's reasons on the Pod and its
// events.
func TestPodConfig(t *testing.T) {
	e, cfg := newPodEnv(t, "config-1")
	cfg.PodResync = 2 * time.Second // the retries of the failing pods
	start(t, cfg)

	t.Run("env from references and $(VAR) in args", e.testEnvRefs)
	t.Run("missing ConfigMap, then key, then fixed", e.testConfigError)
	t.Run("invalid image name", e.testInvalidImageName)
	t.Run("image pull backoff", e.testImagePullBackOff)
	t.Run("start error", e.testRunContainerError)
	t.Run("crash loop back-off", e.testCrashLoopBackOff)
	t.Run("pull secrets", e.testPullSecrets)
}

// createConfigMap and createSecret make obj in the default namespace
// until the test ends.
func (e *podEnv) createConfigMap(t *testing.T, cm *corev1.ConfigMap) {
	t.Helper()
	cms := e.c.Client.CoreV1().ConfigMaps("default")
	if _, err := cms.Create(context.Background(), cm, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create ConfigMap %s: %v", cm.Name, err)
	}
	t.Cleanup(func() { cms.Delete(context.Background(), cm.Name, metav1.DeleteOptions{}) })
}

func (e *podEnv) createSecret(t *testing.T, s *corev1.Secret) {
	t.Helper()
	secrets := e.c.Client.CoreV1().Secrets("default")
	if _, err := secrets.Create(context.Background(), s, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create Secret %s: %v", s.Name, err)
	}
	t.Cleanup(func() { secrets.Delete(context.Background(), s.Name, metav1.DeleteOptions{}) })
}

func cmKey(name, key string) *corev1.EnvVarSource {
	return &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: name}, Key: key}}
}

func (e *podEnv) testEnvRefs(t *testing.T) {
	e.createConfigMap(t, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "app-config"}, Data: map[string]string{"greeting": "hello", "mode": "fast"}})
	e.createSecret(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "app-secret"}, Data: map[string][]byte{"token": []byte("s3cret")}})
	yes := true
	field := func(p string) *corev1.EnvVarSource {
		return &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: p}}
	}
	res := func(r, divisor string) *corev1.EnvVarSource {
		return &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{Resource: r, Divisor: resource.MustParse(divisor)}}
	}
	pod := e.createPod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "env-refs", Namespace: "default", Labels: map[string]string{"app": "env"}},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{
				Name: "echo", Image: e.echo, ImagePullPolicy: corev1.PullIfNotPresent,
				Args: []string{"$(CAIRN_GREETING)", "$$(CAIRN_GREETING)", "$(CAIRN_UNDEFINED)"},
				Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("250m")},
					Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
				},
				EnvFrom: []corev1.EnvFromSource{
					{Prefix: "CAIRN_CM_", ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "app-config"}}},
					{Prefix: "CAIRN_S_", SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "app-secret"}}},
					{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "absent"}, Optional: &yes}},
				},
				Env: []corev1.EnvVar{
					{Name: "CAIRN_GREETING", ValueFrom: cmKey("app-config", "greeting")},
					{Name: "CAIRN_TOKEN", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
						LocalObjectReference: corev1.LocalObjectReference{Name: "app-secret"}, Key: "token"}}},
					{Name: "CAIRN_OPTIONAL", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{
						LocalObjectReference: corev1.LocalObjectReference{Name: "app-config"}, Key: "absent", Optional: &yes}}},
					{Name: "CAIRN_POD", ValueFrom: field("metadata.name")},
					{Name: "CAIRN_NS", ValueFrom: field("metadata.namespace")},
					{Name: "CAIRN_UID", ValueFrom: field("metadata.uid")},
					{Name: "CAIRN_APP", ValueFrom: field("metadata.labels['app']")},
					{Name: "CAIRN_NODE", ValueFrom: field("spec.nodeName")},
					{Name: "CAIRN_HOST_IP", ValueFrom: field("status.hostIP")},
					{Name: "CAIRN_POD_IP", ValueFrom: field("status.podIP")},
					{Name: "CAIRN_CPU_LIMIT_M", ValueFrom: res("limits.cpu", "1m")},
					{Name: "CAIRN_CPU_REQUEST_M", ValueFrom: res("requests.cpu", "1m")},
					{Name: "CAIRN_MEM_LIMIT_MI", ValueFrom: res("limits.memory", "1Mi")},
					{Name: "CAIRN_DISK_LIMIT", ValueFrom: res("limits.ephemeral-storage", "1")},
					{Name: "CAIRN_WHERE", Value: "$(CAIRN_POD)@$(CAIRN_NODE)"},
					// The service variables, here the API server's.
					{Name: "CAIRN_API", Value: "$(KUBERNETES_SERVICE_HOST):$(KUBERNETES_SERVICE_PORT)"},
				},
			}},
		},
	})
	done := waitPod(t, e.c.Client, "default", "env-refs", 60*time.Second, "Succeeded", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodSucceeded
	})
	node, err := e.c.Client.CoreV1().Nodes().Get(context.Background(), e.node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	disk := node.Status.Allocatable[corev1.ResourceEphemeralStorage]
	api, err := e.c.Client.CoreV1().Services("default").Get(context.Background(), "kubernetes", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"args=hello $(CAIRN_GREETING) $(CAIRN_UNDEFINED)",
		fmt.Sprintf("CAIRN_API=%s:%d", api.Spec.ClusterIP, api.Spec.Ports[0].Port),
		"CAIRN_APP=env",
		"CAIRN_CM_greeting=hello",
		"CAIRN_CM_mode=fast",
		"CAIRN_CPU_LIMIT_M=500",
		"CAIRN_CPU_REQUEST_M=250",
		"CAIRN_DISK_LIMIT=" + disk.String(), // no limit: the node's allocatable
		"CAIRN_GREETING=hello",
		"CAIRN_HOST_IP=" + done.Status.HostIP,
		"CAIRN_MEM_LIMIT_MI=64",
		"CAIRN_NODE=" + e.node,
		"CAIRN_NS=default",
		"CAIRN_POD=env-refs",
		"CAIRN_POD_IP=" + done.Status.PodIP,
		"CAIRN_S_token=s3cret",
		"CAIRN_TOKEN=s3cret",
		"CAIRN_UID=" + string(pod.UID),
		"CAIRN_WHERE=env-refs@" + e.node,
	}
	if done.Status.HostIP == "" || done.Status.PodIP == "" {
		t.Errorf("hostIP %q, podIP %q: want both in the status", done.Status.HostIP, done.Status.PodIP)
	}
	got := runtime.LogLines(t, e.logPath(t, done.Status.ContainerStatuses[0].ContainerID), len(want))
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("container output (-want +got):\n%s", diff)
	}
	e.wantEvents(t, pod, "echo", "Pulled", "Created", "Started")
	e.deletePod(t, pod)
}

// testConfigError wants a container whose env names a ConfigMap that is
// not there wait with CreateContainerConfigError and a message naming
// it, then the key it lacks once it is there, and start once it has it.
func (e *podEnv) testConfigError(t *testing.T) {
	ctx := context.Background()
	pod := e.createPod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "config-error", Namespace: "default"},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{
				Name: "echo", Image: e.echo, ImagePullPolicy: corev1.PullIfNotPresent,
				Env: []corev1.EnvVar{{Name: "CAIRN_LATE", ValueFrom: cmKey("late-config", "value")}},
			}},
		},
	})
	waiting := func(reason, message string) func(*corev1.Pod) bool {
		return func(p *corev1.Pod) bool {
			cs := p.Status.ContainerStatuses
			return len(cs) == 1 && cs[0].State.Waiting != nil && cs[0].State.Waiting.Reason == reason && cs[0].State.Waiting.Message == message
		}
	}
	p := waitPod(t, e.c.Client, "default", "config-error", 60*time.Second, "waiting for its ConfigMap",
		waiting("CreateContainerConfigError", `configmap "late-config" not found`))
	if p.Status.Phase != corev1.PodPending {
		t.Errorf("phase %s while the container cannot be configured, want Pending", p.Status.Phase)
	}

	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "late-config"}, Data: map[string]string{"other": "x"}}
	e.createConfigMap(t, cm)
	waitPod(t, e.c.Client, "default", "config-error", 60*time.Second, "waiting for its key",
		waiting("CreateContainerConfigError", "couldn't find key value in ConfigMap default/late-config"))

	cm.Data["value"] = "at last"
	if _, err := e.c.Client.CoreV1().ConfigMaps("default").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	fixed := time.Now()
	done := waitPod(t, e.c.Client, "default", "config-error", 60*time.Second, "Succeeded", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodSucceeded
	})
	t.Logf("container started and done %v after its ConfigMap got the key", time.Since(fixed).Round(time.Millisecond))
	if got := runtime.LogLines(t, e.logPath(t, done.Status.ContainerStatuses[0].ContainerID), 2); !slices.Contains(got, "CAIRN_LATE=at last") {
		t.Errorf("container output %q, want CAIRN_LATE=at last", got)
	}
	evs := e.wantEvents(t, pod, "echo", "Failed", "Started")
	if !slices.ContainsFunc(evs, func(ev corev1.Event) bool { return ev.Message == `Error: configmap "late-config" not found` }) {
		t.Errorf("events %v, want a Failed one saying the ConfigMap is not found", messages(evs))
	}
	e.deletePod(t, pod)
}

func (e *podEnv) testInvalidImageName(t *testing.T) {
	pod := e.createPod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "bad-image", Namespace: "default"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.example/Not_A/Reference:v1"}}},
	})
	p := waitPod(t, e.c.Client, "default", "bad-image", 60*time.Second, "InvalidImageName", func(p *corev1.Pod) bool {
		cs := p.Status.ContainerStatuses
		return len(cs) == 1 && cs[0].State.Waiting != nil && cs[0].State.Waiting.Reason == "InvalidImageName"
	})
	if msg := p.Status.ContainerStatuses[0].State.Waiting.Message; !strings.Contains(msg, "couldn't parse image name") {
		t.Errorf("waiting message %q, want it to say the name does not parse", msg)
	}
	e.wantEvents(t, pod, "c", "InspectFailed", "Failed")
	e.deletePod(t, pod)
}

// testImagePullBackOff wants an image the registry does not have to give
// ErrImagePull, then ImagePullBackOff, and another pull only after the
// backoff's 10 s.
func (e *podEnv) testImagePullBackOff(t *testing.T) {
	missing := strings.Replace(e.echo, "echoexit", "nonexistent", 1)
	pod := e.createPod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "no-image", Namespace: "default"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: missing}}},
	})
	seen := e.watchWaiting(t, pod, 60*time.Second, func(seen []waitingState) bool {
		// ErrImagePull, ImagePullBackOff, and ErrImagePull again.
		return len(seen) >= 3
	})
	got := []string{seen[0].reason, seen[1].reason, seen[2].reason}
	if diff := cmp.Diff([]string{"ErrImagePull", "ImagePullBackOff", "ErrImagePull"}, got); diff != "" {
		t.Fatalf("waiting reasons (-want +got):\n%s", diff)
	}
	if msg := seen[1].message; !strings.HasPrefix(msg, fmt.Sprintf("Back-off pulling image %q: ErrImagePull: ", missing)) || !strings.Contains(msg, "not found") {
		t.Errorf("ImagePullBackOff message %q, want the back-off and the pull's error", msg)
	}
	between := seen[2].at.Sub(seen[0].at)
	t.Logf("second pull %v after the first failed", between.Round(time.Millisecond))
	if between < pods.BackoffInitial-2*time.Second {
		t.Errorf("second pull %v after the first failed, want after the backoff of %v", between, pods.BackoffInitial)
	}
	e.wantEvents(t, pod, "c", "Pulling", "Failed", "BackOff")
	e.deletePod(t, pod)
}

// testRunContainerError wants a command the image lacks to give
// RunContainerError with the runtime's message, and the pod Failed under
// restartPolicy Never.
func (e *podEnv) testRunContainerError(t *testing.T) {
	pod := e.createPod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "no-command", Namespace: "default"},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers:    []corev1.Container{{Name: "c", Image: e.echo, ImagePullPolicy: corev1.PullIfNotPresent, Command: []string{"/no/such/binary"}}},
		},
	})
	seen := e.watchWaiting(t, pod, 60*time.Second, func(seen []waitingState) bool {
		return slices.ContainsFunc(seen, func(s waitingState) bool { return s.reason == "RunContainerError" })
	})
	i := slices.IndexFunc(seen, func(s waitingState) bool { return s.reason == "RunContainerError" })
	if msg := seen[i].message; !strings.Contains(msg, "/no/such/binary") {
		t.Errorf("RunContainerError message %q, want it to name the missing command", msg)
	}
	p := waitPod(t, e.c.Client, "default", "no-command", 60*time.Second, "Failed", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodFailed
	})
	if term := p.Status.ContainerStatuses[0].State.Terminated; term == nil || term.ExitCode == 0 {
		t.Errorf("container state %+v, want terminated with a non-zero exit code", p.Status.ContainerStatuses[0].State)
	}
	e.wantEvents(t, pod, "c", "Created", "Failed")
	e.deletePod(t, pod)
}

// testCrashLoopBackOff wants a container that keeps failing to wait in
// CrashLoopBackOff with a message saying how long, told by one BackOff
// event per exit.
func (e *podEnv) testCrashLoopBackOff(t *testing.T) {
	grace := int64(1)
	pod := e.createPod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "crash-loop", Namespace: "default"},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name: "c", Image: e.echo, ImagePullPolicy: corev1.PullIfNotPresent, Env: []corev1.EnvVar{{Name: "EXIT_CODE", Value: "3"}},
			}},
		},
	})
	seen := e.watchWaiting(t, pod, 60*time.Second, func(seen []waitingState) bool {
		return slices.ContainsFunc(seen, func(s waitingState) bool { return s.reason == pods.ReasonCrashLoopBackOff })
	})
	if msg := seen[len(seen)-1].message; msg != "back-off 10s restarting failed container c of pod default/crash-loop" {
		t.Errorf("CrashLoopBackOff message %q, want the back-off of 10s", msg)
	}
	// Several syncs while it backs off, one event.
	e.waitWakeups(t, wakeResync, 2)
	evs := e.wantEvents(t, pod, "c", "BackOff")
	for _, ev := range evs {
		if ev.Reason == "BackOff" && ev.Count != 1 {
			t.Errorf("BackOff event %q counted %d times, want once for the one exit", ev.Message, ev.Count)
		}
	}
	e.deletePod(t, pod)
}

// testPullSecrets wants an image of a registry that requires a password
// pulled with the pod's imagePullSecrets — the first matching credential
// that works, after a more specific one that does not — and not without.
func (e *podEnv) testPullSecrets(t *testing.T) {
	priv := registry.Start(t, registry.WithBasicAuth("cairn", "pull-me"))
	if err := e.rt.AllowHTTP(priv.Addr); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := registry.BuildAndPush(ctx, priv, "./test/images/hello", "cairn-test/private-hello:v1"); err != nil {
		t.Fatal(err)
	}
	image := priv.Addr + "/cairn-test/private-hello:v1"
	dockerConfig := func(name, key, user, password string) *corev1.Secret {
		cfg, err := json.Marshal(map[string]any{"auths": map[string]any{
			key: map[string]string{"auth": base64.StdEncoding.EncodeToString([]byte(user + ":" + password))},
		}})
		if err != nil {
			t.Fatal(err)
		}
		return &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Type:       corev1.SecretTypeDockerConfigJson,
			Data:       map[string][]byte{corev1.DockerConfigJsonKey: cfg},
		}
	}
	e.createSecret(t, dockerConfig("stale-cred", priv.Addr+"/cairn-test", "cairn", "old-password"))
	e.createSecret(t, dockerConfig("regcred", "http://"+priv.Addr, "cairn", "pull-me"))

	grace := int64(1)
	spec := corev1.PodSpec{
		TerminationGracePeriodSeconds: &grace,
		Containers:                    []corev1.Container{{Name: "hello", Image: image, ImagePullPolicy: corev1.PullIfNotPresent}},
	}
	without := e.createPod(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "no-secret", Namespace: "default"}, Spec: spec})
	p := waitPod(t, e.c.Client, "default", "no-secret", 60*time.Second, "ErrImagePull", func(p *corev1.Pod) bool {
		cs := p.Status.ContainerStatuses
		return len(cs) == 1 && cs[0].State.Waiting != nil && cs[0].State.Waiting.Reason == "ErrImagePull"
	})
	t.Logf("without the secret: %s", p.Status.ContainerStatuses[0].State.Waiting.Message)
	e.deletePod(t, without)

	spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "stale-cred"}, {Name: "regcred"}}
	with := e.createPod(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "with-secret", Namespace: "default"}, Spec: spec})
	waitPod(t, e.c.Client, "default", "with-secret", 60*time.Second, "Running", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodRunning
	})
	e.deletePod(t, with)
	evs := e.wantEvents(t, with, "hello", "Pulling", "Pulled", "Created", "Started", "Killing")
	if !slices.ContainsFunc(evs, func(ev corev1.Event) bool {
		return ev.Reason == "Pulled" && strings.HasPrefix(ev.Message, fmt.Sprintf("Successfully pulled image %q", image))
	}) {
		t.Errorf("events %v, want one saying the image was pulled", messages(evs))
	}
}

// waitingState is a waiting reason the Pod's status showed, when.
type waitingState struct {
	reason, message string
	at              time.Time
}

// watchWaiting watches pod's first container's waiting states from its
// creation until done accepts the changes seen so far, and returns them.
func (e *podEnv) watchWaiting(t *testing.T, pod *corev1.Pod, timeout time.Duration, done func([]waitingState) bool) []waitingState {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	w, err := e.c.Client.CoreV1().Pods(pod.Namespace).Watch(ctx, metav1.ListOptions{
		FieldSelector:   fields.OneTermEqualSelector("metadata.name", pod.Name).String(),
		ResourceVersion: pod.ResourceVersion,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	var seen []waitingState
	for ev := range w.ResultChan() {
		p, ok := ev.Object.(*corev1.Pod)
		if !ok || ev.Type == watch.Deleted || len(p.Status.ContainerStatuses) == 0 {
			continue
		}
		wt := p.Status.ContainerStatuses[0].State.Waiting
		if wt == nil || wt.Reason == pods.ReasonContainerCreating {
			continue
		}
		if n := len(seen); n == 0 || seen[n-1].reason != wt.Reason {
			seen = append(seen, waitingState{wt.Reason, wt.Message, time.Now()})
			if done(seen) {
				return seen
			}
		}
	}
	t.Fatalf("pod %s: waiting reasons %v within %v, not what was wanted", pod.Name, seen, timeout)
	return nil
}

// wantEvents waits for the kubelet's events about the container of pod
// to include each of reasons, and returns them all.
func (e *podEnv) wantEvents(t *testing.T, pod *corev1.Pod, container string, reasons ...string) []corev1.Event {
	t.Helper()
	var evs []corev1.Event
	poll.Until(t, 30*time.Second, "events "+strings.Join(reasons, ", "), func() error {
		list, err := e.c.Client.CoreV1().Events(pod.Namespace).List(context.Background(), metav1.ListOptions{
			FieldSelector: fields.Set{"involvedObject.uid": string(pod.UID)}.String(),
		})
		if err != nil {
			return err
		}
		evs = list.Items
		for _, r := range reasons {
			if !slices.ContainsFunc(evs, func(ev corev1.Event) bool { return ev.Reason == r }) {
				return fmt.Errorf("no %s among %v", r, messages(evs))
			}
		}
		return nil
	})
	for _, ev := range evs {
		if ev.Source.Component != "kubelet" || ev.Source.Host != e.node {
			t.Errorf("event %s from %+v, want component kubelet on host %s", ev.Reason, ev.Source, e.node)
		}
		if slices.Contains(reasons, ev.Reason) && ev.InvolvedObject.FieldPath != "spec.containers{"+container+"}" {
			t.Errorf("event %s about %q, want spec.containers{%s}", ev.Reason, ev.InvolvedObject.FieldPath, container)
		}
	}
	return evs
}

func messages(evs []corev1.Event) []string {
	var out []string
	for _, ev := range evs {
		out = append(out, ev.Type+" "+ev.Reason+": "+ev.Message)
	}
	return out
}
