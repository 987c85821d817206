package pods

import (
	"context"
	"os"
	"path/filepath"
	"time"

	"k8s.io/apimachinery/pkg/types"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cairn-os/cairn/internal/crilog"
)

// orphanLogsKeep is how long the container logs of a pod the node no
// longer has are kept after Cleanup first finds them: a while to read
// them once the pod is gone, and then the disk is freed.
const orphanLogsKeep = time.Minute

// listTimeout bounds Cleanup's listing of the runtime's sandboxes.
const listTimeout = 10 * time.Second

// Cleanup removes what pods the node no longer has left behind — their
// sandboxes, their volumes, their termination messages and,
// orphanLogsKeep after it first found them, their container logs —,
// those of pods deleted while the agent was not running among them. keep
// says which pods the node still has. Failures are logged: the next
// Cleanup tries again. Calls must not overlap.
func (w *Worker) Cleanup(ctx context.Context, keep func(types.UID) bool) {
	log := w.cfg.Log
	lctx, cancel := context.WithTimeout(ctx, listTimeout)
	resp, err := w.cfg.Runtime.ListPodSandbox(lctx, &criv1.ListPodSandboxRequest{})
	cancel()
	if err != nil {
		log.Warn("housekeeping: list sandboxes", "err", err)
		return
	}
	// Pods whose sandbox could not be removed: their containers may
	// still use their volumes.
	stuck := map[types.UID]bool{}
	kept := func(uid types.UID) bool { return stuck[uid] || keep(uid) }
	for _, sb := range resp.Items {
		uid := types.UID(sb.Labels[LabelPodUID])
		if uid == "" || keep(uid) {
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, time.Minute)
		_, err := w.cfg.Runtime.StopPodSandbox(rctx, &criv1.StopPodSandboxRequest{PodSandboxId: sb.Id})
		if err == nil {
			_, err = w.cfg.Runtime.RemovePodSandbox(rctx, &criv1.RemovePodSandboxRequest{PodSandboxId: sb.Id})
		}
		cancel()
		if err != nil {
			log.Warn("housekeeping: remove sandbox of a pod the node no longer has", "sandbox", sb.Id, "uid", uid, "err", err)
			stuck[uid] = true
			continue
		}
		log.Info("housekeeping: removed sandbox of a pod the node no longer has", "sandbox", sb.Id, "uid", uid,
			"pod", sb.GetMetadata().GetNamespace()+"/"+sb.GetMetadata().GetName())
	}
	w.removeOrphanVolumes(kept)
	w.removeOrphanPodFiles(kept)
	w.removeOrphanLogs(kept, w.now())
}

// removeOrphanVolumes removes the volumes of the pods that keep does not
// keep.
func (w *Worker) removeOrphanVolumes(keep func(types.UID) bool) {
	if w.cfg.Volumes == nil {
		return
	}
	log := w.cfg.Log
	uids, err := w.cfg.Volumes.Pods()
	if err != nil {
		log.Warn("housekeeping: list pod volumes", "err", err)
		return
	}
	for _, uid := range uids {
		if keep(uid) {
			continue
		}
		if err := w.cfg.Volumes.TearDown(uid); err != nil {
			log.Warn("housekeeping: remove volumes of a pod the node no longer has", "uid", uid, "err", err)
			continue
		}
		log.Info("housekeeping: removed volumes of a pod the node no longer has", "uid", uid)
	}
}

// removeOrphanLogs removes the log directories of the pods that keep does
// not keep, orphanLogsKeep after it first saw them orphaned.
func (w *Worker) removeOrphanLogs(keep func(types.UID) bool, now time.Time) {
	log := w.cfg.Log
	root := w.cfg.LogRoot
	ents, err := os.ReadDir(root)
	if err != nil {
		if !os.IsNotExist(err) {
			log.Warn("housekeeping: list pod logs", "err", err)
		}
		return
	}
	w.orphanLogsMu.Lock()
	defer w.orphanLogsMu.Unlock()
	seen := map[types.UID]bool{}
	for _, e := range ents {
		id, ok := crilog.PodUID(e.Name())
		uid := types.UID(id)
		if !ok || !e.IsDir() || keep(uid) {
			continue
		}
		seen[uid] = true
		since, ok := w.orphanLogs[uid]
		if !ok {
			w.orphanLogs[uid] = now
			continue
		}
		if now.Sub(since) < orphanLogsKeep {
			continue
		}
		if err := os.RemoveAll(filepath.Join(root, e.Name())); err != nil {
			log.Warn("housekeeping: remove logs of a pod the node no longer has", "uid", uid, "err", err)
			continue
		}
		log.Info("housekeeping: removed logs of a pod the node no longer has", "dir", e.Name())
	}
	for uid := range w.orphanLogs {
		if !seen[uid] {
			delete(w.orphanLogs, uid)
		}
	}
}
