package proxy

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Stats is a snapshot of the proxier's work, for tests and the agent's API.
type Stats struct {
	Syncs            uint64        // successful syncs, full or not
	FullSyncs        uint64        // successful full syncs
	Errors           uint64        // failed syncs
	LastSync         time.Time     // end of the last successful sync
	LastSyncDuration time.Duration // of the last successful sync
	Chains           int           // in the table after the last successful sync
	Rules            int
	Elements         int // static set and map elements (not affinity entries)
	ConntrackDeleted uint64
	Events           uint64 // Warning Events recorded on Services
}

// metrics keeps Stats and the same numbers as Prometheus metrics; the
// Proxier is a prometheus.Collector through it, so the agent registers the
// proxier with whatever registry it serves.
type metrics struct {
	mu    sync.Mutex
	stats Stats

	syncDuration *prometheus.HistogramVec
	rules        prometheus.Gauge
	elements     prometheus.Gauge
	chains       prometheus.Gauge
	lastSync     prometheus.Gauge
	errors       prometheus.Counter
	conntrack    prometheus.Counter
	events       prometheus.Counter
}

func newMetrics() *metrics {
	const ns, sub = "cairn", "proxy"
	return &metrics{
		syncDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "sync_duration_seconds",
			Help:    "Time to compute and write one sync of the Service table, by kind (full or partial).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 15),
		}, []string{"kind"}),
		rules: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "rules",
			Help: "Rules in the Service table after the last successful sync.",
		}),
		elements: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "set_elements",
			Help: "Static set and map elements in the Service table after the last successful sync.",
		}),
		chains: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "chains",
			Help: "Chains in the Service table after the last successful sync.",
		}),
		lastSync: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "last_sync_timestamp_seconds",
			Help: "Unix time of the last successful sync.",
		}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "sync_errors_total",
			Help: "Syncs that failed; the next one is a full sync.",
		}),
		conntrack: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "conntrack_entries_deleted_total",
			Help: "Stale UDP conntrack entries deleted after endpoint changes.",
		}),
		events: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "service_events_total",
			Help: "Warning Events recorded on Services for fields the dataplane cannot honour.",
		}),
	}
}

func (m *metrics) synced(full bool, d time.Duration, chains, rules, elems int) {
	kind := "partial"
	if full {
		kind = "full"
	}
	m.syncDuration.WithLabelValues(kind).Observe(d.Seconds())
	now := time.Now()
	m.rules.Set(float64(rules))
	m.elements.Set(float64(elems))
	m.chains.Set(float64(chains))
	m.lastSync.Set(float64(now.UnixNano()) / 1e9)
	m.mu.Lock()
	defer m.mu.Unlock()
	m.stats.Syncs++
	if full {
		m.stats.FullSyncs++
	}
	m.stats.LastSync, m.stats.LastSyncDuration = now, d
	m.stats.Chains, m.stats.Rules, m.stats.Elements = chains, rules, elems
}

func (m *metrics) failed() {
	m.errors.Inc()
	m.mu.Lock()
	m.stats.Errors++
	m.mu.Unlock()
}

func (m *metrics) conntrackDeleted(n uint) {
	m.conntrack.Add(float64(n))
	m.mu.Lock()
	m.stats.ConntrackDeleted += uint64(n)
	m.mu.Unlock()
}

func (m *metrics) evented() {
	m.events.Inc()
	m.mu.Lock()
	m.stats.Events++
	m.mu.Unlock()
}

func (m *metrics) snapshot() Stats {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.stats
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.syncDuration, m.rules, m.elements, m.chains, m.lastSync, m.errors, m.conntrack, m.events}
}
