package server

import (
	"log/slog"
	"net/http"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metricsRoutes serves the agent's Prometheus registry at /metrics and
// the probes' counts in the kubelet's format at /metrics/probes, those
// that the Config has.
func (s *server) metricsRoutes(mux *http.ServeMux) {
	opts := promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(s.cfg.Log.Handler(), slog.LevelWarn)}
	if s.cfg.Metrics != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(s.cfg.Metrics, opts))
	}
	if s.cfg.ProbeMetrics != nil {
		mux.Handle("GET /metrics/probes", promhttp.HandlerFor(s.cfg.ProbeMetrics, opts))
	}
}
