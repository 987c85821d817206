package proxy

import (
	"fmt"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/record"
)

// TestPolicyProblems checks that a policy the enforcer cannot honour is
// left out with the path of its field, and the others are enforced.
func TestPolicyProblems(t *testing.T) {
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "ns", Labels: map[string]string{"app": "web"}},
		Spec:   v1.PodSpec{NodeName: "n1"},
		Status: v1.PodStatus{PodIPs: []v1.PodIP{{IP: "10.244.0.5"}}}}
	bad := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "bad", Namespace: "ns"},
		Spec: networkingv1.NetworkPolicySpec{Ingress: []networkingv1.NetworkPolicyIngressRule{{
			From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/8", Except: []string{"ten"}}}},
		}}}}
	deny := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "deny", Namespace: "ns"}}
	tb, problems := buildPolicyTable(policyInput{nodeName: "n1", policies: []*networkingv1.NetworkPolicy{bad, deny},
		pods: []*v1.Pod{pod}, namespaces: map[string]labels.Set{"ns": nil}})
	if len(problems) != 1 || problems[0].policy != bad || !strings.Contains(problems[0].why, `spec.ingress[0].from[0].ipBlock.except[0]: "ten" is not a CIDR`) {
		t.Fatalf("problems %+v, want bad's except", problems)
	}
	out := tb.String()
	for _, want := range []string{"ip daddr vmap @ingress-pods4", "10.244.0.5 : goto pod-in4-"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "ns/bad") {
		t.Errorf("the bad policy is in the table:\n%s", out)
	}
}

// policyScale is a cluster of 5 000 pods in 100 namespaces, 100 of them on
// node n1, and 1 000 policies: each selects one app's pods and lets in
// those of another app of namespaces with a label, on a named port and a
// port range.
func policyScale() policyInput {
	in := policyInput{nodeName: "n1", namespaces: map[string]labels.Set{}}
	for n := range 100 {
		ns := fmt.Sprintf("ns-%d", n)
		in.namespaces[ns] = labels.Set{"team": fmt.Sprint(n % 10)}
		for i := range 50 {
			k := n*50 + i
			node := "n2"
			if k%50 == 0 {
				node = "n1"
			}
			in.pods = append(in.pods, &v1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p-%d", k), Namespace: ns, Labels: map[string]string{"app": fmt.Sprint(i % 10)}},
				Spec: v1.PodSpec{NodeName: node, Containers: []v1.Container{{Name: "c",
					Ports: []v1.ContainerPort{{Name: "http", ContainerPort: 8080}}}}},
				Status: v1.PodStatus{PodIPs: []v1.PodIP{{IP: fmt.Sprintf("10.%d.%d.%d", 64+k>>16, k>>8&255, k&255)}}},
			})
		}
		for p := range 10 {
			np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("np-%d", p), Namespace: ns},
				Spec: networkingv1.NetworkPolicySpec{
					PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprint(p)}},
					Ingress: []networkingv1.NetworkPolicyIngressRule{{
						From: []networkingv1.NetworkPolicyPeer{{
							PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprint((p + 1) % 10)}},
							NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": fmt.Sprint(p)}},
						}},
						Ports: []networkingv1.NetworkPolicyPort{
							{Port: ptr(intstr.FromString("http"))},
							{Port: ptr(intstr.FromInt32(9000)), EndPort: ptr[int32](9100)},
						},
					}},
				}}
			in.policies = append(in.policies, np)
		}
	}
	return in
}

// TestPolicyEvents checks that a policy left out gets one Warning Event
// naming why, not one per sync, and a new one if it comes back.
func TestPolicyEvents(t *testing.T) {
	rec := record.NewFakeRecorder(10)
	e := NewPolicyEnforcer(PolicyConfig{NodeName: "n1"}, nil)
	e.events = rec
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "bad", Namespace: "ns"}}
	bad := []policyProblem{{np, `spec.ingress[0].from[0].ipBlock.except[0]: "ten" is not a CIDR`}}
	e.tell(bad)
	e.tell(bad)
	e.tell(nil)
	e.tell(bad)
	want := `Warning NetworkPolicyNotEnforced not enforced on node n1: spec.ingress[0].from[0].ipBlock.except[0]: "ten" is not a CIDR`
	for i := range 2 {
		select {
		case got := <-rec.Events:
			if got != want {
				t.Errorf("event %d = %q, want %q", i, got, want)
			}
		default:
			t.Fatalf("%d events, want 2", i)
		}
	}
	if len(rec.Events) != 0 {
		t.Errorf("more events: %q", <-rec.Events)
	}
}

// TestPolicyRelevant checks which updates make the enforcer sync.
func TestPolicyRelevant(t *testing.T) {
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", Labels: map[string]string{"app": "a"}},
		Spec:   v1.PodSpec{NodeName: "n1", Containers: []v1.Container{{Name: "c", Ports: []v1.ContainerPort{{Name: "http", ContainerPort: 80}}}}},
		Status: v1.PodStatus{Phase: v1.PodRunning, PodIPs: []v1.PodIP{{IP: "10.0.0.1"}}}}
	change := func(f func(p *v1.Pod)) *v1.Pod {
		p := pod.DeepCopy()
		f(p)
		return p
	}
	for _, tt := range []struct {
		name string
		o    *v1.Pod
		want bool
	}{
		{"a condition", change(func(p *v1.Pod) { p.Status.Conditions = []v1.PodCondition{{Type: v1.PodReady}} }), false},
		{"a restart", change(func(p *v1.Pod) { p.Status.ContainerStatuses = []v1.ContainerStatus{{RestartCount: 1}} }), false},
		{"a label", change(func(p *v1.Pod) { p.Labels["app"] = "b" }), true},
		{"an address", change(func(p *v1.Pod) { p.Status.PodIPs = []v1.PodIP{{IP: "10.0.0.2"}} }), true},
		{"the end", change(func(p *v1.Pod) { p.Status.Phase = v1.PodSucceeded }), true},
		{"a port", change(func(p *v1.Pod) { p.Spec.Containers[0].Ports[0].ContainerPort = 81 }), true},
	} {
		if got := policyRelevant(pod, tt.o); got != tt.want {
			t.Errorf("%s: policyRelevant = %v, want %v", tt.name, got, tt.want)
		}
	}
	ns := &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns", Labels: map[string]string{"team": "a"}}}
	if policyRelevant(ns, ns.DeepCopy()) {
		t.Error("an unchanged namespace is relevant")
	}
	if !policyRelevant(ns, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns"}}) {
		t.Error("a namespace's labels dropped are not relevant")
	}
}
