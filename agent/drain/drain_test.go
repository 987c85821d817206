package drain

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/cairn-os/cairn/agent/node"
	"github.com/cairn-os/cairn/test/kube"
	"github.com/cairn-os/cairn/test/poll"
)

const nodeName = "drain-node"

// TestDrain drains a Node of a real API server with the node's own
// credentials (Node authorizer, NodeRestriction): a pod a PodDisruptionBudget
// holds fails the drain at its timeout, and the Node is uncordoned; with
// force it is deleted and the Node stays cordoned, its static pod kept;
// back from the reboot, the node uncordons its Node once Ready.
func TestDrain(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	c := kube.Start(t, kube.Options{})
	admin := c.Client
	nodeClient := kubernetes.NewForConfigOrDie(c.UserConfig("system:node:"+nodeName, "system:nodes"))
	n, err := nodeClient.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	setReady(t, ctx, nodeClient)

	const ns = "default"
	// Pod b runs, Ready, and its budget allows no disruption.
	for _, name := range []string{"a", "b"} {
		p, err := admin.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": name}},
			Spec:       corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{Name: "c", Image: "none"}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p.Status = corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
		if _, err := nodeClient.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	one := intstr.FromInt32(1)
	if _, err := admin.PolicyV1().PodDisruptionBudgets(ns).Create(ctx, &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "b"},
		Spec:       policyv1.PodDisruptionBudgetSpec{MinAvailable: &one, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "b"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, time.Minute, "the budget of b observed", func() error {
		pdb, err := admin.PolicyV1().PodDisruptionBudgets(ns).Get(ctx, "b", metav1.GetOptions{})
		if err != nil || pdb.Status.ObservedGeneration != pdb.Generation || pdb.Status.CurrentHealthy != 1 {
			return fmt.Errorf("budget %+v, %v", pdb.Status, err)
		}
		return nil
	})
	// A static pod's mirror, which a drain leaves.
	if _, err := nodeClient.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "static-" + nodeName, Annotations: map[string]string{corev1.MirrorPodAnnotationKey: "hash"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: nodeName, UID: n.UID, Controller: ptr(true)}}},
		Spec: corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{Name: "c", Image: "none"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	go playKubelet(ctx, t, admin)

	dir := t.TempDir()
	d := New(filepath.Join(dir, "drain.json"), slog.Default())
	d.every = 200 * time.Millisecond
	if err := d.Drain(ctx, Options{}); err == nil || !strings.Contains(err.Error(), "not in its cluster") {
		t.Errorf("Drain before the node joined = %v, want an error saying so", err)
	}
	runCtx, stopRun := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- d.Run(runCtx, &node.Member{Name: nodeName, Client: nodeClient}) }()
	poll.Until(t, 10*time.Second, "the drainer running", func() error {
		if !d.Joined() {
			return fmt.Errorf("not joined")
		}
		return nil
	})

	var steps []string
	progress := func(step, msg string) { steps = append(steps, step+": "+msg) }
	err = d.Drain(ctx, Options{Timeout: 3 * time.Second, Progress: progress})
	if err == nil || !strings.Contains(err.Error(), "default/b (held by a PodDisruptionBudget)") {
		t.Errorf("Drain with b held = %v, want b named as held by its budget", err)
	}
	if unschedulable(t, ctx, admin) {
		t.Error("the Node stayed cordoned after a failed drain")
	}
	if _, err := os.Stat(d.marker); !os.IsNotExist(err) {
		t.Errorf("the marker stayed after a failed drain: %v", err)
	}
	if got := podNames(t, ctx, admin); !slices.Equal(got, []string{"b", "static-" + nodeName}) {
		t.Errorf("pods after the failed drain = %v, want a evicted, b and the static pod left", got)
	}
	if len(steps) < 2 || !strings.HasPrefix(steps[0], "cordoned:") || !strings.HasPrefix(steps[1], "draining: pods left: default/a, default/b") {
		t.Errorf("progress %q, want cordoned, then draining with a and b", steps)
	}

	steps = nil
	if err := d.Drain(ctx, Options{Timeout: time.Second, Force: true, Progress: progress}); err != nil {
		t.Fatalf("Drain with force = %v", err)
	}
	if got := podNames(t, ctx, admin); !slices.Equal(got, []string{"static-" + nodeName}) {
		t.Errorf("pods after the forced drain = %v, want the static pod alone", got)
	}
	if !unschedulable(t, ctx, admin) {
		t.Error("the Node is schedulable after a drain")
	}
	if last := steps[len(steps)-1]; !strings.HasPrefix(last, "drained:") || !slices.ContainsFunc(steps, func(s string) bool { return strings.Contains(s, "(forced)") }) {
		t.Errorf("progress %q, want a forced draining step and drained last", steps)
	}

	// The node reboots: the component stops, and runs again once joined.
	stopRun()
	<-ran
	if err := d.Undo(ctx); err == nil {
		t.Error("Undo while not in the cluster succeeded")
	}
	setReady(t, ctx, nodeClient) // as the node's status loop does again
	go func() { ran <- d.Run(ctx, &node.Member{Name: nodeName, Client: nodeClient}) }()
	poll.Until(t, 30*time.Second, "the Node uncordoned once Ready, the marker removed", func() error {
		if unschedulable(t, ctx, admin) {
			return fmt.Errorf("still cordoned")
		}
		if _, err := os.Stat(d.marker); !os.IsNotExist(err) {
			return fmt.Errorf("marker: %v", err)
		}
		return nil
	})

	// A reset: the node may not delete its Node; it says so.
	if got := d.Leave(ctx); !strings.Contains(got, "the Node "+nodeName+" stays, cordoned: the cluster does not let a node delete its own Node") {
		t.Errorf("Leave = %q, want the Node kept and why", got)
	}
	unschedulable(t, ctx, admin) // the Node is still there

	// A Node the operator cordoned stays cordoned after a drain undone.
	if err := setUnschedulable(ctx, admin, nodeName, true); err != nil {
		t.Fatal(err)
	}
	if err := d.Drain(ctx, Options{}); err != nil {
		t.Fatal(err)
	}
	if err := d.Undo(ctx); err != nil {
		t.Fatal(err)
	}
	if !unschedulable(t, ctx, admin) {
		t.Error("a drain undone uncordoned a Node the operator had cordoned")
	}
}

// setReady reports the Node Ready, as the node's status loop does: a
// patch of its status, which leaves alone the taints that the node
// controller adds meanwhile (a node may not change them).
func setReady(t *testing.T, ctx context.Context, c kubernetes.Interface) {
	now := metav1.Now().UTC().Format(time.RFC3339)
	patch := fmt.Sprintf(`{"status":{"conditions":[{"type":"Ready","status":"True","reason":"KubeletReady","lastHeartbeatTime":%q,"lastTransitionTime":%q}]}}`, now, now)
	if _, err := c.CoreV1().Nodes().PatchStatus(ctx, nodeName, []byte(patch)); err != nil {
		t.Fatal(err)
	}
}

// playKubelet finishes what is deleted on the node, as its kubelet does
// once the containers stopped.
func playKubelet(ctx context.Context, t *testing.T, c kubernetes.Interface) {
	w, err := c.CoreV1().Pods("").Watch(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + nodeName})
	if err != nil {
		t.Error(err)
		return
	}
	defer w.Stop()
	for ev := range w.ResultChan() {
		p, ok := ev.Object.(*corev1.Pod)
		if ok && ev.Type == watch.Modified && p.DeletionTimestamp != nil {
			err := c.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))})
			if err != nil && !apierrors.IsNotFound(err) && ctx.Err() == nil {
				t.Errorf("finish %s: %v", p.Name, err)
			}
		}
	}
}

func unschedulable(t *testing.T, ctx context.Context, c kubernetes.Interface) bool {
	n, err := c.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n.Spec.Unschedulable
}

func podNames(t *testing.T, ctx context.Context, c kubernetes.Interface) []string {
	pods, err := c.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + nodeName})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range pods.Items {
		names = append(names, p.Name)
	}
	slices.Sort(names)
	return names
}

func ptr[T any](v T) *T { return &v }
