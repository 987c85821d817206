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
	execRuns     = 25       // kubectl exec round trips per node and round
	forwardBytes = 64 << 20 // per GET through kubectl port-forward
	forwardRuns  = 3        // per node and round
	// streamRounds is how many times each node is started and measured,
	// in the order ABBA...: a drift of the machine over the run (its two
	// cores are shared with the API server, containerd and kubectl)
	// weighs on both nodes alike.
	streamRounds = 2
)

// BenchmarkStreams prints the round trip of `kubectl exec POD -- streamer
// exit 0` (p50 and p99, kubectl's own start included) and the throughput
// of an HTTP GET through `kubectl port-forward` (the median), through the
// API server to cairn-agent's kubelet server and to the upstream kubelet,
// on the same control plane and containerd, with the ratio
// cairn-agent/kubelet. The two cannot run at once on one containerd (the
// kubelet stops pods it does not know): each is started and measured in
// turn, streamRounds times, and the figures are over all its samples.
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
		nodes := []struct {
			name  string
			start func(node, dir string) *proc
		}{
			{"cairn-agent", func(node, dir string) *proc { return startCairnAgent(b, c, rt, cairnAgentBin, cniBin, dir, node) }},
			{"kubelet", func(node, dir string) *proc { return startKubelet(b, c, rt, kubeletBin, dir, node) }},
		}
		samples := map[string]*streamSamples{"cairn-agent": {}, "kubelet": {}}
		for round := range streamRounds {
			order := []int{0, 1}
			if round%2 == 1 {
				order = []int{1, 0}
			}
			for _, n := range order {
				node := nodes[n]
				streamNode(b, c, k, rt, fmt.Sprintf("bench-stream-%s-%d-%d", node.name, i, round), image, node.start, samples[node.name])
			}
		}
		agent, kubelet := samples["cairn-agent"].figures("cairn-agent"), samples["kubelet"].figures("kubelet")
		fmt.Printf("\nkubectl exec round trip (%d runs) and port-forward throughput (median of %d GETs of %d MiB), through the API server, each node measured %d times in turn:\n",
			execRuns*streamRounds, forwardRuns*streamRounds, forwardBytes>>20, streamRounds)
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

// streamSamples are one node's measurements, over its rounds.
type streamSamples struct {
	rtts, gets []time.Duration
}

// figures are the samples' percentiles and median rate.
func (s *streamSamples) figures(name string) streamFigures {
	return streamFigures{name: name, p50: percentile(s.rtts, 50), p99: percentile(s.rtts, 99),
		mbps: float64(forwardBytes) / percentile(s.gets, 50).Seconds() / 1e6}
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

// streamNode starts a node, runs a pod of streamer serve on it, measures
// into samples, and stops the pod and the node.
func streamNode(b *testing.B, c *kube.Cluster, k *kube.Kubectl, rt *runtime.Runtime, node, image string, start func(node, dir string) *proc, samples *streamSamples) {
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

	for range execRuns {
		t0 := time.Now()
		if _, err := k.Run(ctx, nil, "exec", node, "--", "streamer", "exit", "0"); err != nil {
			r.fatalf("%v", err)
		}
		samples.rtts = append(samples.rtts, time.Since(t0))
	}
	gets, err := forwardGets(ctx, k, node)
	if err != nil {
		r.fatalf("%v", err)
	}
	samples.gets = append(samples.gets, gets...)
	r.deleteAll(node)
	p.stop()
}

// forwarded is kubectl port-forward's line for its local port.
var forwarded = regexp.MustCompile(`Forwarding from 127\.0\.0\.1:(\d+) -> 8080`)

// forwardGets GETs forwardBytes from the pod's streamer through kubectl
// port-forward forwardRuns times and returns how long each took.
func forwardGets(ctx context.Context, k *kube.Kubectl, pod string) ([]time.Duration, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cmd := k.Command(ctx, "port-forward", "pod/"+pod, "--address", "127.0.0.1", ":8080")
	out := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = out, os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
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
			return nil, fmt.Errorf("kubectl port-forward not listening within 30 s: %q", out.String())
		}
	}
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	var times []time.Duration
	for range forwardRuns {
		t0 := time.Now()
		resp, err := client.Get(fmt.Sprintf("http://127.0.0.1:%s/bytes/%d", port, forwardBytes))
		if err != nil {
			return nil, err
		}
		n, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil || n != forwardBytes {
			return nil, fmt.Errorf("GET through port-forward: %d bytes, %v; want %d", n, err, forwardBytes)
		}
		times = append(times, time.Since(t0))
	}
	return times, nil
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
