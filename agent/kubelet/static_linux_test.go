package kubelet

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"
	"sigs.k8s.io/yaml"

	"github.com/cairn-os/cairn/agent/kubelet/pods"
	"github.com/cairn-os/cairn/agent/node"
	"github.com/cairn-os/cairn/test/poll"
)

// startStatic starts the pod loop of cfg as cairn-agent does, from the
// start, and the node's membership beside it, which hands it the API's
// pods once it joined; until the test ends or stop.
func startStatic(t *testing.T, cfg testNode) *agent {
	t.Helper()
	cfg.NodeName = cfg.join.NodeName
	k, err := New(cfg.Config)
	if err != nil {
		t.Fatalf("New() = %v", err)
	}
	join := cfg.join
	join.RuntimeInfo, join.RuntimeStatus = cfg.RuntimeInfo, cfg.RuntimeStatus
	join.Dir, join.Log, join.Metrics = cfg.Dir, cfg.Log, cfg.Metrics
	ctx, cancel := context.WithCancel(context.Background())
	a := &agent{cancel: cancel, done: make(chan struct{}), k: k}
	var wg sync.WaitGroup
	wg.Go(func() { k.Run(ctx) })
	wg.Go(func() {
		if err := node.Run(ctx, join, []node.Component{{Name: "kubelet", Run: k.Join}}); err != nil {
			t.Errorf("node.Run() = %v", err)
		}
	})
	go func() {
		wg.Wait()
		close(a.done)
	}()
	t.Cleanup(a.stop)
	return a
}

// writeManifest writes pod as dir/file the way init does: whole, by a
// rename.
func writeManifest(t *testing.T, dir, file string, pod *corev1.Pod) {
	t.Helper()
	data, err := yaml.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(dir, ".tmp-"+file)
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, file)); err != nil {
		t.Fatal(err)
	}
}

// staticContainer waits until the runtime runs one container of the
// static pod named name, and returns it with its pod's sandbox.
func (e *podEnv) staticContainer(t *testing.T, name, image string, timeout time.Duration) (*criv1.Container, *criv1.PodSandbox) {
	t.Helper()
	var ctr *criv1.Container
	var sb *criv1.PodSandbox
	poll.Until(t, timeout, "static pod "+name+" running "+image, func() error {
		ctx := context.Background()
		ctrs, err := e.rt.RuntimeClient.ListContainers(ctx, &criv1.ListContainersRequest{Filter: &criv1.ContainerFilter{
			LabelSelector: map[string]string{pods.LabelPodName: name},
			State:         &criv1.ContainerStateValue{State: criv1.ContainerState_CONTAINER_RUNNING},
		}})
		if err != nil {
			return err
		}
		if len(ctrs.Containers) != 1 {
			return fmt.Errorf("%d running containers", len(ctrs.Containers))
		}
		if got := ctrs.Containers[0].GetImage().GetUserSpecifiedImage(); got != image {
			return fmt.Errorf("running image %q", got)
		}
		sbs, err := e.rt.RuntimeClient.ListPodSandbox(ctx, &criv1.ListPodSandboxRequest{Filter: &criv1.PodSandboxFilter{
			Id: ctrs.Containers[0].PodSandboxId}})
		if err != nil {
			return err
		}
		if len(sbs.Items) != 1 {
			return fmt.Errorf("%d sandboxes of container %s", len(sbs.Items), ctrs.Containers[0].Id)
		}
		ctr, sb = ctrs.Containers[0], sbs.Items[0]
		return nil
	})
	return ctr, sb
}

// mirror waits until the API holds the mirror Pod of the static pod
// name with hash, with ok's conditions.
func (e *podEnv) mirror(t *testing.T, name, hash string, timeout time.Duration, what string, ok func(*corev1.Pod) error) *corev1.Pod {
	t.Helper()
	var got *corev1.Pod
	poll.Until(t, timeout, "mirror pod "+name+" "+what, func() error {
		p, err := e.c.Client.CoreV1().Pods("default").Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Annotations[configMirrorAnnotation] != hash {
			return fmt.Errorf("mirror of hash %q, want %q", p.Annotations[configMirrorAnnotation], hash)
		}
		if p.DeletionTimestamp != nil {
			return fmt.Errorf("being deleted")
		}
		if err := ok(p); err != nil {
			return err
		}
		got = p
		return nil
	})
	return got
}

// TestStaticPods runs a static pod with no API server, from the node's
// start: its mirror Pod appears once the API server is there, with the
// pod's status, owned by the Node; a mirror deleted through the API is
// made again while the container runs on; a changed image replaces the
// pod, mirror and all; a removed manifest stops the pod and deletes its
// mirror.
func TestStaticPods(t *testing.T) {
	e, cfg := newPodEnv(t, "static-1")
	dir := filepath.Join(t.TempDir(), "static-pods")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	cfg.StaticPodDir = dir
	grace := int64(1)
	manifest := &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: "web", Labels: map[string]string{"app": "web"}},
		Spec: corev1.PodSpec{
			HostNetwork:                   true, // no pod network before the node joined
			TerminationGracePeriodSeconds: &grace,
			Containers:                    []corev1.Container{{Name: "web", Image: e.hello, ImagePullPolicy: corev1.PullIfNotPresent}},
		},
	}
	writeManifest(t, dir, "web.yaml", manifest)
	const name = "web-static-1"

	t.Log("phase: the static pod runs with no API server")
	e.c.StopAPIServer()
	startStatic(t, cfg)
	ctr, sb := e.staticContainer(t, name, e.hello, 60*time.Second)
	uid := sb.GetMetadata().GetUid()
	if sb.GetMetadata().GetNamespace() != "default" {
		t.Errorf("static pod's sandbox in namespace %q, want default", sb.GetMetadata().GetNamespace())
	}

	t.Log("phase: its mirror pod appears once the API server is there")
	e.c.StartAPIServer()
	mirror := e.mirror(t, name, uid, 90*time.Second, "Running", func(p *corev1.Pod) error {
		if p.Status.Phase != corev1.PodRunning || len(p.Status.ContainerStatuses) != 1 {
			return fmt.Errorf("phase %s, %d container statuses", p.Status.Phase, len(p.Status.ContainerStatuses))
		}
		if got, want := p.Status.ContainerStatuses[0].ContainerID, "containerd://"+ctr.Id; got != want {
			return fmt.Errorf("container %s, want %s", got, want)
		}
		return nil
	})
	if mirror.Spec.NodeName != "static-1" || mirror.Labels["app"] != "web" || mirror.Annotations[configSourceAnnotation] != fileSource ||
		mirror.Annotations[configSeenAnnotation] == "" {
		t.Errorf("mirror pod on node %q, labels %v, annotations %v: want static-1, app=web, config.source file and config.seen",
			mirror.Spec.NodeName, mirror.Labels, mirror.Annotations)
	}
	n, err := e.c.Client.CoreV1().Nodes().Get(context.Background(), "static-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if refs := mirror.OwnerReferences; len(refs) != 1 || refs[0].Kind != "Node" || refs[0].UID != n.UID {
		t.Errorf("mirror pod owned by %+v, want the Node %s", refs, n.UID)
	}

	t.Log("phase: a mirror pod deleted through the API is made again; the container runs on")
	if err := e.c.Client.CoreV1().Pods("default").Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	again := e.mirror(t, name, uid, 60*time.Second, "made again", func(p *corev1.Pod) error {
		if p.UID == mirror.UID {
			return fmt.Errorf("still the deleted mirror %s", p.UID)
		}
		if p.Status.Phase != corev1.PodRunning {
			return fmt.Errorf("phase %s", p.Status.Phase)
		}
		return nil
	})
	if c, _ := e.staticContainer(t, name, e.hello, 10*time.Second); c.Id != ctr.Id {
		t.Errorf("container %s after the mirror's deletion, want %s running on", c.Id, ctr.Id)
	}

	t.Log("phase: a changed image replaces the pod and its mirror")
	manifest.Spec.Containers[0].Image = e.probee
	writeManifest(t, dir, "web.yaml", manifest)
	ctr2, sb2 := e.staticContainer(t, name, e.probee, 60*time.Second)
	uid2 := sb2.GetMetadata().GetUid()
	if uid2 == uid {
		t.Fatalf("the changed manifest's pod has UID %s, the old one's", uid)
	}
	e.wantNoSandboxes(t, uid)
	e.mirror(t, name, uid2, 60*time.Second, "of the new pod, Running", func(p *corev1.Pod) error {
		if p.UID == again.UID {
			return fmt.Errorf("still the old mirror %s", p.UID)
		}
		if len(p.Status.ContainerStatuses) != 1 || p.Status.ContainerStatuses[0].ContainerID != "containerd://"+ctr2.Id {
			return fmt.Errorf("container statuses %+v, want %s", p.Status.ContainerStatuses, ctr2.Id)
		}
		return nil
	})

	t.Log("phase: a removed manifest stops the pod and deletes its mirror")
	if err := os.Remove(filepath.Join(dir, "web.yaml")); err != nil {
		t.Fatal(err)
	}
	e.wantNoSandboxes(t, uid2)
	poll.Until(t, 30*time.Second, "mirror pod deleted", func() error {
		p, err := e.c.Client.CoreV1().Pods("default").Get(context.Background(), name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		return fmt.Errorf("mirror pod %s still there", p.UID)
	})
}
