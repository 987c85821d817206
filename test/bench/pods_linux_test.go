//go:build bench

package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cairn-os/cairn/test/need"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cairn-os/cairn/machineconfig"
	"github.com/cairn-os/cairn/test/agentnode"
	"github.com/cairn-os/cairn/test/kube"
	"github.com/cairn-os/cairn/test/mounts"
	"github.com/cairn-os/cairn/test/registry"
	"github.com/cairn-os/cairn/test/repo"
	"github.com/cairn-os/cairn/test/runtime"
)

const (
	podCount   = 50
	namespace  = "default"
	benchLabel = "cairn.dev/bench" // the run a Pod belongs to
	// settle is how long the pods run before the memory is read, and over
	// which the CPU time of a node with podCount pods and nothing to do is
	// measured.
	settle = 10 * time.Second
)

// EnvAgentProfile names the environment variable that, when set to a file
// name, makes BenchmarkPodStartup write there a CPU profile of podagent
// during its concurrent run. Profiling costs CPU time: the figures of that
// run are not podagent's alone.
const EnvAgentProfile = "CAIRN_BENCH_AGENT_PROFILE"

// BenchmarkPodStartup prints the startup latency of podCount pods, started
// one after another and all at once, from their creation to their status
// Running seen through a watch, with cairn-agent (the whole process built
// from ./agent), with its kubelet part alone (cmd/podagent) and with the
// upstream kubelet, and the raw CRI calls as the floor. All of them run on
// the same control plane and containerd, one after another, with the
// pods' image present. It also prints the CPU time each node process used
// during the concurrent run and its memory with the pods running, naming
// each process by its PID and command.
func BenchmarkPodStartup(b *testing.B) {
	kubeletBin := clusterBinary(b, "kubelet")
	c := kube.Start(b, kube.Options{})
	rt := runtime.Start(b)
	image := helloImage(b, rt)
	cairnAgentBin := agentnode.Build(b)
	podAgentBin := agentnode.BuildPackage(b, "./test/bench/cmd/podagent", "podagent")
	cniBin := agentnode.CNIPluginDir(b)
	ctrd, err := containerdPID(rt)
	if err != nil {
		b.Fatal(err)
	}
	profile := os.Getenv(EnvAgentProfile)
	for i := 0; b.Loop(); i++ {
		floor := criFloor(b, rt, ctrd, image)
		agent := runNode(b, c, rt, ctrd, fmt.Sprintf("bench-cairn-agent-%d", i), image, false, func(node, dir string) *proc {
			return startCairnAgent(b, c, rt, cairnAgentBin, cniBin, dir, node)
		})
		podAgent := runNode(b, c, rt, ctrd, fmt.Sprintf("bench-podagent-%d", i), image, profile != "", func(node, dir string) *proc {
			return startPodAgent(b, c, rt, podAgentBin, dir, node, profile)
		})
		kubelet := runNode(b, c, rt, ctrd, fmt.Sprintf("bench-kubelet-%d", i), image, false, func(node, dir string) *proc {
			return startKubelet(b, c, rt, kubeletBin, dir, node)
		})
		report(b, ctrd, floor, agent, podAgent, kubelet)
		if profile != "" {
			fmt.Printf("podagent CPU profile of the concurrent run: go tool pprof -top %s\n", profile)
		}
	}
}

// clusterBinary is the path of a binary that make cluster built.
func clusterBinary(b *testing.B, name string) string {
	b.Helper()
	dir := os.Getenv(kube.EnvBin)
	if dir == "" {
		root, err := repo.Root()
		if err != nil {
			b.Fatal(err)
		}
		dir = filepath.Join(root, "_out", "cluster", "bin")
	}
	bin := filepath.Join(dir, name)
	need.Built(b, bin, "cluster", kube.EnvBin)
	return bin
}

// helloImage pushes test/images/hello to a registry and pulls it into rt,
// so that the pods find it present.
func helloImage(b *testing.B, rt *runtime.Runtime) string {
	b.Helper()
	reg := registry.Start(b)
	if err := rt.AllowHTTP(reg.Addr); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if _, err := registry.BuildAndPush(ctx, reg, "./test/images/hello", "cairn-test/hello:v1"); err != nil {
		b.Fatal(err)
	}
	image := reg.Addr + "/cairn-test/hello:v1"
	if _, err := rt.ImageClient.PullImage(ctx, &criv1.PullImageRequest{Image: &criv1.ImageSpec{Image: image}}); err != nil {
		b.Fatalf("pull %s: %v", image, err)
	}
	return image
}

// startPodAgent starts cmd/podagent as Node node, joining c with its
// bootstrap token and running pods on rt, with its state in dir.
func startPodAgent(b *testing.B, c *kube.Cluster, rt *runtime.Runtime, bin, dir, node, profile string) *proc {
	b.Helper()
	cluster, err := json.Marshal(machineconfig.Cluster{
		Server: c.URL, CA: string(c.CAPEM), BootstrapToken: c.BootstrapToken,
		ClusterDomain: machineconfig.DefaultClusterDomain,
	})
	if err != nil {
		b.Fatal(err)
	}
	clusterFile := filepath.Join(dir, "cluster.json")
	if err := os.WriteFile(clusterFile, cluster, 0o600); err != nil {
		b.Fatal(err)
	}
	args := []string{"-cri-socket", rt.Socket, "-node-name", node, "-cluster", clusterFile,
		"-dir", filepath.Join(dir, "state"), "-log-root", filepath.Join(dir, "pods")}
	mounts.UnmountAtEnd(b, filepath.Join(dir, "state")) // the volumes of the pods left running
	if profile != "" {
		args = append(args, "-cpuprofile", profile)
	}
	return startProc(b, "podagent", filepath.Join(dir, "podagent.log"), exec.Command(bin, args...), func() {
		if err := removeSandboxes(context.Background(), rt); err != nil {
			b.Errorf("after podagent: %v", err)
		}
	})
}

// nodeFigures are what one contender measured.
type nodeFigures struct {
	seq, conc []time.Duration // each pod's startup latency
	concWall  time.Duration   // the concurrent run, from the first creation to the last pod Ready
	// During the concurrent run: the node process's CPU time,
	// containerd's, and the host's (busy) of all its CPUs' (total).
	cpu, containerdCPU  time.Duration
	hostBusy, hostTotal time.Duration
	idleCPU             time.Duration // over settle, with the pods running
	rss, peakRSS        int64
	// The node process measured: its name, PID and command line when its
	// memory was read (none for the CRI floor), and a line on what its
	// own figures say it did, if it has any.
	name, command string
	pid           int
	summary       string
}

// cpuTimes are the CPU times of the node process, containerd and the host
// at one moment.
type cpuTimes struct{ node, containerd, hostBusy, hostTotal time.Duration }

// readCPUTimes reads them; node is 0 for the CRI floor, which has no node
// process.
func readCPUTimes(node, containerd int) (cpuTimes, error) {
	var t cpuTimes
	var errs [3]error
	if node != 0 {
		t.node, errs[0] = pidCPU(node)
	}
	t.containerd, errs[1] = pidCPU(containerd)
	t.hostBusy, t.hostTotal, errs[2] = hostCPU()
	return t, errors.Join(errs[:]...)
}

// since sets f's CPU times of the concurrent run, from start to now.
func (f *nodeFigures) since(start cpuTimes, node, containerd int) error {
	now, err := readCPUTimes(node, containerd)
	f.cpu = now.node - start.node
	f.containerdCPU = now.containerd - start.containerd
	f.hostBusy, f.hostTotal = now.hostBusy-start.hostBusy, now.hostTotal-start.hostTotal
	return err
}

// runNode starts a node process with start, as Node node, waits until the
// Node is Ready, runs podCount pods on it one after another and then all
// at once, and stops it.
func runNode(b *testing.B, c *kube.Cluster, rt *runtime.Runtime, containerd int, node, image string, profile bool, start func(node, dir string) *proc) nodeFigures {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	p := start(node, b.TempDir())
	r := &nodeRun{b: b, ctx: ctx, client: c.Client, rt: rt, node: node, image: image, p: p}
	r.waitNodeReady()
	if p.ready != nil {
		if err := p.ready(ctx); err != nil {
			r.fatalf("%v", err)
		}
	}
	f := nodeFigures{name: p.name, pid: p.cmd.Process.Pid}
	f.seq = r.sequential()
	r.deleteAll(node + "-seq")
	r.concurrent(&f, containerd, profile)
	cpu0 := r.cpu()
	time.Sleep(settle)
	f.idleCPU = r.cpu() - cpu0
	var err error
	if f.rss, f.peakRSS, err = p.mem(); err != nil {
		b.Fatal(err)
	}
	if f.command, err = p.command(); err != nil {
		b.Fatal(err)
	}
	if p.summary != nil {
		if f.summary, err = p.summary(ctx); err != nil {
			r.fatalf("%v", err)
		}
	}
	r.deleteAll(node + "-conc")
	p.stop()
	return f
}

// nodeRun is one contender's run.
type nodeRun struct {
	b      *testing.B
	ctx    context.Context
	client kubernetes.Interface
	rt     *runtime.Runtime
	node   string
	image  string
	p      *proc
}

// fatalf fails the benchmark, with the node process's last lines.
func (r *nodeRun) fatalf(format string, args ...any) {
	r.b.Helper()
	r.b.Fatalf("%s: %s\n%s", r.node, fmt.Sprintf(format, args...), r.p.tail())
}

// cpu is the node process's CPU time so far.
func (r *nodeRun) cpu() time.Duration {
	r.b.Helper()
	d, err := r.p.cpu()
	if err != nil {
		r.fatalf("CPU time: %v", err)
	}
	return d
}

func (r *nodeRun) waitNodeReady() {
	r.b.Helper()
	var last error
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if err := r.p.running(); err != nil {
			r.b.Fatal(err)
		}
		n, err := r.client.CoreV1().Nodes().Get(r.ctx, r.node, metav1.GetOptions{})
		if err != nil {
			last = err
			continue
		}
		last = errors.New("no Ready condition")
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				if c.Status == corev1.ConditionTrue {
					return
				}
				last = fmt.Errorf("Ready %s: %s %s", c.Status, c.Reason, c.Message)
			}
		}
	}
	r.fatalf("Node not Ready within 2 min: %v", last)
}

func (r *nodeRun) pod(name, run string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: map[string]string{benchLabel: run}},
		Spec: corev1.PodSpec{
			NodeName: r.node,
			// No volumes: the service account token would be the only
			// one, and the contenders would not do the same work.
			AutomountServiceAccountToken:  new(false),
			DNSPolicy:                     corev1.DNSDefault,
			TerminationGracePeriodSeconds: new(int64(5)),
			Containers: []corev1.Container{{
				Name: "hello", Image: r.image, ImagePullPolicy: corev1.PullIfNotPresent,
			}},
		},
	}
}

func (r *nodeRun) create(name, run string) error {
	_, err := r.client.CoreV1().Pods(namespace).Create(r.ctx, r.pod(name, run), metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create Pod %s: %w", name, err)
	}
	return nil
}

// sequential creates podCount pods, each once the one before is Running,
// and returns their latencies.
func (r *nodeRun) sequential() []time.Duration {
	r.b.Helper()
	run := r.node + "-seq"
	w := r.watch(run)
	defer w.stop()
	var lat []time.Duration
	for i := range podCount {
		name := fmt.Sprintf("%s-%d", run, i)
		start := time.Now()
		if err := r.create(name, run); err != nil {
			r.fatalf("%v", err)
		}
		w.wait(r, []string{name}, 2*time.Minute, false)
		lat = append(lat, w.running(name).Sub(start))
	}
	return lat
}

// concurrent creates podCount pods at once and sets f's figures of the
// concurrent run: their latencies, how long until the last was Ready, and
// the CPU time used until then.
func (r *nodeRun) concurrent(f *nodeFigures, containerd int, profile bool) {
	r.b.Helper()
	run := r.node + "-conc"
	w := r.watch(run)
	defer w.stop()
	names := make([]string, podCount)
	created := make([]time.Time, podCount)
	errs := make([]error, podCount)
	cpu0, err := readCPUTimes(r.p.cmd.Process.Pid, containerd)
	if err != nil {
		r.fatalf("CPU times: %v", err)
	}
	if profile {
		r.p.cmd.Process.Signal(syscall.SIGUSR1)
	}
	start := time.Now()
	var wg sync.WaitGroup
	for i := range podCount {
		names[i] = fmt.Sprintf("%s-%d", run, i)
		wg.Go(func() {
			created[i] = time.Now()
			errs[i] = r.create(names[i], run)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		r.fatalf("%v", err)
	}
	w.wait(r, names, 5*time.Minute, true)
	f.concWall = time.Since(start)
	if err := f.since(cpu0, r.p.cmd.Process.Pid, containerd); err != nil {
		r.fatalf("CPU times: %v", err)
	}
	if profile {
		r.p.cmd.Process.Signal(syscall.SIGUSR2)
	}
	for i, n := range names {
		f.conc = append(f.conc, w.running(n).Sub(created[i]))
	}
}

// deleteAll deletes the pods of run and waits until their objects and
// every sandbox on the runtime are gone. The upstream kubelet removes the
// sandboxes of deleted pods only in its periodic garbage collection: what
// is left after sandboxGrace is removed here, and said.
func (r *nodeRun) deleteAll(run string) {
	r.b.Helper()
	pods := r.client.CoreV1().Pods(namespace)
	sel := metav1.ListOptions{LabelSelector: benchLabel + "=" + run}
	if err := pods.DeleteCollection(r.ctx, metav1.DeleteOptions{}, sel); err != nil {
		r.fatalf("delete the pods of %s: %v", run, err)
	}
	var left int
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(500 * time.Millisecond) {
		l, err := pods.List(r.ctx, sel)
		if err != nil {
			r.fatalf("list the pods of %s: %v", run, err)
		}
		if left = len(l.Items); left == 0 {
			break
		}
		if time.Now().After(deadline) {
			r.fatalf("%d pods of %s still there 2 min after their deletion", left, run)
		}
	}
	const sandboxGrace = 90 * time.Second
	for deadline := time.Now().Add(sandboxGrace); ; time.Sleep(500 * time.Millisecond) {
		n, err := sandboxCount(r.ctx, r.rt)
		if err != nil {
			r.fatalf("%v", err)
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			fmt.Printf("%s left %d sandboxes %v after its pods were deleted: removing them\n", r.node, n, sandboxGrace)
			if err := removeSandboxes(r.ctx, r.rt); err != nil {
				r.fatalf("%v", err)
			}
			return
		}
	}
}

// podTimes are the times when the pods of a run were first seen Running
// and Ready, through an informer's watch.
type podTimes struct {
	mu        sync.Mutex
	runningAt map[string]time.Time
	readyAt   map[string]time.Time
	last      map[string]*corev1.Pod
	changed   chan struct{} // closed and replaced on every change
	stop      context.CancelFunc
}

// watch watches the pods of run until w.stop.
func (r *nodeRun) watch(run string) *podTimes {
	r.b.Helper()
	ctx, cancel := context.WithCancel(r.ctx)
	w := &podTimes{runningAt: map[string]time.Time{}, readyAt: map[string]time.Time{}, last: map[string]*corev1.Pod{},
		changed: make(chan struct{}), stop: cancel}
	f := informers.NewSharedInformerFactoryWithOptions(r.client, 0, informers.WithNamespace(namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = benchLabel + "=" + run }))
	inf := f.Core().V1().Pods().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    w.seen,
		UpdateFunc: func(_, obj any) { w.seen(obj) },
	}); err != nil {
		r.b.Fatal(err)
	}
	f.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		cancel()
		r.fatalf("pod informer of %s not synced", run)
	}
	return w
}

func (w *podTimes) seen(obj any) {
	now := time.Now()
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.last[p.Name] = p
	if _, ok := w.runningAt[p.Name]; !ok && p.Status.Phase == corev1.PodRunning {
		w.runningAt[p.Name] = now
	}
	for _, c := range p.Status.Conditions {
		if _, ok := w.readyAt[p.Name]; !ok && c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			w.readyAt[p.Name] = now
		}
	}
	close(w.changed)
	w.changed = make(chan struct{})
}

func (w *podTimes) running(name string) time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.runningAt[name]
}

// wait waits until every pod of names is Running, and Ready too if ready.
func (w *podTimes) wait(r *nodeRun, names []string, timeout time.Duration, ready bool) {
	r.b.Helper()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		w.mu.Lock()
		missing := slices.DeleteFunc(slices.Clone(names), func(n string) bool {
			_, running := w.runningAt[n]
			_, isReady := w.readyAt[n]
			return running && (isReady || !ready)
		})
		changed := w.changed
		var last *corev1.Pod
		if len(missing) > 0 {
			last = w.last[missing[0]]
		}
		w.mu.Unlock()
		if len(missing) == 0 {
			return
		}
		if err := r.p.running(); err != nil {
			r.b.Fatal(err)
		}
		select {
		case <-changed:
		case <-time.After(time.Second):
		case <-timer.C:
			status := "never seen"
			if last != nil {
				status = fmt.Sprintf("%+v", last.Status)
			}
			r.fatalf("%d pods not Running within %v, such as %s: %s", len(missing), timeout, missing[0], status)
		}
	}
}

// containerdPID finds the process of rt's containerd by its config file.
func containerdPID(rt *runtime.Runtime) (int, error) {
	config := filepath.Join(rt.Dir, "config.toml")
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
		if filepath.Base(args[0]) == "containerd" && slices.Contains(args, config) {
			var pid int
			fmt.Sscan(filepath.Base(filepath.Dir(p)), &pid)
			return pid, nil
		}
	}
	return 0, fmt.Errorf("no containerd process with --config %s", config)
}

// percentile is the nearest-rank p-th percentile of ds.
func percentile(ds []time.Duration, p float64) time.Duration {
	s := slices.Sorted(slices.Values(ds))
	return s[max(int(math.Ceil(p/100*float64(len(s))))-1, 0)]
}

func seconds(d time.Duration) string { return fmt.Sprintf("%.2fs", d.Seconds()) }

func mib(n int64) float64 { return float64(n) / (1 << 20) }
