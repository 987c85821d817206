package csi

import (
	"context"
	"fmt"
	"slices"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Expand finishes on the node the expansion of the claim that v, a
// volume of pod that SetUp mounted, mounts, once the cluster has grown
// it: the resizer has grown the PersistentVolume and left the claim's
// storage NodeResizePending (or, a resizer of before
// allocatedResourceStatuses, its FileSystemResizePending condition). It
// calls NodeExpandVolume if the driver expands on nodes, and records the
// new capacity in the claim's status, as the kubelet does. A claim with
// nothing pending costs two reads.
func (p *Plugins) Expand(ctx context.Context, client kubernetes.Interface, pod *corev1.Pod, v *corev1.Volume) error {
	if v.CSI != nil {
		return nil // inline: no claim to grow
	}
	src, c, err := p.source(ctx, client, pod, v)
	if err != nil {
		return err
	}
	if _, pending := resizePending(c); !pending {
		return nil
	}
	d, err := p.driver(src.driver)
	if err != nil {
		return err
	}
	lock := p.volumeLock(src.uniqueName())
	lock.Lock()
	defer lock.Unlock()
	ctx, cancel := context.WithTimeout(ctx, p.cfg.CallTimeout)
	defer cancel()
	var staging string
	if d.stages {
		staging = p.stagingPath(src.driver, src.handle, src.block)
	}
	return p.expand(ctx, client, d, src, c, staging, target(p.dir(pod.UID, src.specName, src.block), src.block))
}

// resizePending returns the size the claim of c is to have on the node,
// and whether the node is yet to grow it to that.
func resizePending(c *claim) (size int64, pending bool) {
	want, ok := c.pv.Spec.Capacity[corev1.ResourceStorage]
	if !ok {
		return 0, false
	}
	switch c.pvc.Status.AllocatedResourceStatuses[corev1.ResourceStorage] {
	case corev1.PersistentVolumeClaimNodeResizePending, corev1.PersistentVolumeClaimNodeResizeInProgress:
		return want.Value(), true
	}
	has := c.pvc.Status.Capacity[corev1.ResourceStorage]
	legacy := slices.ContainsFunc(c.pvc.Status.Conditions, func(cond corev1.PersistentVolumeClaimCondition) bool {
		return cond.Type == corev1.PersistentVolumeClaimFileSystemResizePending
	})
	return want.Value(), legacy && has.Cmp(want) < 0
}

// expand grows the volume of src, claimed by c, published at target
// (and staged at staging, if the driver stages) if the claim is pending
// a resize on the node, and tells the claim's status how it went.
func (p *Plugins) expand(ctx context.Context, client kubernetes.Interface, d *driver, src *source, c *claim, staging, target string) error {
	size, pending := resizePending(c)
	if !pending {
		return nil
	}
	pvc := c.pvc.DeepCopy()
	var took time.Duration
	if d.expands {
		setResizeStatus(pvc, corev1.PersistentVolumeClaimNodeResizeInProgress)
		var err error
		if pvc, err = updateClaimStatus(ctx, client, pvc); err != nil {
			return err
		}
		start := time.Now()
		_, err = d.node.NodeExpandVolume(ctx, &csipb.NodeExpandVolumeRequest{
			VolumeId: src.handle, VolumePath: target, StagingTargetPath: staging,
			CapacityRange: &csipb.CapacityRange{RequiredBytes: size}, VolumeCapability: src.capability,
		})
		took = time.Since(start)
		p.observe(d.name, "NodeExpandVolume", start, err)
		if err != nil {
			err = fmt.Errorf("MountVolume.NodeExpandVolume failed for volume %q: %w", src.specName, err)
			// A driver that refuses the size will refuse it again; any
			// other error is tried again at the next sync.
			if code := status.Code(err); code == codes.InvalidArgument || code == codes.OutOfRange {
				setResizeStatus(pvc, corev1.PersistentVolumeClaimNodeResizeInfeasible)
			}
			setClaimCondition(pvc, corev1.PersistentVolumeClaimNodeResizeError, err.Error())
			if _, uerr := updateClaimStatus(ctx, client, pvc); uerr != nil {
				p.log.Warn("record a failed expansion", "claim", pvc.Namespace+"/"+pvc.Name, "err", uerr)
			}
			return err
		}
	}
	if pvc.Status.Capacity == nil {
		pvc.Status.Capacity = corev1.ResourceList{}
	}
	pvc.Status.Capacity[corev1.ResourceStorage] = c.pv.Spec.Capacity[corev1.ResourceStorage]
	delete(pvc.Status.AllocatedResourceStatuses, corev1.ResourceStorage)
	pvc.Status.Conditions = slices.DeleteFunc(pvc.Status.Conditions, func(cond corev1.PersistentVolumeClaimCondition) bool {
		switch cond.Type {
		case corev1.PersistentVolumeClaimResizing, corev1.PersistentVolumeClaimFileSystemResizePending, corev1.PersistentVolumeClaimNodeResizeError:
			return true
		}
		return false
	})
	if _, err := updateClaimStatus(ctx, client, pvc); err != nil {
		return err
	}
	p.log.Info("expanded CSI volume", "driver", d.name, "volume", src.handle, "claim", pvc.Namespace+"/"+pvc.Name,
		"bytes", size, "nodeExpand", d.expands, "took", took)
	return nil
}

func setResizeStatus(pvc *corev1.PersistentVolumeClaim, s corev1.ClaimResourceStatus) {
	if pvc.Status.AllocatedResourceStatuses == nil {
		pvc.Status.AllocatedResourceStatuses = map[corev1.ResourceName]corev1.ClaimResourceStatus{}
	}
	pvc.Status.AllocatedResourceStatuses[corev1.ResourceStorage] = s
}

// setClaimCondition sets the condition t of pvc, true, with msg.
func setClaimCondition(pvc *corev1.PersistentVolumeClaim, t corev1.PersistentVolumeClaimConditionType, msg string) {
	cond := corev1.PersistentVolumeClaimCondition{Type: t, Status: corev1.ConditionTrue, Message: msg, LastTransitionTime: metav1.Now()}
	for i := range pvc.Status.Conditions {
		if pvc.Status.Conditions[i].Type == t {
			pvc.Status.Conditions[i] = cond
			return
		}
	}
	pvc.Status.Conditions = append(pvc.Status.Conditions, cond)
}

func updateClaimStatus(ctx context.Context, client kubernetes.Interface, pvc *corev1.PersistentVolumeClaim) (*corev1.PersistentVolumeClaim, error) {
	out, err := client.CoreV1().PersistentVolumeClaims(pvc.Namespace).UpdateStatus(ctx, pvc, metav1.UpdateOptions{})
	if err != nil {
		return nil, fmt.Errorf("update the status of PVC %s/%s: %w", pvc.Namespace, pvc.Name, err)
	}
	return out, nil
}
