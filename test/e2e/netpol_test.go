//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/cairn-os/cairn/api/client"
	"github.com/cairn-os/cairn/api/machine"
	"github.com/cairn-os/cairn/test/kube"
	"github.com/cairn-os/cairn/test/poll"
)

// testNetworkPolicy runs, on the booted node, a pod that serves and one
// that connects to it every second (the hello image's HELLO_SERVE and
// HELLO_DIAL), both on the node's bridge; then a NetworkPolicy that
// isolates the server cuts the client off, on the node's own kernel, and
// its deletion lets it through again.
func testNetworkPolicy(t *testing.T, ctx context.Context, kc *kube.Cluster, c *client.Client, image string) {
	const ns = "default"
	pods := kc.Client.CoreV1().Pods(ns)
	run := func(name string, labels map[string]string, env ...corev1.EnvVar) *corev1.Pod {
		t.Helper()
		return runHello(t, ctx, pods, name, "e2e-node", image, labels, 3*time.Minute, env...)
	}
	server := run("np-server", map[string]string{"app": "np-server"}, corev1.EnvVar{Name: "HELLO_SERVE", Value: ":8080"})
	addr := server.Status.PodIP + ":8080"
	run("np-client", nil, corev1.EnvVar{Name: "HELLO_DIAL", Value: addr})
	// lastLine waits until the client's last line starts with want.
	lastLine := func(want string) {
		t.Helper()
		poll.Until(t, time.Minute, "np-client's last line "+want, func() error {
			out, err := readStream(c.PodLogs(ctx, &machine.PodLogsRequest{Namespace: ns, Pod: "np-client", TailLines: 1}))
			if err != nil {
				return err
			}
			if !strings.HasPrefix(out, want) {
				return fmt.Errorf("last line %q", out)
			}
			return nil
		})
	}
	lastLine("reached " + addr)

	policies := kc.Client.NetworkingV1().NetworkPolicies(ns)
	deny := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "np-deny"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "np-server"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}}
	if _, err := policies.Create(ctx, deny, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	lastLine("blocked " + addr)
	if err := policies.Delete(ctx, deny.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	lastLine("reached " + addr)
}

// runHello runs the hello image as pod name on node, with labels and env,
// and waits up to wait for it to run with an IP; the test's end deletes
// it.
func runHello(t *testing.T, ctx context.Context, pods typedcorev1.PodInterface, name, node, image string, labels map[string]string, wait time.Duration, env ...corev1.EnvVar) *corev1.Pod {
	t.Helper()
	p, err := pods.Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{
			Name: "hello", Image: image, Env: env, ImagePullPolicy: corev1.PullIfNotPresent,
		}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pods.Delete(context.Background(), name, metav1.DeleteOptions{}) })
	poll.Until(t, wait, name+" Running on "+node, func() error {
		if p, err = pods.Get(ctx, name, metav1.GetOptions{}); err != nil {
			return err
		}
		if p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" {
			return fmt.Errorf("phase %s, IP %q", p.Status.Phase, p.Status.PodIP)
		}
		return nil
	})
	return p
}
