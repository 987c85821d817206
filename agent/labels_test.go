package agent

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/cairn-os/cairn/machineconfig"
	"github.com/cairn-os/cairn/test/kube"
	"github.com/cairn-os/cairn/test/poll"
)

// TestNodeLabelsFollowRunningConfig runs the labels component as the
// node itself (system:node:NAME, through the Node authorizer and the
// NodeRestriction admission of a real API server) on a running config
// that the test rewrites as init does: a label added, one changed, one
// dropped; labels that others set are kept.
func TestNodeLabelsFollowRunningConfig(t *testing.T) {
	c := kube.Start(t, kube.Options{})
	const name = "labels-node"
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	registered := map[string]string{"rack": "r1", "tier": "web"}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: maps.Clone(registered)}}
	node.Labels["set-by-admin"] = "yes"
	if _, err := c.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	nodeClient, err := kubernetes.NewForConfig(c.UserConfig("system:node:"+name, "system:nodes"))
	if err != nil {
		t.Fatal(err)
	}

	b, err := machineconfig.Generate(machineconfig.GenerateOptions{Hostname: name})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "config.yaml")
	write := func(labels map[string]string) {
		t.Helper()
		b.Config.Cluster = &machineconfig.Cluster{Server: "https://127.0.0.1:6443", CA: string(c.CAPEM), BootstrapToken: "abcdef.0123456789abcdef", NodeLabels: labels}
		data, err := b.Config.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		// As init writes it: a new file renamed over the old.
		tmp := path + ".new"
		if err := os.WriteFile(tmp, data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	write(registered)

	l := &nodeLabels{path: path, applied: maps.Clone(registered), log: slog.Default()}
	lctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- l.follow(lctx, nodeClient.CoreV1().Nodes(), name) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("follow() = %v", err)
		}
	}()

	write(map[string]string{"rack": "r2", "zone-group": "a"})
	want := map[string]string{"rack": "r2", "zone-group": "a", "set-by-admin": "yes"}
	poll.Until(t, 30*time.Second, "the Node's labels from the new config", func() error {
		n, err := c.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !maps.Equal(n.Labels, want) {
			return fmt.Errorf("labels %v, want %v", n.Labels, want)
		}
		return nil
	})
}
