package server

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/cairn-os/cairn/test/poll"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// TestMetricsAndConfigz reads /metrics, /metrics/probes and /configz
// as a cluster admin. (The API server's node proxy refuses loopback
// addresses, the test Node's.)
func TestMetricsAndConfigz(t *testing.T) {
	e := newCertEnv(t)
	reg := prometheus.NewRegistry()
	runs := prometheus.NewCounter(prometheus.CounterOpts{Name: "cairn_test_runs_total", Help: "Runs."})
	reg.MustRegister(runs)
	runs.Add(3)
	probeReg := prometheus.NewRegistry()
	probes := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "prober_probe_total", Help: "Probes."},
		[]string{"probe_type", "result", "container", "pod", "namespace", "pod_uid"})
	probeReg.MustRegister(probes)
	probes.WithLabelValues("Liveness", "successful", "app", "web", "default", "uid-1").Add(2)

	addr := e.serve(t, Config{Metrics: reg, ProbeMetrics: probeReg, Configz: KubeletConfig{
		Port: 10250, ClusterDomain: "cluster.local", ClusterDNS: []string{"10.96.0.10"}, CgroupDriver: "cgroupfs",
	}})
	e.patchStatus(t, corev1.NodeStatus{
		Addresses: []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: e.node}, {Type: corev1.NodeInternalIP, Address: "127.0.0.1"}},
		Capacity:  corev1.ResourceList{corev1.ResourcePods: resource.MustParse("110")},
	})
	poll.Until(t, 10*time.Second, "the Node's capacity in the informer", func() error {
		if e.nodes.Node().Status.Capacity.Pods().IsZero() {
			return errors.New("no pods capacity")
		}
		return nil
	})
	admin := e.c.UserConfig("metrics-admin", "system:masters")
	cert, err := tls.X509KeyPair(admin.CertData, admin.KeyData)
	if err != nil {
		t.Fatal(err)
	}
	// The certificate is self-signed until approved: not verified.
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{Certificates: []tls.Certificate{cert}, InsecureSkipVerify: true}}}
	defer client.CloseIdleConnections()
	raw := func(path string) []byte {
		t.Helper()
		resp, err := client.Get("https://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %s, %v: %s", path, resp.Status, err, b)
		}
		return b
	}
	parse := func(path string) map[string]*dto.MetricFamily {
		t.Helper()
		parser := expfmt.NewTextParser(model.UTF8Validation)
		families, err := parser.TextToMetricFamilies(bytes.NewReader(raw(path)))
		if err != nil {
			t.Fatalf("parse %s: %v", path, err)
		}
		return families
	}

	if f := parse("/metrics")["cairn_test_runs_total"]; f == nil || f.GetMetric()[0].GetCounter().GetValue() != 3 {
		t.Errorf("/metrics has cairn_test_runs_total %v, want 3", f)
	}
	f := parse("/metrics/probes")["prober_probe_total"]
	if f == nil || len(f.GetMetric()) != 1 {
		t.Fatalf("/metrics/probes has prober_probe_total %v, want one series", f)
	}
	labels := map[string]string{}
	for _, l := range f.GetMetric()[0].GetLabel() {
		labels[l.GetName()] = l.GetValue()
	}
	want := map[string]string{"probe_type": "Liveness", "result": "successful", "container": "app", "pod": "web", "namespace": "default", "pod_uid": "uid-1"}
	if diff := cmp.Diff(want, labels); diff != "" || f.GetMetric()[0].GetCounter().GetValue() != 2 {
		t.Errorf("prober_probe_total = %v with labels (-want +got):\n%s", f.GetMetric()[0].GetCounter().GetValue(), diff)
	}

	var configz struct {
		KubeletConfig map[string]any `json:"kubeletconfig"`
	}
	if err := json.Unmarshal(raw("/configz"), &configz); err != nil {
		t.Fatal(err)
	}
	wantConfig := map[string]any{"port": 10250.0, "clusterDomain": "cluster.local", "clusterDNS": []any{"10.96.0.10"},
		"cgroupDriver": "cgroupfs", "maxPods": 110.0, "serverTLSBootstrap": true}
	if diff := cmp.Diff(wantConfig, configz.KubeletConfig); diff != "" {
		t.Errorf("/configz mismatch (-want +got):\n%s", diff)
	}
}
