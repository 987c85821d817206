package kubelet

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the kubelet part's own Prometheus metrics; the CRI client
// measures its calls itself (cri.WithMetrics).
type metrics struct {
	podStart      prometheus.Histogram
	leaseRenewals *prometheus.CounterVec
	wakeups       *prometheus.CounterVec
}

// newMetrics registers the metrics with reg; nil keeps them unregistered.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	const ns, sub = "cairn", "kubelet"
	m := &metrics{
		podStart: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "pod_start_duration_seconds",
			Help:    "Time from the node first seeing a pod to reporting it Running.",
			Buckets: []float64{0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 20, 30, 60, 120, 300},
		}),
		leaseRenewals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "lease_renewals_total",
			Help: "Renewals of the node's Lease, by result (success or failure).",
		}, []string{"result"}),
		wakeups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "pod_worker_wakeups_total",
			Help: "Syncs of pods, by what woke the pod's worker (a sync asked for by several counts for each): " +
				"pod (the Pod object was added, its spec changed or it is being deleted), " +
				"event (a CRI container event), relist (the runtime's periodic list), probe (a probe's result changed), " +
				"conflict (a status write met a newer Pod), resync (the pod resync period passed), backoff (a container's back-off ended) " +
				"or retry (after a failed sync).",
		}, []string{"source"}),
	}
	if reg == nil {
		return m, nil
	}
	var err error
	if m.podStart, err = register(reg, m.podStart); err != nil {
		return nil, err
	}
	if m.leaseRenewals, err = register(reg, m.leaseRenewals); err != nil {
		return nil, err
	}
	if m.wakeups, err = register(reg, m.wakeups); err != nil {
		return nil, err
	}
	return m, nil
}

// register registers c with reg, or returns the same collector that an
// earlier run registered: the counts go on across runs in one process.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	err := reg.Register(c)
	var dup prometheus.AlreadyRegisteredError
	if errors.As(err, &dup) {
		if existing, ok := dup.ExistingCollector.(C); ok {
			return existing, nil
		}
	}
	return c, err
}

// leaseRenewed counts one renewal of the Lease.
func (m *metrics) leaseRenewed(err error) {
	result := "success"
	if err != nil {
		result = "failure"
	}
	m.leaseRenewals.WithLabelValues(result).Inc()
}

// podStarted records how long a pod took from being seen to Running.
func (m *metrics) podStarted(seen time.Time) {
	m.podStart.Observe(time.Since(seen).Seconds())
}

// woke counts one sync of a pod, woken by source.
func (m *metrics) woke(source wakeSource) {
	m.wakeups.WithLabelValues(string(source)).Inc()
}
