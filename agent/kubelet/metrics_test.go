package kubelet

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cairn-os/cairn/agent/kubelet/probe"
)

// TestProberMetrics shows that one probe hook counts a run both in the
// agent's metrics and, per container with the kubelet's names, on the
// registry of /metrics/probes, and that a pod's series go with it.
func TestProberMetrics(t *testing.T) {
	reg, probeReg := prometheus.NewRegistry(), prometheus.NewRegistry()
	m, err := newMetrics(reg, probeReg)
	if err != nil {
		t.Fatal(err)
	}
	web := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "ns", UID: "uid-web"}}
	db := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: "ns", UID: "uid-db"}}
	m.probed(web, "app", probe.Liveness, nil)
	m.probed(web, "app", probe.Liveness, nil)
	m.probed(web, "app", probe.Readiness, errors.New("connection refused"))
	m.probed(db, "sql", probe.Startup, nil)

	series := func(g prometheus.Gatherer, name string) map[string]float64 {
		t.Helper()
		families, err := g.Gather()
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]float64{}
		for _, f := range families {
			if f.GetName() != name {
				continue
			}
			for _, s := range f.GetMetric() {
				key := ""
				for _, l := range s.GetLabel() {
					key += l.GetName() + "=" + l.GetValue() + " "
				}
				got[key] = s.GetCounter().GetValue()
			}
		}
		return got
	}
	want := map[string]float64{
		"container=app namespace=ns pod=web pod_uid=uid-web probe_type=Liveness result=successful ": 2,
		"container=app namespace=ns pod=web pod_uid=uid-web probe_type=Readiness result=failed ":    1,
		"container=sql namespace=ns pod=db pod_uid=uid-db probe_type=Startup result=successful ":    1,
	}
	if diff := cmp.Diff(want, series(probeReg, "prober_probe_total")); diff != "" {
		t.Errorf("prober_probe_total mismatch (-want +got):\n%s", diff)
	}
	wantRuns := map[string]float64{"kind=liveness result=success ": 2, "kind=readiness result=failure ": 1, "kind=startup result=success ": 1}
	if diff := cmp.Diff(wantRuns, series(reg, "cairn_kubelet_probe_runs_total")); diff != "" {
		t.Errorf("cairn_kubelet_probe_runs_total mismatch (-want +got):\n%s", diff)
	}

	m.podGone(web.UID)
	delete(want, "container=app namespace=ns pod=web pod_uid=uid-web probe_type=Liveness result=successful ")
	delete(want, "container=app namespace=ns pod=web pod_uid=uid-web probe_type=Readiness result=failed ")
	if diff := cmp.Diff(want, series(probeReg, "prober_probe_total")); diff != "" {
		t.Errorf("after the pod went, prober_probe_total mismatch (-want +got):\n%s", diff)
	}
}
