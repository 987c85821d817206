package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/cairn-os/cairn/agent/node"
	"github.com/cairn-os/cairn/machineconfig"
)

// nodeLabels keeps the Node's labels those of cluster.nodeLabels in the
// running config at path, which init rewrites when a config is applied
// live: the labels it adds or changes are set on the Node, those it drops
// removed. applied holds the labels last set, kept across restarts of the
// component: at first the ones the node registered with.
type nodeLabels struct {
	path    string
	applied map[string]string
	log     *slog.Logger
}

// run follows the running config until ctx ends, as the member.
func (l *nodeLabels) run(ctx context.Context, m *node.Member) error {
	return l.follow(ctx, m.Client.CoreV1().Nodes(), m.Name)
}

// follow keeps the labels of the Node name through nodes.
func (l *nodeLabels) follow(ctx context.Context, nodes corev1client.NodeInterface, name string) error {
	return followConfig(ctx, l.path, func(cfg *machineconfig.Config) error { return l.sync(ctx, nodes, name, cfg) })
}

// sync patches the Node if the running config's labels differ from those
// last applied.
func (l *nodeLabels) sync(ctx context.Context, nodes corev1client.NodeInterface, name string, cfg *machineconfig.Config) error {
	if cfg.Cluster == nil {
		return nil
	}
	want := cfg.Cluster.NodeLabels
	if maps.Equal(want, l.applied) {
		return nil
	}
	labels := map[string]any{}
	for k, v := range want {
		labels[k] = v
	}
	for k := range l.applied {
		if _, ok := want[k]; !ok {
			labels[k] = nil // a merge patch removes it
		}
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": labels}})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := nodes.Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("patch the Node's labels from the running machine config: %w", err)
	}
	l.log.Info("Node labels updated from the machine config", "labels", want, "were", l.applied)
	l.applied = maps.Clone(want)
	return nil
}
