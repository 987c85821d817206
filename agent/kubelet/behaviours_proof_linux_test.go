package kubelet

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/cairn-os/cairn/agent/kubelet/pods"
	"github.com/cairn-os/cairn/test/poll"
)

// TestPodBehaviours proves, on a node of a real control plane running its
// pods on a real containerd, behaviours of the kubelet that the upstream
// conformance suite checks: runAsNonRoot refusals with their Event,
// downwardAPI volume items with resourceFieldRef, and an httpGet probe
// redirected to another host, which succeeds with a ProbeWarning.
func TestPodBehaviours(t *testing.T) {
	e, cfg := newPodEnv(t, "behave-1")
	start(t, cfg)
	e.testNodeReady(t)

	t.Run("runAsNonRoot refused for root, with a Failed event", e.testRunAsNonRoot)
	t.Run("downwardAPI volume with resourceFieldRef", func(t *testing.T) { e.testResourceFieldVolume(t, filepath.Join(cfg.Dir, "pods")) })
	t.Run("httpGet probe redirected to another host succeeds with a ProbeWarning", e.testProbeRedirect)
	t.Run("ephemeral containers run once, one in its target's process namespace", e.testEphemeral)
	t.Run("readiness probes run on while the pod terminates", e.testReadyWhileTerminating)
}

// testReadyWhileTerminating runs two containers: "server" serves HTTP and
// ends on SIGTERM, "client" ignores SIGTERM and has a readiness probe on
// server's port. Once the pod is Ready it is deleted with a grace period
// of 10 s, and, before it is gone, the API must show it terminating with
// client running but not ready — its readiness probe ran on and failed —
// server stopped and not ready, and the pod not Ready.
func (e *podEnv) testReadyWhileTerminating(t *testing.T) {
	grace := int64(10)
	pod := e.createPod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "terminating", Namespace: "default"},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name: "server", Image: e.probee, ImagePullPolicy: corev1.PullIfNotPresent,
				Env: []corev1.EnvVar{{Name: "LISTEN", Value: ":8080"}},
			}, {
				Name: "client", Image: e.probee, ImagePullPolicy: corev1.PullIfNotPresent,
				Env: []corev1.EnvVar{{Name: "IGNORE_TERM", Value: "1"}},
				ReadinessProbe: &corev1.Probe{PeriodSeconds: 1, FailureThreshold: 1, ProbeHandler: corev1.ProbeHandler{
					HTTPGet: &corev1.HTTPGetAction{Port: intstr.FromInt(8080), Path: "/"}}},
			}},
		},
	})
	waitPod(t, e.c.Client, "default", pod.Name, 60*time.Second, "Ready", func(p *corev1.Pod) bool {
		return podCondition(p, corev1.PodReady) == corev1.ConditionTrue
	})
	h := e.record(t, pod)
	deleted := time.Now()
	if err := e.c.Client.CoreV1().Pods("default").Delete(context.Background(), pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	vs := h.until(t, time.Duration(grace)*time.Second, "terminating, client running unready, server stopped", func(vs []observed) error {
		p := vs[len(vs)-1].pod
		client, server := containerStatusOf(p, "client"), containerStatusOf(p, "server")
		switch {
		case p.DeletionTimestamp == nil:
			return fmt.Errorf("no deletionTimestamp yet")
		case client.State.Running == nil || client.Ready:
			return fmt.Errorf("client %+v, want running, not ready", client.State)
		case server.State.Terminated == nil || server.Ready:
			return fmt.Errorf("server %+v, ready %v, want terminated, not ready", server.State, server.Ready)
		case podCondition(p, corev1.PodReady) != corev1.ConditionFalse:
			return fmt.Errorf("Ready %s, want False", podCondition(p, corev1.PodReady))
		}
		return nil
	})
	t.Logf("not ready %v after Delete, in version %s", vs[len(vs)-1].at.Sub(deleted).Round(time.Millisecond), vs[len(vs)-1].pod.ResourceVersion)
	poll.Until(t, 30*time.Second, "Pod object gone", func() error {
		_, err := e.c.Client.CoreV1().Pods("default").Get(context.Background(), pod.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there (err %v)", err)
	})
	e.wantNoSandboxes(t, string(pod.UID))
}

// testEphemeral adds, through the ephemeralcontainers subresource as
// kubectl debug does, two ephemeral containers to a running pod whose app
// creates /marker: each checks whether /proc/1/root/marker
// exists, which it does only where PID 1 is the app's process. It wants
// the one whose targetContainerName is the app to complete (exit 0), the
// other to fail (exit 1), neither restarted, their status in
// ephemeralContainerStatuses, and the app running on untouched.
func (e *podEnv) testEphemeral(t *testing.T) {
	grace := int64(1)
	pod := e.createPod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "debugged", Namespace: "default"},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{Name: "app", Image: e.probee, ImagePullPolicy: corev1.PullIfNotPresent,
				Env: []corev1.EnvVar{{Name: "TOUCH_FILE", Value: "/marker"}, {Name: "TOUCH_AFTER", Value: "0"}}}},
		},
	})
	p := waitPod(t, e.c.Client, "default", pod.Name, 60*time.Second, "Running", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodRunning
	})
	app := containerStatusOf(p, "app").ContainerID
	check := func(name, target string) corev1.EphemeralContainer {
		return corev1.EphemeralContainer{TargetContainerName: target, EphemeralContainerCommon: corev1.EphemeralContainerCommon{
			Name: name, Image: e.probee, ImagePullPolicy: corev1.PullIfNotPresent,
			Command: []string{"/usr/bin/probee", "check", "/proc/1/root/marker"}}}
	}
	p.Spec.EphemeralContainers = []corev1.EphemeralContainer{check("debug-target", "app"), check("debug-alone", "")}
	if _, err := e.c.Client.CoreV1().Pods("default").UpdateEphemeralContainers(context.Background(), pod.Name, p, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("add ephemeral containers: %v", err)
	}
	p = waitPod(t, e.c.Client, "default", pod.Name, 60*time.Second, "with its ephemeral containers ended", func(p *corev1.Pod) bool {
		ended := 0
		for _, cs := range p.Status.EphemeralContainerStatuses {
			if cs.State.Terminated != nil {
				ended++
			}
		}
		return ended == 2
	})
	for name, code := range map[string]int32{"debug-target": 0, "debug-alone": 1} {
		var cs *corev1.ContainerStatus
		for i := range p.Status.EphemeralContainerStatuses {
			if p.Status.EphemeralContainerStatuses[i].Name == name {
				cs = &p.Status.EphemeralContainerStatuses[i]
			}
		}
		if cs == nil || cs.ContainerID == "" {
			t.Errorf("%s: %+v, want it made", name, cs)
			continue
		}
		if cs.State.Terminated.ExitCode != code || cs.RestartCount != 0 {
			t.Errorf("%s: %+v, want terminated with exit code %d, not restarted; it printed %q", name, cs, code,
				lineTexts(logEntries(t, e.logPath(t, cs.ContainerID))))
		}
	}
	if cs := containerStatusOf(p, "app"); cs.ContainerID != app || cs.State.Running == nil || p.Status.Phase != corev1.PodRunning {
		t.Errorf("app %+v in a pod %s, want %s running on", cs, p.Status.Phase, app)
	}
	e.deletePod(t, pod)
}

// testRunAsNonRoot runs, with runAsNonRoot, containers whose image runs
// as root, whose runAsUser is 0 and whose image names a user, and wants
// each waiting with CreateContainerConfigError and the kubelet's message,
// told by a Failed event, and never made; beside them, one with
// runAsUser 1000 runs.
func (e *podEnv) testRunAsNonRoot(t *testing.T) {
	named := e.imageWithUser(t, "nobody", "cairn-test/probee-nobody:v1")
	yes, root, user := true, int64(0), int64(1000)
	grace := int64(1)
	c := func(name, image string, uid *int64) corev1.Container {
		return corev1.Container{Name: name, Image: image, ImagePullPolicy: corev1.PullIfNotPresent,
			SecurityContext: &corev1.SecurityContext{RunAsUser: uid}}
	}
	pod := e.createPod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "nonroot", Namespace: "default"},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: &grace,
			SecurityContext:               &corev1.PodSecurityContext{RunAsNonRoot: &yes},
			Containers: []corev1.Container{
				c("root-image", e.probee, nil), c("root-uid", e.probee, &root), c("named-user", named, nil), c("non-root", e.probee, &user),
			},
		},
	})
	who := func(name string) string {
		return fmt.Sprintf("(pod: %q, container: %s)", fmt.Sprintf("nonroot_default(%s)", pod.UID), name)
	}
	want := map[string]string{
		"root-image": "container has runAsNonRoot and image will run as root " + who("root-image"),
		"root-uid":   "container's runAsUser breaks non-root policy " + who("root-uid"),
		"named-user": "container has runAsNonRoot and image has non-numeric user (nobody), cannot verify user is non-root " + who("named-user"),
	}
	p := waitPod(t, e.c.Client, "default", pod.Name, 60*time.Second, "with non-root running and the others refused", func(p *corev1.Pod) bool {
		refused := 0
		for name := range want {
			if cs := containerStatusOf(p, name); cs != nil && cs.State.Waiting != nil && cs.State.Waiting.Reason == pods.ErrCreateContainerConfig.Error() {
				refused++
			}
		}
		cs := containerStatusOf(p, "non-root")
		return refused == len(want) && cs != nil && cs.State.Running != nil
	})
	for name, msg := range want {
		cs := containerStatusOf(p, name)
		if cs.State.Waiting.Message != msg || cs.ContainerID != "" {
			t.Errorf("%s: waiting %q, container %q; want %q and no container", name, cs.State.Waiting.Message, cs.ContainerID, msg)
		}
		e.containerEvents(t, pod, name, "Failed", func(m string) bool { return m == "Error: "+msg })
	}
	e.deletePod(t, pod)
}

// imageWithUser pushes to the test's registry, as repo (such as
// cairn-test/x:v1), the probee image with its config's user set to user,
// and returns its reference.
func (e *podEnv) imageWithUser(t *testing.T, user, repo string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	src, err := name.ParseReference(e.probee, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	img, err := remote.Image(src, remote.WithContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.Config.User = user
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	image := e.reg.Addr + "/" + repo
	dst, err := name.ParseReference(image, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(dst, img, remote.WithContext(ctx)); err != nil {
		t.Fatal(err)
	}
	return image
}

// testResourceFieldVolume runs a container whose downwardAPI volume shows
// its memory limit in MiB, its CPU request in millicores and, for a
// container without limits, the node's allocatable memory; a readiness
// probe sees the files inside the container, and the node wrote what the
// API asks for.
func (e *podEnv) testResourceFieldVolume(t *testing.T, root string) {
	grace := int64(1)
	item := func(path, container, res, divisor string) corev1.DownwardAPIVolumeFile {
		return corev1.DownwardAPIVolumeFile{Path: path, ResourceFieldRef: &corev1.ResourceFieldSelector{
			ContainerName: container, Resource: res, Divisor: resource.MustParse(divisor)}}
	}
	pod := e.createPod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "podinfo", Namespace: "default"},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: &grace,
			Volumes: []corev1.Volume{{Name: "podinfo", VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{
				Items: []corev1.DownwardAPIVolumeFile{
					item("memory_limit", "app", "limits.memory", "1Mi"),
					item("cpu_request", "app", "requests.cpu", "1m"),
					item("other_memory_limit", "other", "limits.memory", "1"),
				}}}}},
			Containers: []corev1.Container{{
				Name: "app", Image: e.probee, ImagePullPolicy: corev1.PullIfNotPresent,
				Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("250m"), corev1.ResourceMemory: resource.MustParse("32Mi")},
					Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")},
				},
				VolumeMounts: []corev1.VolumeMount{{Name: "podinfo", MountPath: "/etc/podinfo"}},
				ReadinessProbe: &corev1.Probe{PeriodSeconds: 1, ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{
					Command: []string{"/usr/bin/probee", "check", "/etc/podinfo/other_memory_limit"}}}},
			}, {Name: "other", Image: e.probee, ImagePullPolicy: corev1.PullIfNotPresent}},
		},
	})
	waitPod(t, e.c.Client, "default", pod.Name, 60*time.Second, "Ready", func(p *corev1.Pod) bool {
		return podCondition(p, corev1.PodReady) == corev1.ConditionTrue
	})
	node, err := e.c.Client.CoreV1().Nodes().Get(context.Background(), e.node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	allocatable := node.Status.Allocatable[corev1.ResourceMemory]
	dir := filepath.Join(root, string(pod.UID), "volumes", "kubernetes.io~downward-api", "podinfo")
	for file, want := range map[string]string{
		"memory_limit":       "64",
		"cpu_request":        "250",
		"other_memory_limit": strconv.FormatInt(allocatable.Value(), 10),
	} {
		data, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil {
			t.Errorf("read %s: %v", file, err)
			continue
		}
		if string(data) != want {
			t.Errorf("podinfo/%s = %q, want %q", file, data, want)
		}
	}
	if allocatable.IsZero() {
		t.Errorf("the Node has no allocatable memory: %+v", node.Status.Allocatable)
	}
	e.deletePod(t, pod)
}

// testProbeRedirect gives a container an httpGet liveness probe, with a
// failure threshold of 1, on a server of the test's (on the host, as the
// probe's host says) that redirects to another host, localhost. It wants
// the redirect not followed, the probe a success — the container is not
// restarted however often it is probed — and a ProbeWarning event that
// quotes the response's body, as the kubelet's.
func (e *podEnv) testProbeRedirect(t *testing.T) {
	var otherHits, probes atomic.Int32
	other := serveHTTP(t, func(w http.ResponseWriter, r *http.Request) {
		otherHits.Add(1)
		w.WriteHeader(http.StatusInternalServerError)
	})
	otherURL := "http://localhost:" + strconv.Itoa(other) + "/"
	port := serveHTTP(t, func(w http.ResponseWriter, r *http.Request) {
		probes.Add(1)
		http.Redirect(w, r, otherURL, http.StatusFound)
	})
	grace := int64(1)
	pod := e.createPod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "redirect", Namespace: "default"},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name: "app", Image: e.probee, ImagePullPolicy: corev1.PullIfNotPresent,
				LivenessProbe: &corev1.Probe{PeriodSeconds: 1, FailureThreshold: 1, ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
					Host: "127.0.0.1", Port: intstr.FromInt(port), Path: "/redirect"}}},
			}},
		},
	})
	poll.Until(t, 60*time.Second, "five probes", func() error {
		if n := probes.Load(); n < 5 {
			return fmt.Errorf("%d so far", n)
		}
		return nil
	})
	p, err := e.c.Client.CoreV1().Pods("default").Get(context.Background(), pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if cs := containerStatusOf(p, "app"); cs == nil || cs.RestartCount != 0 || cs.State.Running == nil {
		t.Errorf("app after %d probes: %+v, want running, never restarted", probes.Load(), cs)
	}
	if n := otherHits.Load(); n != 0 {
		t.Errorf("the other host got %d requests, want none", n)
	}
	want := `Liveness probe warning: Probe terminated redirects, Response body: <a href="` + otherURL + `">Found</a>.`
	e.containerEvents(t, pod, "app", "ProbeWarning", func(m string) bool { return strings.HasPrefix(m, want) })
	e.deletePod(t, pod)
}

// serveHTTP serves h on 127.0.0.1 until the test ends and returns its
// port.
func serveHTTP(t *testing.T, h http.HandlerFunc) int {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(lis)
	t.Cleanup(func() { srv.Close() })
	return lis.Addr().(*net.TCPAddr).Port
}
