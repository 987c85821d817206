package server

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cairn-os/cairn/agent/kubelet"
	"github.com/cairn-os/cairn/agent/kubelet/cri"
	"github.com/cairn-os/cairn/agent/node"
	"github.com/cairn-os/cairn/machineconfig"
	"github.com/cairn-os/cairn/test/kube"
	"github.com/cairn-os/cairn/test/poll"
	"github.com/cairn-os/cairn/test/registry"
	"github.com/cairn-os/cairn/test/runtime"
)

// TestLogsFromContainerd joins a node as cairn-agent does, its pods run
// by a real containerd and its kubelet server beside them, and reads the
// log of a container that crashed and was restarted through the API
// server: the current attempt, the previous one, and a follow that ends
// with the container.
func TestLogsFromContainerd(t *testing.T) {
	c := kube.Shared(t)
	ns := c.Namespace()
	rt := runtime.Start(t)
	reg := registry.Start(t)
	if err := rt.AllowHTTP(reg.Addr); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	if _, err := registry.BuildAndPush(ctx, reg, "./agent/kubelet/pods/testdata/echoexit", "cairn-test/echoexit:v1"); err != nil {
		t.Fatal(err)
	}
	image := reg.Addr + "/cairn-test/echoexit:v1"
	client, err := cri.New(rt.Socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })

	// A port that is free now, for the server to listen on each time the
	// component starts.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	name := "node-" + ns
	cluster := machineconfig.Cluster{Server: c.URL, CA: string(c.CAPEM), BootstrapToken: c.BootstrapToken,
		ClusterDomain: machineconfig.DefaultClusterDomain}
	dir, logRoot := t.TempDir(), filepath.Join(t.TempDir(), "pods")
	podConfig := kubelet.NewPodConfig(&cluster, client, logRoot)
	components := []node.Component{
		{Name: "kubelet", Run: func(ctx context.Context, m *node.Member) error {
			return kubelet.Run(ctx, m, kubelet.Config{Dir: dir, RuntimeInfo: client, Pods: podConfig})
		}},
		{Name: "kubelet-server", Run: func(ctx context.Context, m *node.Member) error {
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
			if err != nil {
				return err
			}
			return Serve(ctx, l, Config{NodeName: m.Name, Client: m.Client, ClusterCA: m.ClusterCA,
				Pods: m.Informers.Core().V1().Pods().Lister(), PodLogRoot: logRoot})
		}},
	}
	nctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- node.Run(nctx, node.Config{NodeName: name, Cluster: cluster, Dir: dir, RuntimeInfo: client, RuntimeStatus: client,
			Version: "test", NodeIP: netip.MustParseAddr("127.0.0.1"), KubeletPort: port}, components)
	}()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("node.Run() = %v", err)
		}
	})
	t.Cleanup(func() {
		// The pod goes before the node stops, so that its containers do
		// not outlive the test.
		_ = c.Client.CoreV1().Pods(ns).Delete(context.Background(), "crash", metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
		poll.Until(t, 60*time.Second, "pod crash gone", func() error {
			_, err := c.Client.CoreV1().Pods(ns).Get(context.Background(), "crash", metav1.GetOptions{})
			if err == nil {
				return fmt.Errorf("still there")
			}
			return nil
		})
	})

	_, err = c.Client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "crash"},
		Spec: corev1.PodSpec{NodeName: name, RestartPolicy: corev1.RestartPolicyAlways, Containers: []corev1.Container{{
			Name: "app", Image: image, Args: []string{"one", "two"}, Env: []corev1.EnvVar{{Name: "EXIT_CODE", Value: "1"}},
		}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
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
