package proxy

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"

	"github.com/cairn-os/cairn/test/kube"
)

// eventsAbout lists the Events on the Service name in the test's
// namespace, as the API server has them.
func (e *testEnv) eventsAbout(name string) []v1.Event {
	e.t.Helper()
	l, err := e.kube.CoreV1().Events(e.ns).List(e.ctx(), metav1.ListOptions{
		// The proxier's alone: the control plane's controllers may tell
		// of the same Service.
		FieldSelector: fields.Set{"involvedObject.kind": "Service", "involvedObject.name": name, "source": EventSource}.String(),
	})
	if err != nil {
		e.t.Fatalf("list Events about Service %s: %v", name, err)
	}
	return l.Items
}

// TestUnsupportedServiceFieldGetsAWarningEvent creates Services that ask
// for what the table does not do, and one that does not: each field gets
// one Warning Event on its Service, from the proxier running with the
// node's own credentials, as in the agent; the plain Service gets none;
// later syncs do not repeat them; and the Services are programmed anyway.
func TestUnsupportedServiceFieldGetsAWarningEvent(t *testing.T) {
	e := newEnv(t, 1)
	nodeClient, err := kubernetes.NewForConfig(kube.Shared(t).UserConfig("system:node:"+testNode, "system:nodes"))
	if err != nil {
		t.Fatal(err)
	}
	e.proxyKube = nodeClient
	p, _ := e.start()

	lb := func(name, ip string, mut func(*v1.Service)) *v1.Service {
		s := service(name, ip, svcPort("http", v1.ProtocolTCP, 80, "http"))
		s.Spec.Type = v1.ServiceTypeLoadBalancer
		mut(s)
		return s
	}
	cases := []struct {
		svc   *v1.Service
		field string // "": no Event
	}{
		{webService(), ""},
		{lb("ranges", "198.18.100.21", func(s *v1.Service) { s.Spec.LoadBalancerSourceRanges = []string{"198.18.0.0/24"} }), "spec.loadBalancerSourceRanges"},
		{lb("local", "198.18.100.22", func(s *v1.Service) { s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal }), "spec.healthCheckNodePort"},
		{service("close", "198.18.100.23", svcPort("http", v1.ProtocolTCP, 80, "http")), "spec.trafficDistribution"},
	}
	cases[3].svc.Spec.TrafficDistribution = ptr(v1.ServiceTrafficDistributionPreferClose)
	for _, c := range cases {
		e.apply(c.svc, endpointSlice(c.svc.Name, httpPort, ep(backendIP(0))))
	}
	for _, c := range cases {
		waitAnswers(t, e.client, c.svc.Spec.ClusterIP+":80") // programmed, unsupported field or not
	}

	check := func(c struct {
		svc   *v1.Service
		field string
	}) error {
		evs := e.eventsAbout(c.svc.Name)
		if c.field == "" {
			if len(evs) > 0 {
				return fmt.Errorf("Service %s has Events %q, want none", c.svc.Name, evs[0].Message)
			}
			return nil
		}
		if len(evs) != 1 {
			var msgs []string
			for _, ev := range evs {
				msgs = append(msgs, ev.Message)
			}
			return fmt.Errorf("Service %s has %d Events from %s %q, want one naming %s", c.svc.Name, len(evs), EventSource, msgs, c.field)
		}
		ev := evs[0]
		svc, err := e.kube.CoreV1().Services(e.ns).Get(e.ctx(), c.svc.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if ev.Type != v1.EventTypeWarning || ev.Reason != reasonUnsupportedField || !strings.HasPrefix(ev.Message, c.field+": ") ||
			ev.Source.Component != EventSource || ev.Source.Host != testNode || ev.InvolvedObject.UID != svc.UID {
			return fmt.Errorf("Service %s's Event: %s %s %q from %s on %s about UID %s, want %s %s naming %s from %s on %s about UID %s",
				c.svc.Name, ev.Type, ev.Reason, ev.Message, ev.Source.Component, ev.Source.Host, ev.InvolvedObject.UID,
				v1.EventTypeWarning, reasonUnsupportedField, c.field, EventSource, testNode, svc.UID)
		}
		if ev.Count > 1 {
			return fmt.Errorf("Service %s's Event %q was sent %d times, want once", c.svc.Name, ev.Message, ev.Count)
		}
		return nil
	}
	for _, c := range cases {
		eventually(t, "Events on "+c.svc.Name, func() error { return check(c) })
	}

	// More syncs, of changes to other Services: nothing is told again.
	syncs, told := p.Stats().Syncs, p.Stats().Events
	e.apply(endpointSlice("web", httpPort, ep(backendIP(0)), ep("198.18.16.3")))
	e.apply(service("other", "198.18.100.24", svcPort("http", v1.ProtocolTCP, 80, "http")))
	eventually(t, "two more syncs", func() error {
		if n := p.Stats().Syncs - syncs; n < 2 {
			return fmt.Errorf("%d so far", n)
		}
		return nil
	})
	if n := p.Stats().Events - told; n != 0 {
		t.Errorf("%d Events recorded in two syncs that changed no Service's problems, want none", n)
	}
	for _, c := range cases {
		if err := check(c); err != nil {
			t.Error(err)
		}
	}

	// A problem that goes and comes back is told again.
	svc, err := e.kube.CoreV1().Services(e.ns).Get(e.ctx(), "close", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	svc.Spec.TrafficDistribution = nil
	syncs = p.Stats().Syncs
	e.apply(svc)
	eventually(t, "a sync without close's trafficDistribution", func() error {
		if p.Stats().Syncs == syncs {
			return errors.New("not yet")
		}
		return nil
	})
	svc.Spec.TrafficDistribution = ptr(v1.ServiceTrafficDistributionPreferClose)
	e.apply(svc)
	eventually(t, "close's Event told again", func() error {
		evs := e.eventsAbout("close")
		if len(evs) != 1 || evs[0].Count != 2 {
			return fmt.Errorf("Events on close: %d, want one with count 2", len(evs))
		}
		return nil
	})
}
