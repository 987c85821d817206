package kubelet

import (
	"context"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// podVolumes is what the pod sync loop asks of the worker's Volumes
// beyond Setup; volumes.Manager does it.
type podVolumes interface {
	// Refresh renews what is due of the pod's volumes: tokens before they
	// expire, ConfigMaps and Secrets that changed.
	Refresh(ctx context.Context, pod *corev1.Pod) error
	// TearDown removes the pod's volumes once its containers are gone.
	TearDown(uid types.UID) error
	// Pods lists the pods that have volumes.
	Pods() ([]types.UID, error)
}

// refreshVolumes refreshes the volumes of a pod that runs. A failure is
// only logged: the containers keep what was written, and the volumes
// retry on a later sync.
func (s *podSyncer) refreshVolumes(ctx context.Context, pod *corev1.Pod, log *slog.Logger) {
	v, ok := s.k.cfg.Pods.Volumes.(podVolumes)
	if !ok {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := v.Refresh(rctx, pod); err != nil && ctx.Err() == nil {
		log.Warn("refresh the pod's volumes", "err", err)
	}
}

// tearDownVolumes removes the volumes of a pod that was killed.
func (s *podSyncer) tearDownVolumes(uid types.UID) error {
	if v, ok := s.k.cfg.Pods.Volumes.(podVolumes); ok {
		return v.TearDown(uid)
	}
	return nil
}

// removeOrphanVolumes removes the volumes of pods that neither the API
// nor a pod goroutine knows: deleted while the agent was not running.
func (s *podSyncer) removeOrphanVolumes(known map[types.UID]bool) {
	v, ok := s.k.cfg.Pods.Volumes.(podVolumes)
	if !ok {
		return
	}
	uids, err := v.Pods()
	if err != nil {
		s.k.log.Warn("housekeeping: list pod volumes", "err", err)
		return
	}
	for _, uid := range uids {
		if s.keep(known, uid) {
			continue
		}
		if err := v.TearDown(uid); err != nil {
			s.k.log.Warn("housekeeping: remove volumes of a pod the node no longer has", "uid", uid, "err", err)
			continue
		}
		s.k.log.Info("housekeeping: removed volumes of a pod the node no longer has", "uid", uid)
	}
}
