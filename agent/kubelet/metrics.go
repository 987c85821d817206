package kubelet

import (
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/cairn-os/cairn/agent/kubelet/probe"
	"github.com/cairn-os/cairn/agent/node"
)

// metrics are the pod loop's own Prometheus metrics; the CRI client
// measures its calls itself (cri.WithMetrics), the membership the Lease's
// renewals.
type metrics struct {
	podStart prometheus.Histogram
	wakeups  *prometheus.CounterVec
	probes   *prometheus.CounterVec
	// prober counts the probes' runs per container with the kubelet's
	// name and labels, for what reads the kubelet's /metrics/probes.
	prober *prometheus.CounterVec
}

// newMetrics registers the metrics with reg and the kubelet-format probe
// counter with probeReg; nil keeps them unregistered.
func newMetrics(reg, probeReg prometheus.Registerer) (*metrics, error) {
	const ns, sub = "cairn", "kubelet"
	m := &metrics{
		podStart: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "pod_start_duration_seconds",
			Help:    "Time from the node first seeing a pod to reporting it Running.",
			Buckets: []float64{0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 20, 30, 60, 120, 300},
		}),
		wakeups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "pod_worker_wakeups_total",
			Help: "Syncs of pods, by what woke the pod's worker (a sync asked for by several counts for each): " +
				"pod (the Pod object was added, its spec changed or it is being deleted), " +
				"event (a CRI container event), relist (the runtime's periodic list), probe (a probe's result changed), " +
				"conflict (a status write met a newer Pod), resync (the pod resync period passed), backoff (a container's back-off ended), " +
				"deadline (the pod's activeDeadlineSeconds passed) " +
				"or retry (after a failed sync).",
		}, []string{"source"}),
		probes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "probe_runs_total",
			Help: "Runs of containers' probes, by kind (startup, liveness or readiness) and result (success or failure).",
		}, []string{"kind", "result"}),
		prober: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prober_probe_total",
			Help: "Runs of containers' probes by probe type (Startup, Liveness or Readiness), result (successful or failed) and container.",
		}, []string{"probe_type", "result", "container", "pod", "namespace", "pod_uid"}),
	}
	var err error
	if probeReg != nil {
		if m.prober, err = node.RegisterOnce(probeReg, m.prober); err != nil {
			return nil, err
		}
	}
	if reg == nil {
		return m, nil
	}
	if m.podStart, err = node.RegisterOnce(reg, m.podStart); err != nil {
		return nil, err
	}
	if m.wakeups, err = node.RegisterOnce(reg, m.wakeups); err != nil {
		return nil, err
	}
	if m.probes, err = node.RegisterOnce(reg, m.probes); err != nil {
		return nil, err
	}
	return m, nil
}

// podStarted records how long a pod took from being seen to Running.
func (m *metrics) podStarted(seen time.Time) {
	m.podStart.Observe(time.Since(seen).Seconds())
}

// woke counts one sync of a pod, woken by source.
func (m *metrics) woke(source wakeSource) {
	m.wakeups.WithLabelValues(string(source)).Inc()
}

// probed counts one run of a probe of kind of pod's container, failed if
// err is set.
func (m *metrics) probed(pod *corev1.Pod, container string, kind probe.Kind, err error) {
	result, proberResult := "success", "successful"
	if err != nil {
		result, proberResult = "failure", "failed"
	}
	m.probes.WithLabelValues(string(kind), result).Inc()
	probeType := strings.ToUpper(string(kind[:1])) + string(kind[1:]) // the kubelet's Liveness
	m.prober.WithLabelValues(probeType, proberResult, container, pod.Name, pod.Namespace, string(pod.UID)).Inc()
}

// podGone drops the probe counts of the pod uid, whose worker ended.
func (m *metrics) podGone(uid types.UID) {
	m.prober.DeletePartialMatch(prometheus.Labels{"pod_uid": string(uid)})
}
