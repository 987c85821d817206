package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"

	"github.com/cairn-os/cairn/agent/kubelet/cri"
	"github.com/cairn-os/cairn/agent/kubelet/stats"
	"github.com/cairn-os/cairn/test/poll"
)

// hostIP is an IPv4 address of the host that is not loopback.
func hostIP(t *testing.T) netip.Addr {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Is4() && p.Addr().IsGlobalUnicast() {
			return p.Addr()
		}
	}
	t.Fatalf("no IPv4 address but loopback in %v: the API server's node proxy needs one to reach the node", addrs)
	return netip.Addr{}
}

// proxy is a GET of path on the node's kubelet server through the API
// server's node proxy.
func (n *criNode) proxy(path ...string) *rest.Request {
	return n.c.Client.CoreV1().RESTClient().Get().AbsPath(append([]string{"/api/v1/nodes", n.name, "proxy"}, path...)...)
}

// What the burning pod uses at least: it holds 48 MiB and keeps half a
// core busy, which a shared machine may slow down but not to nothing.
const (
	burnHoldMiB   = 48
	minWorkingSet = 40 << 20
	minNanoCores  = 10_000_000 // 10m
)

// TestStatsFromContainerd reads the stats of a pod that burns CPU and
// holds memory on a node whose pods run in a real containerd, through the
// API server's node proxy as metrics-server and kubectl do: the CPU rate
// and working set of its container, of the pod and of the node in
// /stats/summary and /metrics/resource.
func TestStatsFromContainerd(t *testing.T) {
	n := startCRINode(t)
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	image := n.image(t, ctx, "./agent/kubelet/server/testdata/burn")
	// A node without pods answers too, before it has a log directory.
	poll.Until(t, time.Minute, "/stats/summary of the node without pods", func() error {
		b, err := n.proxy("stats", "summary").DoRaw(ctx)
		if err != nil {
			return fmt.Errorf("%w: %s", err, b)
		}
		var s statsv1alpha1.Summary
		if err := json.Unmarshal(b, &s); err != nil || s.Node.Fs == nil || len(s.Pods) != 0 {
			return fmt.Errorf("summary %s (%v), want the node's fs and no pods", b, err)
		}
		return nil
	})
	n.createPod(t, ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "burn"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "burn", Image: image,
			Env: []corev1.EnvVar{{Name: "HOLD_MIB", Value: fmt.Sprint(burnHoldMiB)}},
		}}},
	})

	summary := func(only bool) (*statsv1alpha1.Summary, *statsv1alpha1.PodStats, error) {
		b, err := n.proxy("stats", "summary").Param("only_cpu_and_memory", fmt.Sprint(only)).DoRaw(ctx)
		if err != nil {
			return nil, nil, fmt.Errorf("GET /stats/summary: %w: %s", err, b)
		}
		var s statsv1alpha1.Summary
		if err := json.Unmarshal(b, &s); err != nil {
			return nil, nil, fmt.Errorf("GET /stats/summary: %w", err)
		}
		for i, p := range s.Pods {
			if p.PodRef.Name == "burn" && p.PodRef.Namespace == n.ns {
				return &s, &s.Pods[i], nil
			}
		}
		return &s, nil, fmt.Errorf("no pod %s/burn in the summary's %d pods", n.ns, len(s.Pods))
	}
	// The rates need two readings, and the pod a while to start.
	poll.Until(t, 2*time.Minute, "the burning pod's CPU rate and working set in /stats/summary", func() error {
		s, p, err := summary(true)
		if err != nil {
			return err
		}
		if len(p.Containers) != 1 || p.Containers[0].Name != "burn" {
			return fmt.Errorf("pod's containers %+v, want burn", p.Containers)
		}
		return errors.Join(
			atLeast("the node's CPU", s.Node.CPU, minNanoCores),
			atLeastMemory("the node's memory", s.Node.Memory, minWorkingSet),
			atLeast("the pod's CPU", p.CPU, minNanoCores),
			atLeastMemory("the pod's memory", p.Memory, minWorkingSet),
			atLeast("the container's CPU", p.Containers[0].CPU, minNanoCores),
			atLeastMemory("the container's memory", p.Containers[0].Memory, minWorkingSet),
		)
	})

	// containerd counts the image and the writable layers every 10 s,
	// and the container prints its line once it holds its memory.
	var c statsv1alpha1.ContainerStats
	poll.Until(t, time.Minute, "the filesystem and network stats in /stats/summary", func() error {
		s, p, err := summary(false)
		if err != nil {
			return err
		}
		if s.Node.NodeName != n.name {
			return fmt.Errorf("summary's nodeName = %q, want %q", s.Node.NodeName, n.name)
		}
		c = p.Containers[0]
		var errs []error
		if s.Node.Runtime == nil {
			return fmt.Errorf("node's runtime = nil, want its image fs")
		}
		for _, fs := range []struct {
			what    string
			s       *statsv1alpha1.FsStats
			minUsed uint64
		}{
			{"node fs", s.Node.Fs, 1}, {"image fs", s.Node.Runtime.ImageFs, 1}, {"pod ephemeral storage", p.EphemeralStorage, 1},
			// The image's files are in the image, not the writable layer.
			{"container rootfs", c.Rootfs, 0}, {"container logs", c.Logs, 1},
		} {
			if fs.s == nil || fs.s.CapacityBytes == nil || *fs.s.CapacityBytes == 0 || fs.s.AvailableBytes == nil ||
				fs.s.UsedBytes == nil || *fs.s.UsedBytes < fs.minUsed {
				errs = append(errs, fmt.Errorf("%s = %s, want its capacity, available bytes and at least %d used",
					fs.what, show(fs.s), fs.minUsed))
			}
		}
		if s.Node.Network == nil || len(s.Node.Network.Interfaces) == 0 {
			errs = append(errs, fmt.Errorf("node network = %s, want the host's interfaces", show(s.Node.Network)))
		}
		if p.Network == nil || p.Network.Name != "eth0" || p.Network.RxBytes == nil {
			errs = append(errs, fmt.Errorf("pod network = %s, want its eth0's bytes", show(p.Network)))
		}
		return errors.Join(errs...)
	})
	if s, p, err := summary(true); err != nil {
		t.Error(err)
	} else if s.Node.Fs != nil || s.Node.Network != nil || p.Network != nil || p.Containers[0].Rootfs != nil || p.Containers[0].CPU == nil {
		t.Errorf("only_cpu_and_memory=true gave node %s, pod %s; want CPU and memory only", show(s.Node), show(p))
	}

	// The figure: how long a read takes through the API server's proxy.
	for _, path := range [][]string{{"stats", "summary"}, {"metrics", "resource"}} {
		var took []time.Duration
		for range 5 {
			start := time.Now()
			if b, err := n.proxy(path...).DoRaw(ctx); err != nil {
				t.Fatalf("GET %v: %v: %s", path, err, b)
			}
			took = append(took, time.Since(start))
		}
		slices.Sort(took)
		t.Logf("GET /%s through the node proxy, 1 pod: median %v of %v", strings.Join(path, "/"), took[2], took)
	}

	// /metrics/resource, as metrics-server parses it.
	b, err := n.proxy("metrics", "resource").DoRaw(ctx)
	if err != nil {
		t.Fatalf("GET /metrics/resource: %v: %s", err, b)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("parse /metrics/resource: %v\n%s", err, b)
	}
	container := map[string]string{"container": "burn", "pod": "burn", "namespace": n.ns}
	pod := map[string]string{"pod": "burn", "namespace": n.ns}
	for _, want := range []struct {
		family string
		typ    dto.MetricType
		labels map[string]string
		min    float64
	}{
		{"node_cpu_usage_seconds_total", dto.MetricType_COUNTER, nil, 1e-9},
		{"node_memory_working_set_bytes", dto.MetricType_GAUGE, nil, minWorkingSet},
		{"pod_cpu_usage_seconds_total", dto.MetricType_COUNTER, pod, 1e-9},
		{"pod_memory_working_set_bytes", dto.MetricType_GAUGE, pod, minWorkingSet},
		{"container_cpu_usage_seconds_total", dto.MetricType_COUNTER, container, 1e-9},
		{"container_memory_working_set_bytes", dto.MetricType_GAUGE, container, minWorkingSet},
		{"container_start_time_seconds", dto.MetricType_GAUGE, container, float64(c.StartTime.Unix())},
		{"scrape_error", dto.MetricType_GAUGE, nil, 0},
		{"resource_scrape_error", dto.MetricType_GAUGE, nil, 0},
	} {
		f := families[want.family]
		if f == nil || f.GetType() != want.typ {
			t.Errorf("/metrics/resource family %s = %v, want a %v", want.family, f, want.typ)
			continue
		}
		m := sampleOf(f, want.labels)
		if m == nil {
			t.Errorf("/metrics/resource %s has no sample labelled %v: %v", want.family, want.labels, f.Metric)
			continue
		}
		v := m.GetGauge().GetValue() + m.GetCounter().GetValue()
		if v < want.min || (want.min == 0 && v != 0) {
			t.Errorf("/metrics/resource %s%v = %v, want at least %v", want.family, want.labels, v, want.min)
		}
		if want.family != "scrape_error" && want.family != "resource_scrape_error" && m.TimestampMs == nil {
			t.Errorf("/metrics/resource %s%v has no timestamp, want its reading's", want.family, want.labels)
		}
	}

	// Paths the kubelet does not serve, and bad parameters.
	for _, tt := range []struct {
		req  *rest.Request
		want int
	}{
		{n.proxy("stats", "container"), http.StatusNotFound},
		{n.proxy("stats", "summary", "more"), http.StatusNotFound},
		{n.proxy("stats", "summary").Param("only_cpu_and_memory", "perhaps"), http.StatusBadRequest},
	} {
		_, err := tt.req.DoRaw(ctx)
		var status apierrors.APIStatus
		if !errors.As(err, &status) || int(status.Status().Code) != tt.want {
			t.Errorf("GET %s = %v, want status %d", tt.req.URL(), err, tt.want)
		}
	}
}

// sampleOf is f's sample with exactly labels.
func sampleOf(f *dto.MetricFamily, labels map[string]string) *dto.Metric {
	for _, m := range f.Metric {
		got := map[string]string{}
		for _, l := range m.Label {
			got[l.GetName()] = l.GetValue()
		}
		if len(got) == len(labels) && fmt.Sprint(got) == fmt.Sprint(labels) {
			return m
		}
	}
	return nil
}

func atLeast(what string, s *statsv1alpha1.CPUStats, nanoCores uint64) error {
	if s == nil || s.UsageNanoCores == nil || s.UsageCoreNanoSeconds == nil || *s.UsageNanoCores < nanoCores {
		return fmt.Errorf("%s = %s, want at least %d nanocores", what, show(s), nanoCores)
	}
	return nil
}

func atLeastMemory(what string, s *statsv1alpha1.MemoryStats, workingSet uint64) error {
	if s == nil || s.WorkingSetBytes == nil || *s.WorkingSetBytes < workingSet {
		return fmt.Errorf("%s = %s, want a working set of at least %d bytes", what, show(s), workingSet)
	}
	return nil
}

// show is v in JSON, for messages: its fields are pointers.
func show(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// With the runtime away, /stats/summary answers 500 with the CRI's reason
// at once, and /metrics/resource scrape_error 1 and no usage, as the
// kubelet's.
func TestStatsRuntimeAway(t *testing.T) {
	dir := t.TempDir()
	client, err := cri.New(filepath.Join(dir, "containerd.sock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	s := &server{cfg: Config{Log: slog.New(slog.DiscardHandler),
		Stats: stats.New(stats.Config{NodeName: "n", Runtime: client.Runtime, Images: client.Images, RootDir: dir, PodLogRoot: dir})}}

	start := time.Now()
	rec := httptest.NewRecorder()
	s.statsSummary(rec, httptest.NewRequest(http.MethodGet, "/stats/summary", nil))
	if body := rec.Body.String(); rec.Code != http.StatusInternalServerError || !strings.Contains(body, "CRI ListPodSandbox") ||
		!strings.Contains(body, "containerd.sock") {
		t.Errorf("/stats/summary with no runtime = %d %q, want 500 with the CRI call and its socket", rec.Code, body)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("/stats/summary with no runtime took %v, want it to fail at once", d)
	}

	rec = httptest.NewRecorder()
	s.resourceMetrics(rec, httptest.NewRequest(http.MethodGet, "/metrics/resource", nil))
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(rec.Body)
	if err != nil {
		t.Fatalf("parse /metrics/resource: %v", err)
	}
	var names []string
	for name, f := range families {
		names = append(names, name)
		if strings.HasSuffix(name, "scrape_error") && f.Metric[0].GetGauge().GetValue() != 1 {
			t.Errorf("/metrics/resource %s = %v with no runtime, want 1", name, f.Metric[0].GetGauge().GetValue())
		}
	}
	slices.Sort(names)
	if want := []string{"resource_scrape_error", "scrape_error"}; rec.Code != http.StatusOK || !slices.Equal(names, want) {
		t.Errorf("/metrics/resource with no runtime = %d with %v, want 200 with %v", rec.Code, names, want)
	}
}
