package node

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the membership's own Prometheus metrics. They keep the
// kubelet subsystem they had when the kubelet part did all of the node's
// work, so that dashboards go on.
type metrics struct {
	leaseRenewals *prometheus.CounterVec
}

// newMetrics registers the metrics with reg; nil keeps them unregistered.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		leaseRenewals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "cairn", Subsystem: "kubelet", Name: "lease_renewals_total",
			Help: "Renewals of the node's Lease, by result (success or failure).",
		}, []string{"result"}),
	}
	if reg == nil {
		return m, nil
	}
	var err error
	if m.leaseRenewals, err = RegisterOnce(reg, m.leaseRenewals); err != nil {
		return nil, err
	}
	return m, nil
}

// RegisterOnce registers c with reg, or returns the same collector that an
// earlier run registered: the counts of the agent's parts go on across
// their restarts in one process.
func RegisterOnce[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
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
