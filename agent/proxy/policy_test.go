package proxy

import (
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
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
