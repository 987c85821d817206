package kubelet

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cairn-os/cairn/agent/kubelet/pods"
	"github.com/cairn-os/cairn/test/poll"
	"github.com/cairn-os/cairn/test/registry"
	"github.com/cairn-os/cairn/test/runtime"
)

// testClock is the real time moved on by what the test says.
type testClock struct{ ahead atomic.Int64 }

func (c *testClock) now() time.Time          { return time.Now().Add(time.Duration(c.ahead.Load())) }
func (c *testClock) advance(d time.Duration) { c.ahead.Add(int64(d)) }

// volumeEnv is a podEnv whose node sets up volumes on a clock the test
// moves, with the saread image.
type volumeEnv struct {
	*podEnv
	root   string // of the node's volumes
	clock  *testClock
	saread string // image reference
}

// TestPodVolumes runs ordinary Pods, with the kube-api-access volume the
// API server adds, on a node of the real control plane with a real
// containerd.
func TestPodVolumes(t *testing.T) {
	pe, cfg := newPodEnv(t, "volumes-1")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := registry.BuildAndPush(ctx, pe.reg, "./agent/kubelet/testdata/saread", "cairn-test/saread:v1"); err != nil {
		t.Fatal(err)
	}
	e := &volumeEnv{podEnv: pe, clock: &testClock{}, root: filepath.Join(cfg.Dir, "pods"), saread: pe.reg.Addr + "/cairn-test/saread:v1"}
	cfg.Pods.volumeClock = e.clock.now
	start(t, cfg)

	t.Run("kube-api-access", func(t *testing.T) { e.testAPIAccess(t) })
	t.Run("unsupported volume", func(t *testing.T) { e.testUnsupported(t) })
}

// createPod creates pod in default on the node, retrying while the
// default ServiceAccount is not yet made; its token is mounted.
func (e *volumeEnv) createPod(t *testing.T, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	pod.Namespace, pod.Spec.NodeName = "default", e.node
	grace := int64(1)
	pod.Spec.TerminationGracePeriodSeconds = &grace
	var got *corev1.Pod
	poll.Until(t, 30*time.Second, "create Pod "+pod.Name, func() (err error) {
		got, err = e.c.Client.CoreV1().Pods(pod.Namespace).Create(context.Background(), pod, metav1.CreateOptions{})
		return err
	})
	return got
}

// testAPIAccess runs a container that reads its service-account files:
// the namespace, the cluster CA and a token of the default service
// account bound to the pod, mounted read-only; the token is renewed a day
// later, and the volume goes with the pod.
func (e *volumeEnv) testAPIAccess(t *testing.T) {
	pod := e.createPod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "saread"},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{
				Name: "saread", Image: e.saread, ImagePullPolicy: corev1.PullIfNotPresent,
				Env: []corev1.EnvVar{{Name: "WRITE_DIRS", Value: "/extra /scratch"}},
				VolumeMounts: []corev1.VolumeMount{
					{Name: "extra", MountPath: "/extra"}, // read-only all the same
					{Name: "scratch", MountPath: "/scratch"},
				},
			}},
			Volumes: []corev1.Volume{
				{Name: "extra", VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{Items: []corev1.DownwardAPIVolumeFile{
					{Path: "name", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}},
				}}}},
				{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
			},
		},
	})
	access := ""
	for _, v := range pod.Spec.Volumes {
		if strings.HasPrefix(v.Name, "kube-api-access-") {
			access = v.Name
		}
	}
	if access == "" {
		t.Fatalf("the API server added no kube-api-access volume: %+v", pod.Spec.Volumes)
	}
	running := waitPod(t, e.c.Client, "default", pod.Name, 60*time.Second, "Running", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodRunning
	})
	logPath := e.logPath(t, running.Status.ContainerStatuses[0].ContainerID)
	tokenPath := filepath.Join(e.root, string(pod.UID), "volumes", "kubernetes.io~projected", access, "token")
	token := e.hostToken(t, tokenPath)
	e.review(t, token, pod)

	block, _ := pem.Decode(e.c.CAPEM)
	ca, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"namespace=default",
		"ca=" + ca.Subject.String(),
		"sub=system:serviceaccount:default:default pod=saread",
		fmt.Sprintf("token-sha256=%x", sha256.Sum256([]byte(token))),
		"write /var/run/secrets/kubernetes.io/serviceaccount=read-only",
		"write /extra=read-only",
		"write /scratch=writable",
	}
	if got := runtime.LogLines(t, logPath, len(want)); !slices.Equal(got, want) {
		t.Errorf("container log = %q, want %q", got, want)
	}

	// The token the API server issues for a year is renewed a day after
	// issue: the container reads the new one through its mount.
	e.clock.advance(25 * time.Hour)
	var renewed string
	poll.Until(t, 30*time.Second, "token renewed", func() error {
		if renewed = e.hostToken(t, tokenPath); renewed == token {
			return fmt.Errorf("token in %s unchanged", tokenPath)
		}
		return nil
	})
	e.review(t, renewed, pod)
	seen := fmt.Sprintf("token-sha256=%x", sha256.Sum256([]byte(renewed)))
	if got := runtime.LogLines(t, logPath, len(want)+1); !slices.Contains(got, seen) {
		t.Errorf("container log = %q, want the renewed token's %s", got, seen)
	}

	e.deletePod(t, pod)
	if _, err := os.Stat(filepath.Join(e.root, string(pod.UID))); !os.IsNotExist(err) {
		t.Errorf("pod's volume directory after its deletion: %v, want it gone", err)
	}
}

func (e *volumeEnv) hostToken(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// review checks with a TokenReview, as the admin, that token is the
// default service account's, bound to pod.
func (e *volumeEnv) review(t *testing.T, token string, pod *corev1.Pod) {
	t.Helper()
	got, err := e.c.Client.AuthenticationV1().TokenReviews().Create(context.Background(),
		&authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st := got.Status
	if !st.Authenticated || st.User.Username != "system:serviceaccount:default:default" {
		t.Fatalf("TokenReview: authenticated %v as %q (%s), want system:serviceaccount:default:default", st.Authenticated, st.User.Username, st.Error)
	}
	if uid := st.User.Extra["authentication.kubernetes.io/pod-uid"]; len(uid) != 1 || uid[0] != string(pod.UID) {
		t.Errorf("token bound to pod UID %v, want %s", uid, pod.UID)
	}
}

// testUnsupported wants a pod with a volume of a type the node cannot
// set up yet to wait with the kubelet's reason and a message naming it.
func (e *volumeEnv) testUnsupported(t *testing.T) {
	pod := e.createPod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "nfs"},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{
				Name: "saread", Image: e.saread, ImagePullPolicy: corev1.PullIfNotPresent,
				VolumeMounts: []corev1.VolumeMount{{Name: "nfs", MountPath: "/nfs"}},
			}},
			Volumes: []corev1.Volume{{Name: "nfs", VolumeSource: corev1.VolumeSource{NFS: &corev1.NFSVolumeSource{Server: "nfs.example", Path: "/"}}}},
		},
	})
	const msg = `MountVolume.SetUp failed for volume "nfs" : type nfs not supported yet`
	p := waitPod(t, e.c.Client, "default", pod.Name, 60*time.Second, "waiting for its volume", func(p *corev1.Pod) bool {
		cs := p.Status.ContainerStatuses
		return len(cs) == 1 && cs[0].State.Waiting != nil && cs[0].State.Waiting.Reason == pods.ErrCreateContainerConfig.Error()
	})
	if w := p.Status.ContainerStatuses[0].State.Waiting; !strings.Contains(w.Message, msg) {
		t.Errorf("waiting message %q, want it to contain %q", w.Message, msg)
	}
	if p.Status.Phase != corev1.PodPending {
		t.Errorf("phase %s, want Pending", p.Status.Phase)
	}
	e.deletePod(t, pod)
}
