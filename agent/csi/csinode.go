package csi

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"time"

	storagev1 "k8s.io/api/storage/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/cairn-os/cairn/internal/backoff"
)

// csiNodeResync is how often SyncCSINode writes the CSINode again when no
// driver came or went, should someone have changed it.
const csiNodeResync = time.Minute

// SyncCSINode keeps, through client (the node's), the CSINode object of
// the node listing the registered drivers — name, node ID, topology keys,
// how many volumes the node takes — and the Node's labels of the drivers'
// topology, as the kubelet does, until ctx ends. The scheduler and the
// external provisioner read them.
func (p *Plugins) SyncCSINode(ctx context.Context, client kubernetes.Interface) {
	b := backoff.Backoff{Initial: 500 * time.Millisecond, Max: 30 * time.Second, Jitter: 0.2}
	wait := time.Duration(0)
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.changed:
		case <-time.After(wait):
		}
		if err := p.syncCSINode(ctx, client); err != nil {
			if ctx.Err() != nil {
				return
			}
			wait = b.Next()
			p.log.Warn("cannot update the CSINode; retrying", "err", err, "in", wait.Round(time.Millisecond))
			continue
		}
		b.Reset()
		wait = csiNodeResync
	}
}

// syncCSINode writes the CSINode and the topology labels once.
func (p *Plugins) syncCSINode(ctx context.Context, client kubernetes.Interface) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	want, labels := p.csiNodeDrivers()
	if len(labels) > 0 {
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": labels}})
		if err != nil {
			return err
		}
		if _, err := client.CoreV1().Nodes().Patch(ctx, p.cfg.NodeName, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("label the Node with the drivers' topology: %w", err)
		}
	}
	csiNodes := client.StorageV1().CSINodes()
	cur, err := csiNodes.Get(ctx, p.cfg.NodeName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		node, err := client.CoreV1().Nodes().Get(ctx, p.cfg.NodeName, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("get Node: %w", err)
		}
		_, err = csiNodes.Create(ctx, &storagev1.CSINode{
			ObjectMeta: metav1.ObjectMeta{Name: p.cfg.NodeName, OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID,
			}}},
			Spec: storagev1.CSINodeSpec{Drivers: want},
		}, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("create CSINode: %w", err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("get CSINode: %w", err)
	}
	if apiequality.Semantic.DeepEqual(cur.Spec.Drivers, want) {
		return nil
	}
	cur.Spec.Drivers = want
	if _, err := csiNodes.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update CSINode: %w", err)
	}
	return nil
}

// csiNodeDrivers is the CSINode's list of the registered drivers, by
// name, and the Node labels of their topology.
func (p *Plugins) csiNodeDrivers() ([]storagev1.CSINodeDriver, map[string]string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	labels := map[string]string{}
	var out []storagev1.CSINodeDriver
	for _, name := range slices.Sorted(maps.Keys(p.drivers)) {
		d := p.drivers[name]
		cd := storagev1.CSINodeDriver{Name: d.name, NodeID: d.nodeID}
		if len(d.topology) > 0 {
			cd.TopologyKeys = slices.Sorted(maps.Keys(d.topology))
			maps.Copy(labels, d.topology)
		}
		if d.maxVolumes > 0 {
			n := int32(d.maxVolumes)
			cd.Allocatable = &storagev1.VolumeNodeResources{Count: &n}
		}
		out = append(out, cd)
	}
	if out == nil {
		out = []storagev1.CSINodeDriver{}
	}
	return out, labels
}
