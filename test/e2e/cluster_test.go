//go:build e2e && cluster

package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/cairn-os/cairn/qemu"
	"github.com/cairn-os/cairn/qemu/cluster"
	"github.com/cairn-os/cairn/test/conformance"
	"github.com/cairn-os/cairn/test/kube"
	"github.com/cairn-os/cairn/test/need"
	"github.com/cairn-os/cairn/test/poll"
	"github.com/cairn-os/cairn/test/registry"
)

// clusterNodePort is the NodePort the test's Service takes, forwarded
// from the host to each node by cairn qemu cluster create --node-port.
const clusterNodePort = 30080

// TestCluster runs `cairn qemu cluster create` with two nodes, as a user
// would (the cluster in a process of its own, its network in a namespace
// of its own), and checks through the kubeconfig it writes that:
//   - both nodes are Ready, each with its InternalIP on the cluster's
//     network and a pod CIDR;
//   - pods on node-2 reach a pod on node-1 by its IP, through a ClusterIP
//     Service and by the Service's name (pod routes between the nodes,
//     Services, the cluster's CoreDNS), with images from the cluster's
//     registry;
//   - the NodePort of node-2 reaches the pod on node-1, from the host;
//   - the API server reaches the pod through its proxy;
//   - a default-deny NetworkPolicy cuts the clients off, and a rule that
//     allows them lets them through again;
//   - status shows the nodes Ready, and destroy leaves no process,
//     network namespace or directory behind.
func TestCluster(t *testing.T) {
	start := time.Now()
	state, dir, destroy := createCluster(t, 2, "--node-port", strconv.Itoa(clusterNodePort), "--memory", "1536")
	t.Logf("cluster create: 2 nodes Ready %s after the command started", time.Since(start).Round(time.Second))
	if state.Phase != cluster.PhaseReady || !state.Running() {
		t.Fatalf("state after create: phase %s, running %v, want ready and running", state.Phase, state.Running())
	}
	// The cluster's own registry: pushed to on the host's loopback,
	// pulled from on the cluster's network.
	hello := filepath.Join(t.TempDir(), "hello")
	goBuild(t, hello, "./test/images/hello")
	cairn(t, "qemu", "cluster", "--dir", dir, "push", hello, "cairn-test/hello:v1")
	image := state.NodeRegistry + "/cairn-test/hello:v1"
	cfg, err := clientcmd.BuildConfigFromFlags("", state.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()

	t.Run("Nodes", func(t *testing.T) {
		for _, n := range state.Nodes {
			node, err := cs.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if len(node.Status.Addresses) == 0 || node.Status.Addresses[0].Address != n.Address {
				t.Errorf("%s addresses = %v, want InternalIP %s first", n.Name, node.Status.Addresses, n.Address)
			}
			if node.Spec.PodCIDR == "" {
				t.Errorf("%s has no pod CIDR", n.Name)
			}
			for _, c := range node.Status.Conditions {
				if c.Type == corev1.NodeNetworkUnavailable && c.Status != corev1.ConditionFalse {
					t.Errorf("%s NetworkUnavailable = %s (%s), want False: the pod routes are in", n.Name, c.Status, c.Reason)
				}
			}
		}
		out := cairn(t, "qemu", "cluster", "--dir", dir, "status")
		for _, n := range state.Nodes {
			if !strings.Contains(out, n.Name) || !strings.Contains(out, n.Address) {
				t.Errorf("status printed:\n%s\nwant %s with %s", out, n.Name, n.Address)
			}
		}
		if strings.Count(out, " True ") != 2 {
			t.Errorf("status printed:\n%s\nwant both nodes Ready True", out)
		}
	})

	const ns = "default"
	pods := cs.CoreV1().Pods(ns)
	run := func(t *testing.T, name, node string, labels map[string]string, env ...corev1.EnvVar) *corev1.Pod {
		t.Helper()
		return runHello(t, ctx, pods, name, node, image, labels, 5*time.Minute, env...)
	}
	server := run(t, "server", "node-1", map[string]string{"app": "server"},
		corev1.EnvVar{Name: "HELLO_SERVE", Value: ":8080"}, corev1.EnvVar{Name: "HELLO_HTTP", Value: ":8081"})
	svc, err := cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "server"},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeNodePort, Selector: map[string]string{"app": "server"},
			Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080), NodePort: clusterNodePort}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Three clients on node-2 dial the server on node-1 every second.
	clients := map[string]string{
		"by-ip":      server.Status.PodIP + ":8080",
		"by-service": net.JoinHostPort(svc.Spec.ClusterIP, "80"),
		"by-name":    "server.default.svc.cluster.local:80", // through the cluster's CoreDNS
	}
	for name, addr := range clients {
		run(t, name, "node-2", map[string]string{"role": "client"}, corev1.EnvVar{Name: "HELLO_DIAL", Value: addr})
	}
	// lastLine waits until the pod's last log line, read through the API
	// server from its node's kubelet server, starts with want.
	lastLine := func(t *testing.T, pod, want string) {
		t.Helper()
		tail := int64(1)
		poll.Until(t, 2*time.Minute, pod+"'s last line "+want, func() error {
			b, err := pods.GetLogs(pod, &corev1.PodLogOptions{TailLines: &tail}).DoRaw(ctx)
			if err != nil {
				return err
			}
			if !strings.HasPrefix(string(b), want) {
				return fmt.Errorf("last line %q", b)
			}
			return nil
		})
	}
	// allClients waits until each client's last line starts with what
	// followed by its address.
	allClients := func(t *testing.T, what string) {
		t.Helper()
		for name, addr := range clients {
			lastLine(t, name, what+" "+addr)
		}
	}
	// nodePort reads the server's greeting through node-2's NodePort,
	// forwarded from the host's loopback.
	nodePort := func() error {
		c, err := net.DialTimeout("tcp", state.Nodes[1].Forwarded, 5*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			return fmt.Errorf("read through the NodePort: %w", err)
		}
		if line != "hello\n" {
			return fmt.Errorf("the NodePort answered %q, want the server's hello", line)
		}
		return nil
	}

	t.Run("AcrossNodes", func(t *testing.T) {
		allClients(t, "reached")
		poll.Until(t, time.Minute, "the server's hello through node-2's NodePort", nodePort)
		// The control plane routes to the pods as the nodes do.
		b, err := pods.ProxyGet("http", "server", "8081", "/", nil).DoRaw(ctx)
		if err != nil || string(b) != "hello from server\n" {
			t.Errorf("the API server's proxy to the server pod: %q, %v; want its hello", b, err)
		}
	})

	t.Run("NetworkPolicy", func(t *testing.T) {
		policies := cs.NetworkingV1().NetworkPolicies(ns)
		server := metav1.LabelSelector{MatchLabels: map[string]string{"app": "server"}}
		if _, err := policies.Create(ctx, &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "deny"},
			Spec: networkingv1.NetworkPolicySpec{PodSelector: server, PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		allClients(t, "blocked")
		if _, err := policies.Create(ctx, &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "allow-clients"},
			Spec: networkingv1.NetworkPolicySpec{PodSelector: server, PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
				Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{
					PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "client"}},
				}}}}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		allClients(t, "reached")
	})

	t.Run("Destroy", func(t *testing.T) {
		destroy(t)
		if state.Running() {
			t.Errorf("the cluster's process %d still runs after destroy", state.PID)
		}
		if _, err := os.Stat("/run/netns/" + state.Netns); !os.IsNotExist(err) {
			t.Errorf("network namespace %s after destroy: %v, want it gone", state.Netns, err)
		}
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("cluster directory after destroy: %v, want it gone", err)
		}
	})
}

// TestClusterDegraded: a node whose VM dies while it boots (its QEMU
// killed) is named by create with its console's last lines, and create
// exits non-zero; the other node still joins, and the cluster runs,
// degraded, until destroy.
func TestClusterDegraded(t *testing.T) {
	create, dir, destroy := clusterCommand(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	type result struct {
		out string
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := cairnCLI(ctx, append(create, "--nodes", "2", "--memory", "1536")...)
		done <- result{out, err}
	}()
	// node-2's QEMU, once init logs on its console, is killed.
	disk := filepath.Join(dir, "node-2", "disk.qcow2")
	var pid int
	poll.Until(t, 10*time.Minute, "node-2's QEMU booting", func() error {
		out, err := exec.Command("pgrep", "-f", "qemu-system-x86_64 .*"+regexp.QuoteMeta(disk)).Output()
		if err != nil {
			return fmt.Errorf("pgrep: %v", err)
		}
		if pid, err = strconv.Atoi(strings.Fields(string(out))[0]); err != nil {
			return err
		}
		if b, err := os.ReadFile(disk + ".console.log"); err != nil || !strings.Contains(string(b), "cairn: ") {
			return fmt.Errorf("console: no line of init's yet (%v)", err)
		}
		return nil
	})
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err == nil {
		t.Fatalf("create with node-2's QEMU killed succeeded:\n%s", r.out)
	}
	for _, want := range []string{"cluster degraded: node-2: qemu exited before the node was ready", "console:\n", "\n  cairn: ", "node-1: Ready after"} {
		if !strings.Contains(r.out, want) {
			t.Errorf("create printed:\n%s\nwant %q", r.out, want)
		}
	}
	state, err := cluster.ReadState(dir)
	if err != nil {
		t.Fatal(err)
	}
	if state.Phase != cluster.PhaseDegraded || !state.Running() || !strings.Contains(state.Error, "node-2") {
		t.Errorf("state: phase %s, running %v, error %q; want degraded, running, naming node-2", state.Phase, state.Running(), state.Error)
	}
	out := cairn(t, "qemu", "cluster", "--dir", dir, "status")
	if !regexp.MustCompile(`node-1\s.*\sTrue\s`).MatchString(out) {
		t.Errorf("status printed:\n%s\nwant node-1 Ready True", out)
	}
	destroy(t)
}

// TestClusterExternal: with --kubeconfig, the nodes join an existing
// cluster (a control plane on the host's loopback, reached from the VMs
// through QEMU's user networking) instead of one the command starts; the
// cluster's DNS is deployed there, and destroy takes out what it added.
func TestClusterExternal(t *testing.T) {
	kc := kube.Start(t, kube.Options{
		PodCIDR: cluster.DefaultPodCIDR, ServingIPs: []net.IP{net.ParseIP(qemu.HostAddress)}, Scheduler: true,
		// Pods (CoreDNS) reach the kubernetes Service's endpoint as the
		// nodes reach the server: at QEMU's host address.
		APIServerFlags: []string{"--advertise-address=" + qemu.HostAddress, "--endpoint-reconciler-type=lease"},
	})
	create, dir, destroy := clusterCommand(t)
	start := time.Now()
	cairn(t, append(create, "--nodes", "1", "--memory", "1536", "--kubeconfig", kc.AdminKubeconfig)...)
	t.Logf("cluster create on an existing control plane: 1 node Ready %s after the command started", time.Since(start).Round(time.Second))
	state, err := cluster.ReadState(dir)
	if err != nil {
		t.Fatal(err)
	}
	if state.Phase != cluster.PhaseReady || state.Kubeconfig != kc.AdminKubeconfig || !state.DeployedDNS {
		t.Errorf("state: phase %s, kubeconfig %s, DNS deployed %v; want ready, %s, deployed", state.Phase, state.Kubeconfig, state.DeployedDNS, kc.AdminKubeconfig)
	}
	ctx := context.Background()
	node, err := kc.Client.CoreV1().Nodes().Get(ctx, "node-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !nodeReady(node) {
		t.Errorf("node-1's conditions in the existing cluster: %v, want Ready", node.Status.Conditions)
	}
	svc, err := kc.Client.CoreV1().Services(metav1.NamespaceSystem).Get(ctx, "kube-dns", metav1.GetOptions{})
	if err != nil || svc.Spec.ClusterIP != state.DNS {
		t.Errorf("kube-dns Service in the existing cluster: %v (IP %v), want it at %s", err, svc.Spec.ClusterIP, state.DNS)
	}
	tokens, err := kc.Client.CoreV1().Secrets(metav1.NamespaceSystem).List(ctx, metav1.ListOptions{FieldSelector: "type=bootstrap.kubernetes.io/token"})
	if err != nil {
		t.Fatal(err)
	}
	before := len(tokens.Items)

	destroy(t)
	if _, err := kc.Client.CoreV1().Nodes().Get(ctx, "node-1", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("node-1 after destroy: %v, want it deleted", err)
	}
	if _, err := kc.Client.AppsV1().Deployments(metav1.NamespaceSystem).Get(ctx, "coredns", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("CoreDNS after destroy: %v, want it deleted", err)
	}
	if tokens, err = kc.Client.CoreV1().Secrets(metav1.NamespaceSystem).List(ctx, metav1.ListOptions{FieldSelector: "type=bootstrap.kubernetes.io/token"}); err != nil || len(tokens.Items) != before-1 {
		t.Errorf("bootstrap tokens after destroy: %d (%v), want the cluster's gone of %d", len(tokens.Items), err, before)
	}
	if _, err := kc.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("the existing cluster after destroy: %v, want it still serving", err)
	}
}

// nodeReady says whether n's Ready condition is True.
func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// TestDemo runs make demo's script (hack/demo.sh) as a user would, from
// the repository's root: each URL it prints answers "hello from" a pod of
// the Deployment, and both pods answer, one on each node.
func TestDemo(t *testing.T) {
	name := fmt.Sprintf("demo-e2e-%d", os.Getpid())
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd := exec.Command(filepath.Join(binDir, "cairn"), "qemu", "cluster", "--name", name, "destroy")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("destroy: %v\n%s", err, out)
		}
	})
	cmd := exec.Command("bash", "hack/demo.sh")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CAIRN_DEMO_NAME="+name)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("hack/demo.sh: %v\n%s", err, out)
	}
	urls := regexp.MustCompile(`curl (http://127\.0\.0\.1:\d+/)`).FindAllStringSubmatch(string(out), -1)
	if len(urls) != 2 {
		t.Fatalf("hack/demo.sh printed %d URLs, want one per node:\n%s", len(urls), out)
	}
	// A connection each: the Service picks a pod per connection.
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	from := map[string]bool{}
	for i := range 20 {
		u := urls[i%2][1]
		resp, err := client.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || !strings.HasPrefix(string(b), "hello from hello-") {
			t.Fatalf("GET %s = %q, %v; want hello from a pod of the Deployment", u, b, err)
		}
		from[strings.TrimSpace(string(b))] = true
	}
	if len(from) != 2 {
		t.Errorf("20 requests were answered by %v, want both pods", from)
	}
}

// createCluster runs `cairn qemu cluster create` for a cluster of n nodes
// with more flags, in a directory of the test's, and returns its state,
// its directory and a function that destroys it; if the test has not
// called it, cleanup does.
func createCluster(tb testing.TB, n int, flags ...string) (*cluster.State, string, func(testing.TB)) {
	tb.Helper()
	create, dir, destroy := clusterCommand(tb)
	cairn(tb, append(append(create, "--nodes", strconv.Itoa(n)), flags...)...)
	state, err := cluster.ReadState(dir)
	if err != nil {
		tb.Fatal(err)
	}
	return state, dir, destroy
}

// clusterCommand returns the arguments of `cairn qemu cluster create` for
// a cluster in a directory of the test's, with the binaries it needs, that
// directory, and a function that destroys the cluster; if the test has not
// called it, cleanup does.
func clusterCommand(tb testing.TB) ([]string, string, func(testing.TB)) {
	tb.Helper()
	bin := os.Getenv(kube.EnvBin)
	need.Built(tb, filepath.Join(bin, "kube-apiserver"), "cluster", kube.EnvBin)
	need.Built(tb, filepath.Join(bin, "coredns"), "coredns", kube.EnvBin)
	dir := filepath.Join(tb.TempDir(), "cluster")
	args := []string{"qemu", "cluster", "--name", fmt.Sprintf("e2e-%d", os.Getpid()), "--dir", dir}
	destroyed := false
	destroy := func(tb testing.TB) {
		tb.Helper()
		destroyed = true
		cairn(tb, append(args, "destroy")...)
	}
	tb.Cleanup(func() {
		if !destroyed {
			out, err := cairnCLI(context.Background(), append(args, "destroy")...)
			tb.Logf("destroy: %v\n%s", err, out)
		}
	})
	return append(args, "create", "--control-plane-bin", bin, "--assets", binDir), dir, destroy
}

// goBuild builds the main package pkg (from the repository's root) into
// out, static, for the nodes.
func goBuild(tb testing.TB, out, pkg string) {
	tb.Helper()
	cmd := exec.Command("go", "build", "-trimpath", "-o", out, pkg)
	cmd.Dir = "../.."
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if b, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
}

// BenchmarkClusterCreate times `cairn qemu cluster create --nodes 3`, from
// the command's start to every Node Ready and the cluster's DNS serving
// (the image built from warm caches; under TCG where KVM does not run),
// and prints it with the boot-to-Ready part the cluster reports.
func BenchmarkClusterCreate(b *testing.B) {
	for range b.N {
		start := time.Now()
		state, _, destroy := createCluster(b, 3, "--memory", "1536")
		took := time.Since(start)
		b.ReportMetric(took.Seconds(), "s/create")
		b.Logf("cluster create, 3 nodes: command → all Nodes Ready and CoreDNS serving %s (first boot → Ready %s)", took.Round(time.Second), state.ReadyAfter)
		destroy(b)
	}
}

// TestClusterConformance runs the upstream suite's [sig-network]
// [Conformance] specs against a cluster of two Cairn nodes in QEMU, the
// suite's images pushed to the cluster's registry, and prints the counts
// (make conformance-cluster); each failed spec fails it. Its report is in
// _out/conformance/cluster-report.
func TestClusterConformance(t *testing.T) {
	report, err := filepath.Abs(filepath.Join("..", "..", "_out", "conformance", "cluster-report"))
	if err != nil {
		t.Fatal(err)
	}
	state, _, _ := createCluster(t, 2, "--memory", "2048")
	res := conformance.RunOn(t, conformance.Suite{
		Focus:     conformance.FocusFromEnv(`\[sig-network\].*\[Conformance\]`),
		Procs:     4,
		Timeout:   150 * time.Minute,
		ReportDir: report,
	}, conformance.Target{Kubeconfig: state.Kubeconfig, Registry: &registry.Registry{Addr: state.Registry}, Pull: state.NodeRegistry})
	if len(res.Passed)+len(res.Failed)+len(res.Skipped) == 0 {
		t.Error("no spec matched [sig-network] [Conformance]")
	}
	for _, name := range res.Failed {
		t.Errorf("failed: %s", name)
	}
	fmt.Println(res.Summary())
}
