package proxy

import (
	"context"
	"fmt"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/util/retry"
)

// policyEnv is the proxier's test topology with its backends as pods of
// the node: be0 (app=web) and be1 (app=db) in the test's namespace, be2
// (app=client) in a second one labelled team=other. The client namespace
// stands outside the cluster (198.18.0.2). The Pods and the
// NetworkPolicies are real objects of the API server, which the
// enforcer watches; nothing runs the Pods: their addresses are written
// into their status.
//
// Two more pods, be3 and be4 (app=bridged) of the test's namespace, share
// a bridge in the node's namespace, as the CNI bridge plugin puts a
// node's pods on cairn0: traffic between them is bridged, and reaches
// the forward hook only through br_netfilter.
type policyEnv struct {
	*testEnv
	other string   // the second namespace
	addrs []string // the address of be0, be1…
}

func newPolicyEnv(t *testing.T) *policyEnv {
	e := &policyEnv{testEnv: newEnv(t, 3)}
	ctx := e.ctx()
	e.other = e.ns + "-other"
	nss := e.kube.CoreV1().Namespaces()
	if _, err := nss.Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: e.other, Labels: map[string]string{"team": "other"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nss.Delete(context.Background(), e.other, metav1.DeleteOptions{}) })
	// The pod garbage collector deletes pods bound to a Node that does not
	// exist.
	if _, err := e.kube.CoreV1().Nodes().Create(ctx, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.kube.CoreV1().Nodes().Delete(context.Background(), testNode, metav1.DeleteOptions{}) })
	for i := range e.backends {
		e.addrs = append(e.addrs, backendIP(i))
	}
	ipCmd(t, "-n", e.node.name, "link", "add", "br0", "type", "bridge")
	ipCmd(t, "-n", e.node.name, "addr", "add", "198.18.40.1/24", "dev", "br0")
	ipCmd(t, "-n", e.node.name, "link", "set", "br0", "up")
	for i := 3; i <= 4; i++ {
		b := newNS(t, fmt.Sprintf("be%d", i))
		addr := fmt.Sprintf("198.18.40.%d", i)
		link(t, e.node, fmt.Sprintf("be%d", i), "", b, "eth0", addr+"/24")
		ipCmd(t, "-n", e.node.name, "link", "set", fmt.Sprintf("be%d", i), "master", "br0")
		ipCmd(t, "-n", b.name, "route", "add", "198.18.0.0/15", "via", "198.18.40.1")
		serve(t, b, fmt.Sprintf("be%d", i))
		e.backends = append(e.backends, b)
		e.addrs = append(e.addrs, addr)
	}
	e.pod(e.ns, "web", 0, map[string]string{"app": "web"})
	e.pod(e.ns, "db", 1, map[string]string{"app": "db"})
	e.pod(e.other, "client", 2, map[string]string{"app": "client"})
	e.pod(e.ns, "bridged-a", 3, map[string]string{"app": "bridged"})
	e.pod(e.ns, "bridged-b", 4, map[string]string{"app": "bridged"})
	return e
}

// pod makes the Pod of backend i: on the node, with a container port
// named http (8080/TCP), and the backend's address.
func (e *policyEnv) pod(ns, name string, i int, labels map[string]string) {
	e.t.Helper()
	ctx := e.ctx()
	pods := e.kube.CoreV1().Pods(ns)
	p, err := pods.Create(ctx, &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec: v1.PodSpec{NodeName: testNode, Containers: []v1.Container{{Name: "c", Image: "none",
			Ports: []v1.ContainerPort{{Name: "http", ContainerPort: 8080}}}}},
	}, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		_ = pods.Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: ptr[int64](0)})
	})
	p.Status = v1.PodStatus{Phase: v1.PodRunning, PodIP: e.addrs[i], PodIPs: []v1.PodIP{{IP: e.addrs[i]}}}
	if _, err := pods.UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// enforce runs a PolicyEnforcer in the node's namespace until the test
// ends, and then removes its table.
func (e *policyEnv) enforce() {
	e.t.Helper()
	cfg := PolicyConfig{NodeName: testNode, NetNS: e.node.path, Logger: testLogger(e.t)}
	ctx, cancel := context.WithCancel(context.Background())
	f := informers.NewSharedInformerFactory(e.kube, 0)
	policies, pods, namespaces := f.Networking().V1().NetworkPolicies().Informer(), f.Core().V1().Pods().Informer(), f.Core().V1().Namespaces().Informer()
	f.Start(ctx.Done())
	done := make(chan error, 1)
	go func() { done <- NewPolicyEnforcer(cfg, e.kube).Run(ctx, policies, pods, namespaces) }()
	e.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			e.t.Errorf("enforcer: %v", err)
		}
		f.Shutdown()
		if err := CleanupPolicies(cfg); err != nil {
			e.t.Errorf("CleanupPolicies: %v", err)
		}
	})
}

func (e *policyEnv) policy(np *networkingv1.NetworkPolicy) {
	e.t.Helper()
	api := e.kube.NetworkingV1().NetworkPolicies(e.ns)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := api.Get(e.ctx(), np.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			_, err = api.Create(e.ctx(), np, metav1.CreateOptions{})
			return err
		}
		if err != nil {
			return err
		}
		np.ResourceVersion = cur.ResourceVersion
		_, err = api.Update(e.ctx(), np, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		e.t.Fatal(err)
	}
}

func (e *policyEnv) deletePolicy(name string) {
	e.t.Helper()
	if err := e.kube.NetworkingV1().NetworkPolicies(e.ns).Delete(e.ctx(), name, metav1.DeleteOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// reach waits until from reaches backend i's TCP port 8080 (or its UDP
// port 5353 with udp) when open, or until it stops reaching it: dropped,
// as a timeout.
func (e *policyEnv) reach(from *netNS, fromName string, i int, udp, open bool) {
	e.t.Helper()
	what := fmt.Sprintf("%s → be%d (udp %v) open %v", fromName, i, udp, open)
	eventually(e.t, what, func() error {
		var err error
		if udp {
			_, err = udpAsk(from, 0, e.addrs[i]+":5353", 300*time.Millisecond)
		} else {
			_, err = httpGet(from, e.addrs[i]+":8080", 300*time.Millisecond)
		}
		switch {
		case open && err != nil:
			return err
		case !open && err == nil:
			return fmt.Errorf("answered")
		case !open && !isTimeout(err):
			return fmt.Errorf("not dropped: %v", err)
		}
		return nil
	})
}

func policy(name string, sel map[string]string, types ...networkingv1.PolicyType) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: sel}, PolicyTypes: types}}
}

// TestNetworkPolicy enforces policies of each kind on real traffic
// between the node's pods and from outside, and follows pods, namespaces
// and policies as they change.
func TestNetworkPolicy(t *testing.T) {
	e := newPolicyEnv(t)
	e.enforce()
	client, web, db, other := e.client, e.backends[0], e.backends[1], e.backends[2]

	bridged := e.backends[3]

	// Nothing isolates anyone yet.
	e.reach(client, "client", 0, false, true)
	e.reach(other, "be2", 0, false, true)
	e.reach(bridged, "be3", 4, false, true)

	// Default deny for ingress in the namespace: be0 and be1 are isolated;
	// the node itself still reaches them, and be2 (another namespace) is
	// not isolated.
	e.policy(policy("deny", nil, networkingv1.PolicyTypeIngress))
	e.reach(client, "client", 0, false, false)
	e.reach(other, "be2", 0, false, false)
	e.reach(web, "be0", 1, false, false)
	e.reach(e.node, "node", 0, false, true)
	e.reach(web, "be0", 2, false, true)
	e.reach(bridged, "be3", 4, false, false) // bridged, on the same node
	e.reach(e.node, "node", 4, false, true)

	// A podSelector alone: pods of the policy's namespace.
	fromDB := policy("allow-db", map[string]string{"app": "web"})
	fromDB.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
		{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}}}}}}
	e.policy(fromDB)
	e.reach(db, "be1", 0, false, true)
	e.reach(db, "be1", 0, true, true) // no ports: every port
	e.reach(other, "be2", 0, false, false)
	// A namespaceSelector alone: every pod of those namespaces.
	fromTeam := policy("allow-team", map[string]string{"app": "db"})
	fromTeam.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
		{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "other"}}}}}}
	e.policy(fromTeam)
	e.reach(other, "be2", 1, false, true)
	e.reach(web, "be0", 1, false, false)
	e.deletePolicy("allow-db")
	e.deletePolicy("allow-team")
	e.reach(db, "be1", 0, false, false)

	// Pods app=client of namespaces team=other, on the named port http.
	from := ptr(networkingv1.NetworkPolicyPeer{
		PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}},
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "other"}},
	})
	named := networkingv1.NetworkPolicyPort{Port: ptr(intstr.FromString("http"))}
	allow := policy("allow-clients", map[string]string{"app": "web"})
	allow.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{*from}, Ports: []networkingv1.NetworkPolicyPort{named}}}
	e.policy(allow)
	e.reach(other, "be2", 0, false, true)
	e.reach(other, "be2", 0, true, false)  // UDP is not the named port
	e.reach(other, "be2", 1, false, false) // be1 is not selected
	e.reach(client, "client", 0, false, false)

	// The namespace loses its label: its pods no longer match.
	e.setNamespaceLabels(e.other, map[string]string{"team": "gone"})
	e.reach(other, "be2", 0, false, false)
	e.setNamespaceLabels(e.other, map[string]string{"team": "other"})
	e.reach(other, "be2", 0, false, true)

	// An ipBlock with an except, and a port range.
	block := policy("allow-outside", map[string]string{"app": "web"})
	tcp := v1.ProtocolTCP
	rangePort := networkingv1.NetworkPolicyPort{Protocol: &tcp, Port: ptr(intstr.FromInt32(8000)), EndPort: ptr[int32](8100)}
	block.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{
		From:  []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "198.18.0.0/24", Except: []string{"198.18.0.2/32"}}}},
		Ports: []networkingv1.NetworkPolicyPort{rangePort},
	}}
	e.policy(block)
	e.reach(client, "client", 0, false, false)
	block.Spec.Ingress[0].From[0].IPBlock.Except = []string{"198.18.0.3/32"}
	e.policy(block)
	e.reach(client, "client", 0, false, true)
	e.reach(client, "client", 0, true, false) // UDP is outside the range's protocol

	// Egress: be0 may reach app=db pods of any namespace on TCP 8080 only;
	// ingress is open again.
	e.deletePolicy("deny")
	e.deletePolicy("allow-clients")
	e.deletePolicy("allow-outside")
	e.reach(bridged, "be3", 4, false, true)
	out := policy("web-egress", map[string]string{"app": "web"}, networkingv1.PolicyTypeEgress)
	out.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{{
		To: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}},
			NamespaceSelector: &metav1.LabelSelector{}}},
		Ports: []networkingv1.NetworkPolicyPort{{Port: ptr(intstr.FromInt32(8080))}},
	}}
	e.policy(out)
	e.reach(web, "be0", 1, false, true)
	e.reach(web, "be0", 1, true, false)
	e.reach(web, "be0", 2, false, false)
	e.reach(other, "be2", 0, false, true) // be0's replies pass
	// A pod that takes the label is reached too.
	e.relabel(e.other, "client", map[string]string{"app": "db"})
	e.reach(web, "be0", 2, false, true)

	// An ipBlock to be2's network, but for be2 itself.
	out.Spec.Egress = append(out.Spec.Egress, networkingv1.NetworkPolicyEgressRule{
		To: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "198.18.18.0/24", Except: []string{backendIP(2) + "/32"}}}},
	})
	e.relabel(e.other, "client", map[string]string{"app": "client"})
	e.policy(out)
	e.reach(web, "be0", 2, false, false)
	out.Spec.Egress[1].To[0].IPBlock.Except = nil
	e.policy(out)
	e.reach(web, "be0", 2, true, true)

	e.deletePolicy("web-egress")
	e.reach(web, "be0", 2, true, true)
}

func (e *policyEnv) setNamespaceLabels(name string, labels map[string]string) {
	e.t.Helper()
	nss := e.kube.CoreV1().Namespaces()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		ns, err := nss.Get(e.ctx(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		ns.Labels = labels
		_, err = nss.Update(e.ctx(), ns, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		e.t.Fatal(err)
	}
}

func (e *policyEnv) relabel(ns, name string, labels map[string]string) {
	e.t.Helper()
	pods := e.kube.CoreV1().Pods(ns)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p, err := pods.Get(e.ctx(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		p.Labels = labels
		_, err = pods.Update(e.ctx(), p, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		e.t.Fatal(err)
	}
}

// TestNetworkPolicyPodReachesItself runs the proxier beside the enforcer:
// an isolated pod still reaches itself through its own Service, as a pod
// cannot block access to itself.
func TestNetworkPolicyPodReachesItself(t *testing.T) {
	e := newPolicyEnv(t)
	e.start()
	e.enforce()
	e.apply(webService(), endpointSlice("web", httpPort, ep(backendIP(0))))
	waitAnswers(t, e.client, webAddr)
	e.policy(policy("deny", nil, networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress))
	e.reach(e.client, "client", 0, false, false)
	eventually(t, "be0 reaches itself through its Service", func() error {
		_, err := httpGet(e.backends[0], webAddr, 300*time.Millisecond)
		return err
	})
}
