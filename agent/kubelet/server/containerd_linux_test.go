package server

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cairn-os/cairn/agent/kubelet"
	"github.com/cairn-os/cairn/agent/kubelet/cri"
	"github.com/cairn-os/cairn/agent/kubelet/stats"
	"github.com/cairn-os/cairn/agent/node"
	"github.com/cairn-os/cairn/machineconfig"
	"github.com/cairn-os/cairn/test/kube"
	"github.com/cairn-os/cairn/test/mounts"
	"github.com/cairn-os/cairn/test/poll"
	"github.com/cairn-os/cairn/test/registry"
	"github.com/cairn-os/cairn/test/runtime"
)

// criNode is a Node joined as cairn-agent joins it, its pods run by a real
// containerd and its kubelet server beside them with the node's stats,
// with a registry for the test's images.
type criNode struct {
	c    *kube.Cluster
	ns   string
	name string     // the Node's
	ip   netip.Addr // the Node's and its kubelet server's
	port int        // the kubelet server's
	reg  *registry.Registry
	cri  *cri.Client
}

// startCRINode starts containerd and a registry, and joins the node; all
// stop when t ends, after the pods that createPod made are gone.
func startCRINode(t *testing.T) *criNode {
	t.Helper()
	c := kube.Shared(t)
	n := &criNode{c: c, ns: c.Namespace(), reg: registry.Start(t)}
	n.name = "node-" + n.ns
	rt := runtime.Start(t)
	if err := rt.AllowHTTP(n.reg.Addr); err != nil {
		t.Fatal(err)
	}
	client, err := cri.New(rt.Socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	n.cri = client

	// The API server's node proxy refuses loopback: the node is at the
	// host's own address. A port that is free now, for the server to
	// listen on each time the component starts.
	n.ip = hostIP(t)
	l, err := net.Listen("tcp", net.JoinHostPort(n.ip.String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	n.port = l.Addr().(*net.TCPAddr).Port
	l.Close()
	cluster := machineconfig.Cluster{Server: c.URL, CA: string(c.CAPEM), BootstrapToken: c.BootstrapToken,
		ClusterDomain: machineconfig.DefaultClusterDomain}
	dir, logRoot := t.TempDir(), filepath.Join(t.TempDir(), "pods")
	mounts.UnmountAtEnd(t, dir) // the volumes of the pods left running
	podConfig := kubelet.NewPodConfig(&cluster, client, logRoot)
	components := []node.Component{
		{Name: "kubelet", Run: func(ctx context.Context, m *node.Member) error {
			return kubelet.Run(ctx, m, kubelet.Config{Dir: dir, RuntimeInfo: client, Pods: podConfig})
		}},
		{Name: "kubelet-server", Run: func(ctx context.Context, m *node.Member) error {
			l, err := net.Listen("tcp", n.addr())
			if err != nil {
				return err
			}
			return Serve(ctx, l, Config{NodeName: m.Name, Client: m.Client, ClusterCA: m.ClusterCA,
				Pods: m.Informers.Core().V1().Pods().Lister(), Runtime: client.Runtime, PodLogRoot: logRoot,
				Stats: stats.New(stats.Config{NodeName: m.Name, Runtime: client.Runtime, Images: client.Images,
					RootDir: dir, PodLogRoot: logRoot})})
		}},
	}
	nctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- node.Run(nctx, node.Config{NodeName: n.name, Cluster: cluster, Dir: dir, RuntimeInfo: client, RuntimeStatus: client,
			Version: "test", NodeIP: n.ip, KubeletPort: n.port, DeclaredFeatures: DeclaredFeatures}, components)
	}()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("node.Run() = %v", err)
		}
	})
	return n
}

// addr is the kubelet server's host:port.
func (n *criNode) addr() string { return net.JoinHostPort(n.ip.String(), strconv.Itoa(n.port)) }

// image builds the Go main package pkg into an image, pushes it as
// cairn-test/NAME:v1 and returns its reference.
func (n *criNode) image(t *testing.T, ctx context.Context, pkg string) string {
	t.Helper()
	repoTag := "cairn-test/" + filepath.Base(pkg) + ":v1"
	if _, err := registry.BuildAndPush(ctx, n.reg, pkg, repoTag); err != nil {
		t.Fatal(err)
	}
	return n.reg.Addr + "/" + repoTag
}

// createPod creates pod on the node; it is deleted, and gone, before the
// node stops, so that its containers do not outlive the test.
func (n *criNode) createPod(t *testing.T, ctx context.Context, pod *corev1.Pod) {
	t.Helper()
	pod.Spec.NodeName = n.name
	if _, err := n.c.Client.CoreV1().Pods(n.ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = n.c.Client.CoreV1().Pods(n.ns).Delete(context.Background(), pod.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
		poll.Until(t, 60*time.Second, "pod "+pod.Name+" gone", func() error {
			_, err := n.c.Client.CoreV1().Pods(n.ns).Get(context.Background(), pod.Name, metav1.GetOptions{})
			if err == nil {
				return fmt.Errorf("still there")
			}
			return nil
		})
	})
}

// TestLogsFromContainerd joins a node as cairn-agent does, its pods run
// by a real containerd and its kubelet server beside them, and reads the
// log of a container that crashed and was restarted through the API
// server: the current attempt, the previous one, and a follow that ends
// with the container.
func TestLogsFromContainerd(t *testing.T) {
	n := startCRINode(t)
	c, ns := n.c, n.ns
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	image := n.image(t, ctx, "./agent/kubelet/pods/testdata/echoexit")
	n.createPod(t, ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "crash"},
		Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyAlways, Containers: []corev1.Container{{
			Name: "app", Image: image, Args: []string{"one", "two"}, Env: []corev1.EnvVar{{Name: "EXIT_CODE", Value: "1"}},
		}}},
	})
	poll.Until(t, 90*time.Second, "the container restarted once and exited again", func() error {
		p, err := c.Client.CoreV1().Pods(ns).Get(ctx, "crash", metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, st := range p.Status.ContainerStatuses {
			if st.RestartCount >= 1 && st.State.Running == nil && st.LastTerminationState.Terminated != nil {
				return nil
			}
		}
		return fmt.Errorf("container statuses %+v", p.Status.ContainerStatuses)
	})
	logs := func(o corev1.PodLogOptions) string {
		t.Helper()
		b, err := c.Client.CoreV1().Pods(ns).GetLogs("crash", &o).DoRaw(ctx)
		if err != nil {
			t.Fatalf("logs(%+v) = %v", o, err)
		}
		return string(b)
	}
	cur, prev := logs(corev1.PodLogOptions{Timestamps: true}), logs(corev1.PodLogOptions{Timestamps: true, Previous: true})
	curTime, curLine, _ := strings.Cut(strings.TrimSuffix(cur, "\n"), " ")
	prevTime, prevLine, _ := strings.Cut(strings.TrimSuffix(prev, "\n"), " ")
	if curLine != "args=one two" || prevLine != "args=one two" {
		t.Fatalf("logs = %q, previous %q; want the container's line in each", cur, prev)
	}
	tc, err1 := time.Parse(time.RFC3339Nano, curTime)
	tp, err2 := time.Parse(time.RFC3339Nano, prevTime)
	if err1 != nil || err2 != nil || !tp.Before(tc) {
		t.Errorf("logs at %q, previous at %q; want the previous attempt's earlier", curTime, prevTime)
	}

	// kubectl logs -f of a container that exited ends, rather than wait.
	rc, err := c.Client.CoreV1().Pods(ns).GetLogs("crash", &corev1.PodLogOptions{Follow: true}).Stream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	ended := make(chan error, 1)
	go func() {
		b := make([]byte, 4096)
		for {
			if _, err := rc.Read(b); err != nil {
				ended <- err
				return
			}
		}
	}()
	select {
	case <-ended:
	case <-time.After(30 * time.Second):
		t.Error("following the log of an exited container did not end within 30 s")
	}
}
