package node

import (
	"context"
	"fmt"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordclient "k8s.io/client-go/kubernetes/typed/coordination/v1"

	"github.com/cairn-os/cairn/internal/backoff"
)

// leaseDuration is how long the control plane waits for a renewal before
// it takes the node for lost.
const leaseDuration = 40 * time.Second

// renewLease renews the node's Lease in kube-node-lease every
// LeaseInterval until ctx ends; the Lease is the node's heartbeat. After a
// failure it retries sooner, from 200 ms doubling up to LeaseInterval.
// node is the registered Node, which owns the Lease: deleting the Node
// deletes it.
func (j *joiner) renewLease(ctx context.Context, node *corev1.Node) {
	leases := j.client.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	var lease *coordv1.Lease
	b := backoff.Backoff{Initial: 200 * time.Millisecond, Max: j.cfg.LeaseInterval, Jitter: 0.2}
	for {
		var err error
		wait := j.cfg.LeaseInterval
		lease, err = j.renewLeaseOnce(ctx, leases, lease, node)
		if ctx.Err() != nil {
			return
		}
		j.metrics.leaseRenewed(err)
		if err != nil {
			wait = b.Next()
			j.log.Warn("cannot renew the Lease; retrying", "err", err, "in", wait.Round(time.Millisecond))
		} else if b.Reset() {
			j.log.Info("renewed the Lease again")
		}
		if backoff.Sleep(ctx, backoff.RealClock, wait) != nil {
			return
		}
	}
}

// renewLeaseOnce updates lease (nil: get it, or create it) with the
// current time and returns it as stored. On an error (a conflict among
// them) it returns nil, so that the next try gets the Lease anew.
func (j *joiner) renewLeaseOnce(ctx context.Context, leases coordclient.LeaseInterface, lease *coordv1.Lease, node *corev1.Node) (*coordv1.Lease, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	if lease == nil {
		var err error
		lease, err = leases.Get(ctx, j.cfg.NodeName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			lease = &coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: j.cfg.NodeName, Namespace: corev1.NamespaceNodeLease}}
			j.setLease(lease, node)
			if lease, err = leases.Create(ctx, lease, metav1.CreateOptions{}); err != nil {
				return nil, fmt.Errorf("create Lease: %w", err)
			}
			return lease, nil
		}
		if err != nil {
			return nil, fmt.Errorf("get Lease: %w", err)
		}
	}
	lease = lease.DeepCopy()
	j.setLease(lease, node)
	updated, err := leases.Update(ctx, lease, metav1.UpdateOptions{})
	if err != nil {
		return nil, fmt.Errorf("update Lease: %w", err)
	}
	return updated, nil
}

// setLease makes l the node's, renewed now.
func (j *joiner) setLease(l *coordv1.Lease, node *corev1.Node) {
	holder, seconds := j.cfg.NodeName, int32(leaseDuration/time.Second)
	l.Spec.HolderIdentity = &holder
	l.Spec.LeaseDurationSeconds = &seconds
	l.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
	l.OwnerReferences = []metav1.OwnerReference{{
		APIVersion: corev1.SchemeGroupVersion.String(), Kind: "Node", Name: node.Name, UID: node.UID,
	}}
}
