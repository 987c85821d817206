package kubelet

import (
	"os"
	"path/filepath"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/cairn-os/cairn/internal/crilog"
)

// orphanLogsKeep is how long the container logs of a pod the node no
// longer has are kept after housekeeping first finds them: a while to read
// them once the pod is gone, and then the disk is freed.
const orphanLogsKeep = time.Minute

// removeOrphanLogs removes the log directories of pods that neither the
// API nor a pod goroutine knows, orphanLogsKeep after it first saw them
// orphaned.
func (s *podSyncer) removeOrphanLogs(known map[types.UID]bool, now time.Time) {
	root := s.k.cfg.Pods.LogRoot
	ents, err := os.ReadDir(root)
	if err != nil {
		if !os.IsNotExist(err) {
			s.k.log.Warn("housekeeping: list pod logs", "err", err)
		}
		return
	}
	seen := map[types.UID]bool{}
	for _, e := range ents {
		id, ok := crilog.PodUID(e.Name())
		uid := types.UID(id)
		if !ok || !e.IsDir() || s.keep(known, uid) {
			continue
		}
		seen[uid] = true
		since, ok := s.orphanLogs[uid]
		if !ok {
			s.orphanLogs[uid] = now
			continue
		}
		if now.Sub(since) < orphanLogsKeep {
			continue
		}
		if err := os.RemoveAll(filepath.Join(root, e.Name())); err != nil {
			s.k.log.Warn("housekeeping: remove logs of a pod the node no longer has", "uid", uid, "err", err)
			continue
		}
		s.k.log.Info("housekeeping: removed logs of a pod the node no longer has", "dir", e.Name())
	}
	for uid := range s.orphanLogs {
		if !seen[uid] {
			delete(s.orphanLogs, uid)
		}
	}
}
