package server

import (
	"context"
	"log/slog"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
)

// The kubelet's resource metrics, by its names and labels: what
// metrics-server reads for kubectl top.
var (
	nodeCPUDesc = prometheus.NewDesc("node_cpu_usage_seconds_total",
		"CPU time the node spent, in core-seconds.", nil, nil)
	nodeMemoryDesc = prometheus.NewDesc("node_memory_working_set_bytes",
		"The node's memory in use that the kernel cannot drop, in bytes.", nil, nil)
	podCPUDesc = prometheus.NewDesc("pod_cpu_usage_seconds_total",
		"CPU time the pod spent, in core-seconds.", []string{"pod", "namespace"}, nil)
	podMemoryDesc = prometheus.NewDesc("pod_memory_working_set_bytes",
		"The pod's memory in use that the kernel cannot drop, in bytes.", []string{"pod", "namespace"}, nil)
	containerCPUDesc = prometheus.NewDesc("container_cpu_usage_seconds_total",
		"CPU time the container spent, in core-seconds.", []string{"container", "pod", "namespace"}, nil)
	containerMemoryDesc = prometheus.NewDesc("container_memory_working_set_bytes",
		"The container's memory in use that the kernel cannot drop, in bytes.", []string{"container", "pod", "namespace"}, nil)
	containerStartDesc = prometheus.NewDesc("container_start_time_seconds",
		"When the container started, in seconds since the epoch.", []string{"container", "pod", "namespace"}, nil)
	// The kubelet has both names: scrape_error is the older one.
	scrapeErrorDesc = prometheus.NewDesc("scrape_error",
		"1 if the stats could not be read, else 0.", nil, nil)
	resourceScrapeErrorDesc = prometheus.NewDesc("resource_scrape_error",
		"1 if the stats could not be read, else 0.", nil, nil)
)

// resourceMetrics answers the kubelet's /metrics/resource: the CPU and
// memory of /stats/summary in Prometheus' text format.
func (s *server) resourceMetrics(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), statsTimeout)
	defer cancel()
	// A registry per request, so that the collector reads with the
	// request's context.
	reg := prometheus.NewRegistry()
	reg.MustRegister(&resourceCollector{ctx: ctx, stats: s.cfg.Stats, log: s.cfg.Log})
	promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(s.cfg.Log.Handler(), slog.LevelWarn)}).ServeHTTP(w, r)
}

// resourceCollector collects the resource metrics from one Summary.
type resourceCollector struct {
	ctx   context.Context
	stats StatsProvider
	log   *slog.Logger
}

func (c *resourceCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{nodeCPUDesc, nodeMemoryDesc, podCPUDesc, podMemoryDesc,
		containerCPUDesc, containerMemoryDesc, containerStartDesc, scrapeErrorDesc, resourceScrapeErrorDesc} {
		ch <- d
	}
}

// Collect reads the stats once. As the kubelet's, a failed reading is
// scrape_error 1 and no other sample, not a failed scrape.
func (c *resourceCollector) Collect(ch chan<- prometheus.Metric) {
	sum, err := c.stats.Summary(c.ctx, true)
	failed := 0.0
	if err != nil {
		c.log.Warn("kubelet server: no resource metrics", "err", err)
		failed = 1
	}
	ch <- prometheus.MustNewConstMetric(scrapeErrorDesc, prometheus.GaugeValue, failed)
	ch <- prometheus.MustNewConstMetric(resourceScrapeErrorDesc, prometheus.GaugeValue, failed)
	if err != nil {
		return
	}
	collectCPU(ch, nodeCPUDesc, sum.Node.CPU)
	collectMemory(ch, nodeMemoryDesc, sum.Node.Memory)
	for _, p := range sum.Pods {
		collectCPU(ch, podCPUDesc, p.CPU, p.PodRef.Name, p.PodRef.Namespace)
		collectMemory(ch, podMemoryDesc, p.Memory, p.PodRef.Name, p.PodRef.Namespace)
		for _, ct := range p.Containers {
			labels := []string{ct.Name, p.PodRef.Name, p.PodRef.Namespace}
			ch <- sampleAt(ct.StartTime, prometheus.MustNewConstMetric(containerStartDesc, prometheus.GaugeValue,
				float64(ct.StartTime.UnixNano())/1e9, labels...))
			collectCPU(ch, containerCPUDesc, ct.CPU, labels...)
			collectMemory(ch, containerMemoryDesc, ct.Memory, labels...)
		}
	}
}

func collectCPU(ch chan<- prometheus.Metric, d *prometheus.Desc, s *statsv1alpha1.CPUStats, labels ...string) {
	if s == nil || s.UsageCoreNanoSeconds == nil {
		return
	}
	ch <- sampleAt(s.Time, prometheus.MustNewConstMetric(d, prometheus.CounterValue,
		float64(*s.UsageCoreNanoSeconds)/1e9, labels...))
}

func collectMemory(ch chan<- prometheus.Metric, d *prometheus.Desc, s *statsv1alpha1.MemoryStats, labels ...string) {
	if s == nil || s.WorkingSetBytes == nil {
		return
	}
	ch <- sampleAt(s.Time, prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(*s.WorkingSetBytes), labels...))
}

// sampleAt stamps m with the time of its reading, as the kubelet does:
// metrics-server computes rates between the stamps, not the scrapes.
func sampleAt(t metav1.Time, m prometheus.Metric) prometheus.Metric {
	if t.IsZero() {
		return m
	}
	return prometheus.NewMetricWithTimestamp(t.Time, m)
}
