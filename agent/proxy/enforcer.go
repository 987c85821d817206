package proxy

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	networkinglisters "k8s.io/client-go/listers/networking/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/cairn-os/cairn/internal/backoff"
)

// PolicyConfig configures a PolicyEnforcer.
type PolicyConfig struct {
	// NodeName is this node's Node: its pods are the ones isolated.
	NodeName string
	// NetNS is the path of a network namespace to program instead of the
	// current one; empty means the caller's.
	NetNS string
	// Table is the nftables table name, default "cairn-policy".
	Table string
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// PolicyEnforcer enforces the cluster's NetworkPolicies for the pods of
// this node, in a table of its own (see policy.go for its shape).
type PolicyEnforcer struct {
	cfg    PolicyConfig
	client kubernetes.Interface
	log    *slog.Logger
	events record.EventRecorder
	told   map[string]string // policy → the problem told last
}

// PolicyEventSource is the component the enforcer's Events come from.
const PolicyEventSource = "cairn-network-policy"

// ReasonPolicyNotEnforced is the reason of the Event on a NetworkPolicy
// that is not enforced.
const ReasonPolicyNotEnforced = "NetworkPolicyNotEnforced"

// policySyncQuiet is how long the enforcer waits for changes to settle
// before it writes them: a Deployment's pods come in bursts.
const policySyncQuiet = 50 * time.Millisecond

// NewPolicyEnforcer returns an enforcer of cfg that reports to client.
func NewPolicyEnforcer(cfg PolicyConfig, client kubernetes.Interface) *PolicyEnforcer {
	if cfg.Table == "" {
		cfg.Table = "cairn-policy"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &PolicyEnforcer{cfg: cfg, client: client, log: cfg.Logger, told: map[string]string{}}
}

// Run enforces the policies that policies holds over the pods of pods and
// the namespaces of namespaces, informers the caller runs, until ctx
// ends. Each change is written in one transaction: the set elements and
// chains that differ from the last one; the first, and one every
// 15 minutes, against what the kernel has. The table stays when Run
// returns; CleanupPolicies removes it.
func (e *PolicyEnforcer) Run(ctx context.Context, policies, pods, namespaces cache.SharedIndexInformer) error {
	dp, err := newDataplane(Config{NetNS: e.cfg.NetNS, Table: e.cfg.Table})
	if err != nil {
		return err
	}
	defer dp.close()
	var stop func()
	e.events, stop = eventRecorder(ctx, e.client, PolicyEventSource, e.cfg.NodeName)
	defer stop()

	changed := make(chan struct{}, 1)
	poke := func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	h := cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { poke() }, DeleteFunc: func(any) { poke() },
		UpdateFunc: func(old, o any) {
			if policyRelevant(old, o) {
				poke()
			}
		},
	}
	for _, inf := range []cache.SharedIndexInformer{policies, pods, namespaces} {
		reg, err := inf.AddEventHandler(h)
		if err != nil {
			return fmt.Errorf("watch: %w", err)
		}
		defer func() { _ = inf.RemoveEventHandler(reg) }()
		if !cache.WaitForCacheSync(ctx.Done(), reg.HasSynced) {
			return nil
		}
	}
	in := policyListers{
		policies:   networkinglisters.NewNetworkPolicyLister(policies.GetIndexer()),
		pods:       corelisters.NewPodLister(pods.GetIndexer()),
		namespaces: corelisters.NewNamespaceLister(namespaces.GetIndexer()),
	}
	e.log.Info("informers synced; enforcing NetworkPolicies", "table", "inet "+e.cfg.Table)

	var last *table // what the last sync wrote; nil: read the kernel's
	b := backoff.Backoff{Initial: time.Second, Max: 30 * time.Second, Jitter: 0.2}
	var retry <-chan time.Time
	// A full sync now and then puts back what someone else changed.
	resync := time.NewTicker(defaultResyncPeriod)
	defer resync.Stop()
	for {
		want, problems, err := in.build(e.cfg.NodeName)
		if err == nil {
			e.tell(problems)
			err = e.write(dp, last, want)
		}
		if err != nil {
			d := b.Next()
			e.log.Error("NetworkPolicy sync failed; retrying", "err", err, "in", d.Round(time.Millisecond))
			last, retry = nil, time.After(d)
		} else {
			last, retry = want, nil
			b.Reset()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		case <-retry:
		case <-resync.C:
			last = nil
		}
		select { // let a burst settle
		case <-ctx.Done():
			return nil
		case <-time.After(policySyncQuiet):
		}
	}
}

// policyRelevant says whether an update from old to o can change the
// policy table: pods change status all the time (conditions, restarts),
// and only their labels, addresses, node, network, ports and end count.
func policyRelevant(old, o any) bool {
	switch o := o.(type) {
	case *v1.Pod:
		p, ok := old.(*v1.Pod)
		if !ok {
			return true
		}
		a, okA := selectable(p)
		b, okB := selectable(o)
		return okA != okB || !maps.Equal(p.Labels, o.Labels) || !slices.Equal(a.addrs, b.addrs) ||
			p.Spec.NodeName != o.Spec.NodeName || !equality.Semantic.DeepEqual(containerPorts(p), containerPorts(o))
	case *v1.Namespace:
		n, ok := old.(*v1.Namespace)
		return !ok || !maps.Equal(n.Labels, o.Labels)
	}
	return true // a NetworkPolicy, or what the informer holds instead
}

// containerPorts lists a pod's containers' ports, which named ports
// resolve to.
func containerPorts(p *v1.Pod) [][]v1.ContainerPort {
	var out [][]v1.ContainerPort
	for _, c := range p.Spec.Containers {
		out = append(out, c.Ports)
	}
	return out
}

// write makes the kernel's table want in one transaction: against last,
// what the previous sync wrote, or the kernel's own if there is none.
func (e *PolicyEnforcer) write(dp dataplane, last, want *table) error {
	full := last == nil
	if full {
		var err error
		if last, err = dp.observe(want); err != nil {
			return fmt.Errorf("read the table: %w", err)
		}
	}
	p := makePlan(last, want, full)
	if p.empty() {
		return nil
	}
	return dp.apply(p)
}

// tell records an Event on each policy not enforced, once per problem.
func (e *PolicyEnforcer) tell(problems []policyProblem) {
	now := map[string]string{}
	for _, pr := range problems {
		key := pr.policy.Namespace + "/" + pr.policy.Name
		now[key] = pr.why
		if e.told[key] != pr.why {
			e.log.Warn("NetworkPolicy not enforced", "policy", key, "why", pr.why)
			e.events.Event(pr.policy, v1.EventTypeWarning, ReasonPolicyNotEnforced, "not enforced on node "+e.cfg.NodeName+": "+pr.why)
		}
	}
	e.told = now
}

// CleanupPolicies deletes the enforcer's table: every pod is open again.
func CleanupPolicies(cfg PolicyConfig) error {
	e := NewPolicyEnforcer(cfg, nil)
	dp, err := newDataplane(Config{NetNS: e.cfg.NetNS, Table: e.cfg.Table})
	if err != nil {
		return err
	}
	defer dp.close()
	return dp.deleteTable()
}

// policyListers read the enforcer's inputs from the informers' caches.
type policyListers struct {
	policies   networkinglisters.NetworkPolicyLister
	pods       corelisters.PodLister
	namespaces corelisters.NamespaceLister
}

func (l policyListers) build(node string) (*table, []policyProblem, error) {
	nps, err := l.policies.List(labels.Everything())
	if err != nil {
		return nil, nil, err
	}
	pods, err := l.pods.List(labels.Everything())
	if err != nil {
		return nil, nil, err
	}
	nss, err := l.namespaces.List(labels.Everything())
	if err != nil {
		return nil, nil, err
	}
	in := policyInput{nodeName: node, policies: nps, pods: pods, namespaces: map[string]labels.Set{}}
	for _, ns := range nss {
		in.namespaces[ns.Name] = labels.Set(ns.Labels)
	}
	t, problems := buildPolicyTable(in)
	return t, problems, nil
}
