package server

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
)

// StatsProvider reads the node's resource usage (agent/kubelet/stats),
// the one source of /stats/summary and /metrics/resource.
type StatsProvider interface {
	// Summary reads the node's, pods' and containers' usage; with
	// onlyCPUAndMemory, no filesystems or networks.
	Summary(ctx context.Context, onlyCPUAndMemory bool) (*statsv1alpha1.Summary, error)
}

// statsTimeout bounds a reading of the stats: a runtime that hangs makes
// the request fail rather than hang with it.
const statsTimeout = 10 * time.Second

// statsSummary answers the kubelet's /stats/summary.
func (s *server) statsSummary(w http.ResponseWriter, r *http.Request) {
	var errs []error
	only := queryBool(r.URL.Query(), "only_cpu_and_memory", &errs)
	if len(errs) > 0 {
		http.Error(w, errors.Join(errs...).Error(), http.StatusBadRequest)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), statsTimeout)
	defer cancel()
	sum, err := s.cfg.Stats.Summary(ctx, only)
	if err != nil {
		s.cfg.Log.Warn("kubelet server: no stats summary", "err", err)
		http.Error(w, "read the node's stats: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(sum); err != nil {
		s.cfg.Log.Debug("kubelet server: /stats/summary not sent", "err", err)
	}
}
