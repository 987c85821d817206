//go:build bench

package bench

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"regexp"
	"slices"
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
	execRuns     = 200      // kubectl exec round trips per node
	forwardBytes = 64 << 20 // per GET through kubectl port-forward
	forwardRuns  = 16       // per node
)

// BenchmarkStreams prints the round trip of `kubectl exec POD -- streamer
// exit 0` (p50 and p99, kubectl's own start included) and the throughput
// of an HTTP GET through `kubectl port-forward` (the median), through the
// API server to cairn-agent's kubelet server and to the upstream kubelet,
// on the same control plane and containerd build, with the ratio
// cairn-agent/kubelet, and the CPU time each node process spent over each
// phase.
//
// The two nodes run at once, each on its own containerd (a kubelet stops
// the pods it does not know), and the samples are taken in pairs, one of
// each node back to back, the first of a pair alternating: a drift of the
// machine (its two cores are shared with the API server, both containerds
// and kubectl) weighs on both nodes alike.
func BenchmarkStreams(b *testing.B) {
	kubeletBin := clusterBinary(b, "kubelet")
	// Both nodes are reached at their InternalIP: the host's address.
	c := kube.Start(b, kube.Options{APIServerFlags: []string{"--kubelet-preferred-address-types=InternalIP"}})
	k := c.Kubectl(b, namespace)
	reg := registry.Start(b)
	image := streamerImage(b, reg)
	cairnAgentBin := agentnode.Build(b)
	cniBin := agentnode.CNIPluginDir(b)
	nodes := []*streamNode{
		{name: "cairn-agent", start: func(rt *runtime.Runtime, node, dir string) *proc {
			return startCairnAgent(b, c, rt, cairnAgentBin, cniBin, dir, node)
		}},
		{name: "kubelet", start: func(rt *runtime.Runtime, node, dir string) *proc {
			return startKubelet(b, c, rt, kubeletBin, dir, node)
		}},
	}
	for _, n := range nodes {
		n.rt = runtime.Start(b)
		pullStreamer(b, n.rt, reg, image)
	}
	for i := 0; b.Loop(); i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		for _, n := range nodes {
			n.run(b, ctx, c, fmt.Sprintf("bench-stream-%s-%d", n.name, i), image)
		}
		pairs := func(runs int, sample func(n *streamNode)) {
			for j := range runs {
				for x := range nodes {
					sample(nodes[(j+x)%len(nodes)])
				}
			}
		}
		cpu := func() []time.Duration {
			var ds []time.Duration
			for _, n := range nodes {
				ds = append(ds, n.r.cpu())
			}
			return ds
		}
		cpu0 := cpu()
		pairs(execRuns, func(n *streamNode) {
			t0 := time.Now()
			if _, err := k.Run(ctx, nil, "exec", n.pod, "--", "streamer", "exit", "0"); err != nil {
				n.r.fatalf("%v", err)
			}
			n.rtts = append(n.rtts, time.Since(t0))
		})
		for _, n := range nodes {
			port, stop, err := portForward(ctx, k, n.pod)
			if err != nil {
				n.r.fatalf("%v", err)
			}
			n.forwardPort, n.stopForward = port, stop
		}
		cpu1 := cpu()
		pairs(forwardRuns, func(n *streamNode) {
			d, err := forwardGet(n.forwardPort)
			if err != nil {
				n.r.fatalf("%v", err)
			}
			n.gets = append(n.gets, d)
		})
		cpu2 := cpu()
		for x, n := range nodes {
			n.execCPU, n.forwardCPU = cpu1[x]-cpu0[x], cpu2[x]-cpu1[x]
		}
		agent, kubelet := nodes[0].figures(), nodes[1].figures()
		fmt.Printf("\nkubectl exec round trip (%d runs) and port-forward throughput (median of %d GETs of %d MiB), through the API server, both nodes at once, sampled in turn:\n",
			execRuns, forwardRuns, forwardBytes>>20)
		fmt.Printf("%-12s %10s %10s %14s %10s %13s\n", "node", "exec p50", "exec p99", "forward MB/s", "exec CPU", "forward CPU")
		for _, f := range []streamFigures{agent, kubelet} {
			fmt.Printf("%-12s %10s %10s %14.1f %9.2fs %12.2fs\n", f.name, f.p50.Round(time.Millisecond), f.p99.Round(time.Millisecond), f.mbps,
				f.execCPU.Seconds(), f.forwardCPU.Seconds())
		}
		fmt.Printf("%-12s %10.2f %10.2f %14.2f %10.2f %13.2f\n", "ratio", agent.p50.Seconds()/kubelet.p50.Seconds(),
			agent.p99.Seconds()/kubelet.p99.Seconds(), agent.mbps/kubelet.mbps,
			agent.execCPU.Seconds()/kubelet.execCPU.Seconds(), agent.forwardCPU.Seconds()/kubelet.forwardCPU.Seconds())
		// Each pair's ratio, and the median of them with its 95 %
		// interval: the two nodes differ only if it leaves out 1.
		execPairs, forwardPairs := pairRatios(nodes[0].rtts, nodes[1].rtts), pairRatios(nodes[1].gets, nodes[0].gets)
		for _, r := range []struct {
			what   string
			ratios []float64
		}{{"exec time", execPairs}, {"forward rate", forwardPairs}} {
			m, lo, hi := medianInterval(r.ratios)
			verdict := "no difference shown"
			switch {
			case hi < 1 && r.what == "exec time", lo > 1 && r.what == "forward rate":
				verdict = "cairn-agent faster"
			case lo > 1 && r.what == "exec time", hi < 1 && r.what == "forward rate":
				verdict = "cairn-agent slower"
			}
			fmt.Printf("paired %-12s cairn-agent/kubelet median of %d pairs %.3f, 95%% interval %.3f–%.3f: %s\n", r.what, len(r.ratios), m, lo, hi, verdict)
		}
		b.ReportMetric(agent.p50.Seconds()/kubelet.p50.Seconds(), "cairn-agent/kubelet-exec-p50")
		b.ReportMetric(agent.p99.Seconds()/kubelet.p99.Seconds(), "cairn-agent/kubelet-exec-p99")
		b.ReportMetric(agent.mbps/kubelet.mbps, "cairn-agent/kubelet-forward")
		b.ReportMetric(agent.execCPU.Seconds()/kubelet.execCPU.Seconds(), "cairn-agent/kubelet-exec-cpu")
		for _, n := range nodes {
			n.stopForward()
			n.stop()
		}
		cancel()
	}
}

// streamNode is one node of the benchmark: its containerd, and for one
// iteration its process, its pod and its samples.
type streamNode struct {
	name  string
	start func(rt *runtime.Runtime, node, dir string) *proc
	rt    *runtime.Runtime

	r           *nodeRun
	pod         string
	forwardPort string
	stopForward func()
	rtts, gets  []time.Duration
	// execCPU and forwardCPU are the node process's CPU time over each
	// phase, the other node's samples included (both run throughout).
	execCPU, forwardCPU time.Duration
}

// run starts the node as Node node and a pod of streamer serve on it, and
// returns once the pod runs.
func (n *streamNode) run(b *testing.B, ctx context.Context, c *kube.Cluster, node, image string) {
	b.Helper()
	p := n.start(n.rt, node, b.TempDir())
	n.r = &nodeRun{b: b, ctx: ctx, client: c.Client, rt: n.rt, node: node, image: image, p: p}
	n.pod, n.rtts, n.gets = node, nil, nil
	n.r.waitNodeReady()
	if p.ready != nil {
		if err := p.ready(ctx); err != nil {
			n.r.fatalf("%v", err)
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
		n.r.fatalf("create pod: %v", err)
	}
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		pod, err := pods.Get(ctx, node, metav1.GetOptions{})
		if err == nil && pod.Status.Phase == corev1.PodRunning {
			return
		}
		if time.Now().After(deadline) {
			n.r.fatalf("pod %s not running within 2 minutes: %v", node, err)
		}
	}
}

// stop deletes the node's pod and stops the node.
func (n *streamNode) stop() {
	n.r.deleteAll(n.pod)
	n.r.p.stop()
}

// figures are the samples' percentiles and median rate.
func (n *streamNode) figures() streamFigures {
	return streamFigures{name: n.name, p50: percentile(n.rtts, 50), p99: percentile(n.rtts, 99),
		mbps:    float64(forwardBytes) / percentile(n.gets, 50).Seconds() / 1e6,
		execCPU: n.execCPU, forwardCPU: n.forwardCPU}
}

// streamFigures are one node's figures.
type streamFigures struct {
	name     string
	p50, p99 time.Duration
	mbps     float64 // 10^6 bytes a second

	execCPU, forwardCPU time.Duration
}

// streamerImage pushes the kubelet server's test workload to reg and
// returns its name.
func streamerImage(b *testing.B, reg *registry.Registry) string {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if _, err := registry.BuildAndPush(ctx, reg, "./agent/kubelet/server/testdata/streamer", "cairn-test/streamer:v1"); err != nil {
		b.Fatal(err)
	}
	return reg.Addr + "/cairn-test/streamer:v1"
}

// pullStreamer pulls image from reg into rt.
func pullStreamer(b *testing.B, rt *runtime.Runtime, reg *registry.Registry, image string) {
	b.Helper()
	if err := rt.AllowHTTP(reg.Addr); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if _, err := rt.ImageClient.PullImage(ctx, &criv1.PullImageRequest{Image: &criv1.ImageSpec{Image: image}}); err != nil {
		b.Fatalf("pull %s: %v", image, err)
	}
}

// forwarded is kubectl port-forward's line for its local port.
var forwarded = regexp.MustCompile(`Forwarding from 127\.0\.0\.1:(\d+) -> 8080`)

// portForward starts kubectl port-forward to the pod's port 8080 and
// returns the local port once it listens, and how to stop it.
func portForward(ctx context.Context, k *kube.Kubectl, pod string) (string, func(), error) {
	ctx, cancel := context.WithCancel(ctx)
	cmd := k.Command(ctx, "port-forward", "pod/"+pod, "--address", "127.0.0.1", ":8080")
	out := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = out, os.Stderr
	if err := cmd.Start(); err != nil {
		cancel()
		return "", nil, err
	}
	stop := func() {
		cancel()
		_ = cmd.Wait()
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if m := forwarded.FindStringSubmatch(out.String()); m != nil {
			return m[1], stop, nil
		}
		if time.Now().After(deadline) {
			stop()
			return "", nil, fmt.Errorf("kubectl port-forward not listening within 30 s: %q", out.String())
		}
	}
}

// forwardGet GETs forwardBytes from the streamer behind the local port,
// on a new connection, and returns how long it took.
func forwardGet(port string) (time.Duration, error) {
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
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
	return time.Since(t0), nil
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

// pairRatios are a[i]/b[i], pair by pair.
func pairRatios(a, b []time.Duration) []float64 {
	rs := make([]float64, min(len(a), len(b)))
	for i := range rs {
		rs[i] = a[i].Seconds() / b[i].Seconds()
	}
	return rs
}

// medianInterval is the median of xs with its distribution-free 95 %
// confidence interval: the order statistics the sign test gives (at least
// 95 % coverage whatever the distribution).
func medianInterval(xs []float64) (median, lo, hi float64) {
	s := slices.Sorted(slices.Values(xs))
	n := len(s)
	if n == 0 {
		return 0, 0, 0
	}
	median = s[n/2]
	if n%2 == 0 {
		median = (s[n/2-1] + s[n/2]) / 2
	}
	// The largest k with P(Binomial(n, 1/2) < k) <= 2.5 %.
	k, cum, p := 0, 0.0, math.Pow(0.5, float64(n))
	for j := 0; j < n; j++ {
		if cum+p > 0.025 {
			break
		}
		cum += p
		k = j + 1
		p *= float64(n-j) / float64(j+1)
	}
	if k == 0 {
		return median, s[0], s[n-1]
	}
	return median, s[k-1], s[n-k]
}
