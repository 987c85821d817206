//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cairn-os/cairn/api/client"
	"github.com/cairn-os/cairn/api/machine"
	"github.com/cairn-os/cairn/qemu"
	"github.com/cairn-os/cairn/test/kube"
	"github.com/cairn-os/cairn/test/poll"
)

// guestHost is the host as the guest sees it.
const guestHost = qemu.HostAddress

// testPod checks, on a booted node whose machine config joins kc, that
// the node registers and becomes Ready (its pod network written from the
// pod CIDR that kube-controller-manager gave it), runs an ordinary Pod
// (with the service-account volume the API server adds) whose image it
// pulls from the host's registry, reads the Pod's log back through the
// node API, and deletes it. start is when QEMU started.
func testPod(t *testing.T, ctx context.Context, kc *kube.Cluster, c *client.Client, cairnconfig, image string, metricsPort int, start time.Time) {
	const nodeName, ns = "e2e-node", "default"
	var node *corev1.Node
	poll.Until(t, 3*time.Minute, "Node "+nodeName+" Ready", func() (err error) {
		if node, err = kc.Client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{}); err != nil {
			return err
		}
		for _, cond := range node.Status.Conditions {
			if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
				return nil
			} else if cond.Type == corev1.NodeReady {
				return fmt.Errorf("Ready %s: %s", cond.Status, cond.Message)
			}
		}
		return errors.New("no Ready condition")
	})
	t.Logf("Node registered %s and Ready %s after QEMU started",
		node.CreationTimestamp.Sub(start).Round(time.Second), time.Since(start).Round(time.Second))
	// The pod routes to other nodes (none here) are in: the agent watched
	// every Node and programmed its routes.
	poll.Until(t, time.Minute, "Node "+nodeName+" NetworkUnavailable False", func() error {
		n, err := kc.Client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeNetworkUnavailable {
				if cond.Status != corev1.ConditionFalse || cond.Reason != "NetworkReady" {
					return fmt.Errorf("NetworkUnavailable %s (%s): %s", cond.Status, cond.Reason, cond.Message)
				}
				return nil
			}
		}
		return errors.New("no NetworkUnavailable condition")
	})
	podCIDR, err := netip.ParsePrefix(node.Spec.PodCIDR)
	if err != nil {
		t.Fatalf("Node pod CIDR %q: %v", node.Spec.PodCIDR, err)
	}

	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "hello", Namespace: ns},
		Spec: corev1.PodSpec{
			NodeName: nodeName,
			Containers: []corev1.Container{{
				Name: "hello", Image: image, Args: []string{"--in-pod"},
				ImagePullPolicy: corev1.PullIfNotPresent,
			}},
		},
	}
	created := time.Now()
	pod, err = kc.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 3*time.Minute, "Pod Running with an address", func() error {
		p, err := kc.Client.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" {
			return fmt.Errorf("phase %s, pod IP %q, containers %+v", p.Status.Phase, p.Status.PodIP, p.Status.ContainerStatuses)
		}
		if ip, err := netip.ParseAddr(p.Status.PodIP); err != nil || !podCIDR.Contains(ip) {
			t.Errorf("pod IP %s, want one in the Node's pod CIDR %s", p.Status.PodIP, podCIDR)
		}
		return nil
	})
	t.Logf("Pod Running %s after it was created (image pulled from the host)", time.Since(created).Round(100*time.Millisecond))
	checkQOSCgroups(t, ctx, kc, c, pod)

	const want = "hello from cairn-test-image pid=1 args=--in-pod"
	poll.Until(t, 30*time.Second, "the Pod's log line through the node API", func() error {
		out, err := readStream(c.PodLogs(ctx, &machine.PodLogsRequest{Namespace: ns, Pod: pod.Name, TailLines: 10}))
		if err != nil {
			return err
		}
		if !strings.Contains(out, want) {
			return fmt.Errorf("PodLogs = %q, want %q", out, want)
		}
		return nil
	})
	if out := cairn(t, "node", "--cairnconfig", cairnconfig, "logs", "--pod", ns+"/"+pod.Name, "-c", "hello"); !strings.HasPrefix(out, want+"\n") {
		t.Errorf("cairn node logs --pod printed %q, want %q first", out, want)
	}

	// The node's metrics, through QEMU's forwarded port: the pod's start,
	// the Lease, the CRI calls, the Service dataplane.
	metrics := cairn(t, "node", "--cairnconfig", cairnconfig, "metrics", "--port", strconv.Itoa(metricsPort))
	for _, want := range []string{
		"cairn_kubelet_pod_start_duration_seconds_count 1",
		`cairn_kubelet_lease_renewals_total{result="success"}`,
		`cairn_cri_request_duration_seconds_count{code="OK",method="StartContainer"}`,
		"cairn_cri_image_pull_duration_seconds_count",
		"cairn_proxy_sync_duration_seconds",
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("cairn node metrics lacks %q", want)
		}
	}

	deleted := time.Now()
	if err := kc.Client.CoreV1().Pods(ns).Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 2*time.Minute, "Pod gone", func() error {
		p, err := kc.Client.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		return fmt.Errorf("still there, phase %s", p.Status.Phase)
	})
	t.Logf("Pod gone %s after Delete", time.Since(deleted).Round(100*time.Millisecond))
	// Its cgroup went with it.
	cgroup := "/sys/fs/cgroup/kubepods/besteffort/pod" + string(pod.UID) + "/cpu.weight"
	if _, err := readStream(c.Read(ctx, &machine.ReadRequest{Path: cgroup})); err == nil {
		t.Errorf("%s still there after the pod went", cgroup)
	}
}

// checkQOSCgroups reads back, through the node API, the pods' cgroups on
// the node's cgroup v2: /kubepods limited to the node's memory less the
// 256 MiB it keeps, the BestEffort class at the lowest CPU weight, the
// Burstable class at the weight of its pods' requests (none), and the
// BestEffort pod's own cgroup under it, at the weight of no request.
func checkQOSCgroups(t *testing.T, ctx context.Context, kc *kube.Cluster, c *client.Client, pod *corev1.Pod) {
	read := func(path string) string {
		t.Helper()
		out, err := readStream(c.Read(ctx, &machine.ReadRequest{Path: path}))
		if err != nil {
			t.Errorf("read %s: %v", path, err)
		}
		return strings.TrimSpace(out)
	}
	var totalKiB int64
	for _, line := range strings.Split(read("/proc/meminfo"), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
			totalKiB, _ = strconv.ParseInt(f[1], 10, 64)
		}
	}
	if got, want := read("/sys/fs/cgroup/kubepods/memory.max"), strconv.FormatInt(totalKiB<<10-256<<20, 10); got != want {
		t.Errorf("/kubepods memory.max = %q, want %s (MemTotal less 256 MiB)", got, want)
	}
	if got := read("/sys/fs/cgroup/kubepods/besteffort/cpu.weight"); got != "1" {
		t.Errorf("/kubepods/besteffort cpu.weight = %q, want 1", got)
	}
	// No Burstable pod runs: the class has the weight of no request, not
	// the cgroup's default of 100.
	if got := read("/sys/fs/cgroup/kubepods/burstable/cpu.weight"); got != "1" {
		t.Errorf("/kubepods/burstable cpu.weight = %q, want 1 (no Burstable pod)", got)
	}
	p, err := kc.Client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Status.QOSClass != corev1.PodQOSBestEffort {
		t.Fatalf("pod QoS class %s, want BestEffort", p.Status.QOSClass)
	}
	if got := read("/sys/fs/cgroup/kubepods/besteffort/pod" + string(p.UID) + "/cpu.weight"); got != "1" {
		t.Errorf("the BestEffort pod's cgroup cpu.weight = %q, want 1 (no CPU request)", got)
	}
}

// readStream reads a stream of chunks (a log, a file) to its end.
func readStream[C interface{ GetData() []byte }](stream interface{ Recv() (C, error) }, err error) (string, error) {
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for {
		chunk, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return b.String(), nil
			}
			return b.String(), err
		}
		b.Write(chunk.GetData())
	}
}

// guestURL is url, which names the host's loopback, as the guest reaches
// it.
func guestURL(url string) string { return strings.Replace(url, "127.0.0.1", guestHost, 1) }
