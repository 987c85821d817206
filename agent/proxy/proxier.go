package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cairn-os/cairn/internal/backoff"
	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	coreinformers "k8s.io/client-go/informers/core/v1"
	discoveryinformers "k8s.io/client-go/informers/discovery/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
)

// Proxier keeps the table in step with the cluster's Services and
// EndpointSlices. Create it with New, start it with Run, and remove its
// table with Cleanup.
type Proxier struct {
	cfg     Config
	client  kubernetes.Interface
	log     *slog.Logger
	metrics *metrics
	trigger chan struct{}

	services corelisters.ServiceLister
	slices   discoverylisters.EndpointSliceLister
	events   record.EventRecorder // set by Run
	// told holds, per Service, the problems already sent as Events, so
	// that each is told once and not on every sync. Only sync uses it.
	told map[types.UID]map[fieldProblem]bool

	mu      sync.Mutex // one sync at a time; guards the fields below
	dp      dataplane
	applied *table // the kernel's table after the last successful transaction; nil: unknown
	ports   map[string]portState
}

// EventSource is the component named as the source of the proxier's
// Events: Warnings on Services with fields the table does not honour.
const EventSource = "cairn-proxy"

// Labels that take a Service or slice out of the proxy's hands, as for
// kube-proxy: another proxy serves it, or it is headless.
const (
	labelServiceProxyName = "service.kubernetes.io/service-proxy-name"
	labelHeadless         = "service.kubernetes.io/headless"
)

// New returns a Proxier for the node cfg describes, reading Services and
// EndpointSlices through client. It touches nothing until Run.
func New(cfg Config, client kubernetes.Interface) *Proxier {
	cfg = cfg.withDefaults()
	return &Proxier{
		cfg:     cfg,
		client:  client,
		log:     cfg.Logger.With("component", "proxy"),
		metrics: newMetrics(),
		trigger: make(chan struct{}, 1),
	}
}

// Stats returns a snapshot of the proxier's counters.
func (p *Proxier) Stats() Stats { return p.metrics.snapshot() }

// Describe implements prometheus.Collector.
func (p *Proxier) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range p.metrics.collectors() {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (p *Proxier) Collect(ch chan<- prometheus.Metric) {
	for _, c := range p.metrics.collectors() {
		c.Collect(ch)
	}
}

func (p *Proxier) requestSync() {
	select {
	case p.trigger <- struct{}{}:
	default:
	}
}

// Run watches Services and EndpointSlices with the shared informers
// services and endpointSlices, which the caller starts, and syncs the table until
// ctx is done. The informers may hold every Service and slice: the proxy
// leaves out, in memory, those that are another proxy's or headless. The
// first sync, once the informers have listed everything, is a
// full one: it reads the kernel's table and removes whatever is stale, so a
// restarted proxier converges to the same table. Later syncs write only
// what changed; one runs at most every MinSyncInterval, and a full one every
// ResyncPeriod. The table stays in place when Run returns: traffic keeps
// flowing while the agent restarts. Use Cleanup to remove it.
func (p *Proxier) Run(ctx context.Context, services coreinformers.ServiceInformer, endpointSlices discoveryinformers.EndpointSliceInformer) error {
	if err := p.cfg.validate(); err != nil {
		return err
	}
	if err := p.open(); err != nil {
		return err
	}
	defer p.closeDataplane()

	events := record.NewBroadcaster(record.WithContext(ctx))
	events.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: p.client.CoreV1().Events("")})
	defer events.Shutdown()
	p.events = events.NewRecorder(scheme.Scheme, v1.EventSource{Component: EventSource, Host: p.cfg.NodeName})

	handler := cache.FilteringResourceEventHandler{
		FilterFunc: isOurs,
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { p.requestSync() },
			UpdateFunc: func(any, any) { p.requestSync() },
			DeleteFunc: func(any) { p.requestSync() },
		},
	}
	for what, inf := range map[string]cache.SharedIndexInformer{"Services": services.Informer(), "EndpointSlices": endpointSlices.Informer()} {
		reg, err := inf.AddEventHandler(handler)
		if err != nil {
			return fmt.Errorf("watch %s: %w", what, err)
		}
		defer func() { _ = inf.RemoveEventHandler(reg) }()
		if !cache.WaitForCacheSync(ctx.Done(), reg.HasSynced) {
			return nil // ctx ended
		}
	}
	p.services, p.slices = services.Lister(), endpointSlices.Lister()
	p.log.Info("informers synced; programming Services", "table", "inet "+p.cfg.Table)
	return p.loop(ctx)
}

func (p *Proxier) open() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dp != nil {
		return nil
	}
	dp, err := newDataplane(p.cfg)
	if err != nil {
		return err
	}
	p.dp = dp
	return nil
}

func (p *Proxier) closeDataplane() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dp != nil {
		p.dp.close()
		p.dp, p.applied = nil, nil
	}
}

// loop runs syncs: on changes, at most every MinSyncInterval; fully every
// ResyncPeriod and after a failure; failures retried with backoff.
func (p *Proxier) loop(ctx context.Context) error {
	full := time.NewTicker(p.cfg.ResyncPeriod)
	defer full.Stop()
	var (
		last  time.Time
		b     = backoff.Backoff{Initial: p.cfg.MinSyncInterval, Max: 30 * time.Second, Jitter: 0.2}
		retry <-chan time.Time
	)
	wantFull := true
	for {
		if !wantFull {
			select {
			case <-ctx.Done():
				return nil
			case <-p.trigger:
			case <-retry:
				wantFull = true
			case <-full.C:
				wantFull = true
			}
		}
		if wait := p.cfg.MinSyncInterval - time.Since(last); wait > 0 {
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(wait):
			}
		}
		select { // changes until now are part of this sync
		case <-p.trigger:
		default:
		}
		last = time.Now()
		err := p.sync(wantFull)
		wantFull = false
		if err != nil {
			d := b.Next()
			p.log.Error("sync failed; retrying with a full sync", "err", err, "in", d.Round(time.Millisecond))
			retry = time.After(d)
			continue
		}
		b.Reset()
		retry = nil
	}
}

// sync computes the desired table from the informers' caches and writes
// the difference in one transaction.
func (p *Proxier) sync(full bool) error {
	start := time.Now()
	ports, problems := p.collect()
	p.tell(problems)
	want := buildTable(p.modelConfig(), ports)

	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dp == nil {
		return errors.New("proxy is not running")
	}
	old := p.applied
	if full || old == nil {
		full = true
		var err error
		if old, err = p.dp.observe(want); err != nil {
			p.metrics.failed()
			return err
		}
	}
	pl := makePlan(old, want, full)
	if !pl.empty() {
		if err := p.dp.apply(pl); err != nil {
			p.applied = nil
			p.metrics.failed()
			return err
		}
	}
	p.applied = want
	cur := portStates(ports)
	if p.ports != nil || !full {
		stale := staleFlows(p.ports, cur, p.cfg.NodeIPs)
		n, err := p.dp.deleteFlows(stale)
		if err != nil {
			p.log.Warn("deleting stale UDP conntrack entries failed", "err", err)
		}
		if n > 0 {
			p.metrics.conntrackDeleted(n)
			p.log.Debug("deleted stale UDP conntrack entries", "count", n)
		}
	}
	p.ports = cur
	rules, elems := want.counts()
	d := time.Since(start)
	p.metrics.synced(full, d, len(want.chains), rules, elems)
	p.log.Debug("synced", "full", full, "duration", d, "ops", len(pl.touched()), "rules", rules, "elements", elems)
	return nil
}

func (p *Proxier) modelConfig() modelConfig {
	return modelConfig{
		clusterCIDRs: p.cfg.ClusterCIDRs,
		nodeIPs:      p.cfg.NodeIPs,
		masqAll:      p.cfg.MasqueradeAll,
		mark:         p.cfg.MasqueradeMark,
	}
}

// serviceProblems are the fields of one Service the table does not honour.
type serviceProblems struct {
	svc      *v1.Service
	problems []fieldProblem
}

// tell logs each Service's problems and records them as Warning Events on
// it, each problem once for as long as the Service has it.
func (p *Proxier) tell(all []serviceProblems) {
	told := make(map[types.UID]map[fieldProblem]bool, len(all))
	for _, sp := range all {
		key := sp.svc.Namespace + "/" + sp.svc.Name
		seen := map[fieldProblem]bool{}
		for _, pr := range sp.problems {
			seen[pr] = true
			if p.told[sp.svc.UID][pr] {
				continue
			}
			p.log.Warn("Service field not honoured", "service", key, "field", pr.field, "problem", pr.msg)
			if p.events != nil {
				p.events.Event(sp.svc, v1.EventTypeWarning, pr.reason, pr.String())
				p.metrics.evented()
			}
		}
		told[sp.svc.UID] = seen
	}
	p.told = told
}

// collect reads every Service and EndpointSlice from the caches and turns
// them into service ports, in a stable order, with the problems of each
// Service that has some.
func (p *Proxier) collect() ([]servicePort, []serviceProblems) {
	svcs, _ := p.services.List(labels.Everything())
	svcs = slices.DeleteFunc(svcs, func(svc *v1.Service) bool { return !ours(svc.Labels) })
	sls, _ := p.slices.List(labels.Everything())
	byService := map[string][]*discovery.EndpointSlice{}
	for _, sl := range sls {
		name := sl.Labels[discovery.LabelServiceName]
		if name == "" || !ours(sl.Labels) {
			continue
		}
		key := sl.Namespace + "/" + name
		byService[key] = append(byService[key], sl)
	}
	slices.SortFunc(svcs, func(a, b *v1.Service) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	var ports []servicePort
	var problems []serviceProblems
	for _, svc := range svcs {
		ps, pr := servicePorts(svc, byService[svc.Namespace+"/"+svc.Name], p.cfg.NodeName, p.cfg.Hostname)
		ports = append(ports, ps...)
		if len(pr) > 0 {
			problems = append(problems, serviceProblems{svc, pr})
		}
	}
	return ports, problems
}

// ours says whether a Service or EndpointSlice with labels l is the
// proxy's: not another proxy's, not headless.
func ours(l map[string]string) bool {
	_, other := l[labelServiceProxyName]
	_, headless := l[labelHeadless]
	return !other && !headless
}

// isOurs says whether obj, a Service or an EndpointSlice, is the proxy's
// (see ours); a deleted object whose last state is unknown may have been.
func isOurs(obj any) bool {
	m, err := meta.Accessor(obj)
	return err != nil || ours(m.GetLabels())
}

// Cleanup deletes the table. Call it after Run has returned, when the node
// stops serving Services; it is safe when there is no table.
func (p *Proxier) Cleanup() error {
	if err := p.open(); err != nil {
		return err
	}
	defer p.closeDataplane()
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.dp.deleteTable()
}
