//go:build bench

package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cairn-os/cairn/test/agentnode"
	"github.com/cairn-os/cairn/test/kube"
	"github.com/cairn-os/cairn/test/registry"
	"github.com/cairn-os/cairn/test/runtime"
)

const (
	execRuns     = 50       // kubectl exec round trips per node
	forwardBytes = 64 << 20 // per GET through kubectl port-forward
	forwardRuns  = 3
)

// BenchmarkStreams prints the round trip of `kubectl exec POD -- streamer
// exit 0` (p50 and p99 of execRuns, kubectl's own start included) and the
// throughput of an HTTP GET through `kubectl port-forward` (the median
// of forwardRuns), through the API server to cairn-agent's kubelet
// server and to the upstream kubelet, on the same control plane and
// containerd, one after the other, with the ratio cairn-agent/kubelet.
func BenchmarkStreams(b *testing.B) {
	kubeletBin := clusterBinary(b, "kubelet")
	// Both nodes are reached at their InternalIP: the host's address for
	// cairn-agent, 127.0.0.1 for the kubelet.
	c := kube.Start(b, kube.Options{APIServerFlags: []string{"--kubelet-preferred-address-types=InternalIP"}})
	k := c.Kubectl(b, namespace)
	rt := runtime.Start(b)
	image := streamerImage(b, rt)
	cairnAgentBin := agentnode.Build(b)
	cniBin := agentnode.CNIPluginDir(b)
	for i := 0; b.Loop(); i++ {
		agent := streamNode(b, c, k, rt, fmt.Sprintf("bench-stream-cairn-agent-%d", i), image, func(node, dir string) *proc {
			return startCairnAgent(b, c, rt, cairnAgentBin, cniBin, dir, node)
		})
		kubelet := streamNode(b, c, k, rt, fmt.Sprintf("bench-stream-kubelet-%d", i), image, func(node, dir string) *proc {
			return startKubelet(b, c, rt, kubeletBin, dir, node)
		})
		fmt.Printf("\nkubectl exec round trip (%d runs) and port-forward throughput (median of %d GETs of %d MiB), through the API server:\n",
			execRuns, forwardRuns, forwardBytes>>20)
		fmt.Printf("%-12s %10s %10s %14s\n", "node", "exec p50", "exec p99", "forward MB/s")
		for _, f := range []streamFigures{agent, kubelet} {
			fmt.Printf("%-12s %10s %10s %14.1f\n", f.name, f.p50.Round(time.Millisecond), f.p99.Round(time.Millisecond), f.mbps)
		}
		fmt.Printf("%-12s %10.2f %10.2f %14.2f\n", "ratio", agent.p50.Seconds()/kubelet.p50.Seconds(),
			agent.p99.Seconds()/kubelet.p99.Seconds(), agent.mbps/kubelet.mbps)
		b.ReportMetric(agent.p50.Seconds()/kubelet.p50.Seconds(), "cairn-agent/kubelet-exec-p50")
		b.ReportMetric(agent.p99.Seconds()/kubelet.p99.Seconds(), "cairn-agent/kubelet-exec-p99")
		b.ReportMetric(agent.mbps/kubelet.mbps, "cairn-agent/kubelet-forward")
	}
}

// streamFigures are one node's figures.
type streamFigures struct {
	name     string
	p50, p99 time.Duration
	mbps     float64 // 10^6 bytes a second
}

// streamerImage pushes the kubelet server's test workload to a registry
// and pulls it into rt.
func streamerImage(b *testing.B, rt *runtime.Runtime) string {
	b.Helper()
	reg := registry.Start(b)
	if err := rt.AllowHTTP(reg.Addr); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if _, err := registry.BuildAndPush(ctx, reg, "./agent/kubelet/server/testdata/streamer", "cairn-test/streamer:v1"); err != nil {
		b.Fatal(err)
	}
	image := reg.Addr + "/cairn-test/streamer:v1"
	if _, err := rt.ImageClient.PullImage(ctx, &criv1.PullImageRequest{Image: &criv1.ImageSpec{Image: image}}); err != nil {
		b.Fatalf("pull %s: %v", image, err)
	}
	return image
}

// streamNode starts a node, runs a pod of streamer serve on it, measures,
// and stops the pod and the node.
func streamNode(b *testing.B, c *kube.Cluster, k *kube.Kubectl, rt *runtime.Runtime, node, image string, start func(node, dir string) *proc) streamFigures {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	p := start(node, b.TempDir())
	r := &nodeRun{b: b, ctx: ctx, client: c.Client, rt: rt, node: node, image: image, p: p}
	r.waitNodeReady()
	if p.ready != nil {
		if err := p.ready(ctx); err != nil {
			r.fatalf("%v", err)
		}
	}
	pods := c.Client.CoreV1().Pods(namespace)
	_, err := pods.Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: node, Labels: map[string]string{benchLabel: node}},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{
			Name: "app", Image: image, Args: []string{"serve"}, ImagePullPolicy: corev1.PullNever,
		}}},
	}, metav1.CreateOptions{})
	if err != nil {
		r.fatalf("create pod: %v", err)
	}
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		pod, err := pods.Get(ctx, node, metav1.GetOptions{})
		if err == nil && pod.Status.Phase == corev1.PodRunning {
			break
		}
		if time.Now().After(deadline) {
			r.fatalf("pod %s not running within 2 minutes: %v", node, err)
		}
	}

	f := streamFigures{name: p.name}
	var rtts []time.Duration
	for range execRuns {
		t0 := time.Now()
		if _, err := k.Run(ctx, nil, "exec", node, "--", "streamer", "exit", "0"); err != nil {
			r.fatalf("%v", err)
		}
		rtts = append(rtts, time.Since(t0))
	}
	f.p50, f.p99 = percentile(rtts, 50), percentile(rtts, 99)
	f.mbps, err = forwardThroughput(ctx, k, node)
	if err != nil {
		r.fatalf("%v", err)
	}
	r.deleteAll(node)
	p.stop()
	return f
}

// forwarded is kubectl port-forward's line for its local port.
var forwarded = regexp.MustCompile(`Forwarding from 127\.0\.0\.1:(\d+) -> 8080`)

// forwardThroughput GETs forwardBytes from the pod's streamer through
// kubectl port-forward forwardRuns times and returns the median rate.
func forwardThroughput(ctx context.Context, k *kube.Kubectl, pod string) (float64, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cmd := k.Command(ctx, "port-forward", "pod/"+pod, "--address", "127.0.0.1", ":8080")
	out := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = out, os.Stderr
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	defer func() {
		cancel()
		_ = cmd.Wait()
	}()
	var port string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if m := forwarded.FindStringSubmatch(out.String()); m != nil {
			port = m[1]
			break
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("kubectl port-forward not listening within 30 s: %q", out.String())
		}
	}
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	var times []time.Duration
	for range forwardRuns {
		t0 := time.Now()
		resp, err := client.Get(fmt.Sprintf("http://127.0.0.1:%s/bytes/%d", port, forwardBytes))
		if err != nil {
			return 0, err
		}
		n, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil || n != forwardBytes {
			return 0, fmt.Errorf("GET through port-forward: %d bytes, %v; want %d", n, err, forwardBytes)
		}
		times = append(times, time.Since(t0))
	}
	return float64(forwardBytes) / percentile(times, 50).Seconds() / 1e6, nil
}

// lockedBuffer is what a command writes while the benchmark reads it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf []byte
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, p...)
	return len(p), nil
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return string(l.buf)
}
