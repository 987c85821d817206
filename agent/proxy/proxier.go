package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cairn-os/cairn/internal/backoff"
	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/labels"
	coreinformers "k8s.io/client-go/informers/core/v1"
	discoveryinformers "k8s.io/client-go/informers/discovery/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
)

// Proxier keeps the table in step with the cluster's Services and
// EndpointSlices. Create it with New, start it with Run, and remove its
// table with Cleanup.
type Proxier struct {
	cfg        Config
	client     kubernetes.Interface
	log        *slog.Logger
	metrics    *metrics
	trigger    chan struct{}
	lastChange atomic.Int64 // when the last change came, in Unix nanoseconds

	services corelisters.ServiceLister
	slices   cache.Indexer        // EndpointSlices, indexed by their Service
	events   record.EventRecorder // set by Run

	dirtyMu sync.Mutex
	dirty   map[string]bool // namespace/name of Services changed since the last sync

	mu sync.Mutex // one sync at a time; guards the fields below
	dp dataplane
	st *state // the kernel's table after the last successful transaction; nil: unknown
	// told holds, per Service, the problems already sent as Events, so
	// that each is told once and not on every sync.
	told map[string]map[fieldProblem]bool
	// refused holds the digests of the fragments the kernel refused, by
	// Service.
	refused map[string]string
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
		log:     cfg.Logger,
		metrics: newMetrics(),
		trigger: make(chan struct{}, 1),
		dirty:   map[string]bool{},
		told:    map[string]map[fieldProblem]bool{},
		refused: map[string]string{},
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
	p.lastChange.Store(time.Now().UnixNano())
	select {
	case p.trigger <- struct{}{}:
	default:
	}
}

// Run watches Services and EndpointSlices with the shared informers
// services and endpointSlices, which the caller starts, and syncs the
// table until ctx is done. The informers may hold every Service and slice:
// the proxy leaves out, in memory, those that are another proxy's or
// headless. The first sync, once the informers have listed everything, is
// a full one: it reads the kernel's table and removes whatever is stale, so
// a restarted proxier converges to the same table. Later syncs write only
// what changed, paced by syncDue, and a full one runs every ResyncPeriod.
// The table stays in place when Run returns: traffic keeps flowing while
// the agent restarts. Use Cleanup to remove it.
func (p *Proxier) Run(ctx context.Context, services coreinformers.ServiceInformer, endpointSlices discoveryinformers.EndpointSliceInformer) error {
	if err := p.cfg.validate(); err != nil {
		return err
	}
	if err := p.open(); err != nil {
		return err
	}
	defer p.closeDataplane()

	var stop func()
	p.events, stop = eventRecorder(ctx, p.client, EventSource, p.cfg.NodeName)
	defer stop()

	sliceInformer := endpointSlices.Informer()
	if _, ok := sliceInformer.GetIndexer().GetIndexers()[indexService]; !ok {
		if err := sliceInformer.AddIndexers(cache.Indexers{indexService: func(obj any) ([]string, error) {
			if key := sliceService(obj); key != "" {
				return []string{key}, nil
			}
			return nil, nil
		}}); err != nil {
			return fmt.Errorf("index EndpointSlices by Service: %w", err)
		}
	}
	onService := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { p.changed(serviceKey(obj)) },
		UpdateFunc: func(_, obj any) { p.changed(serviceKey(obj)) },
		DeleteFunc: func(obj any) { p.changed(serviceKey(obj)) },
	}
	onSlice := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { p.changed(sliceService(obj)) },
		UpdateFunc: func(old, obj any) { p.changed(sliceService(old)); p.changed(sliceService(obj)) },
		DeleteFunc: func(obj any) { p.changed(sliceService(obj)) },
	}
	for what, w := range map[string]struct {
		inf cache.SharedIndexInformer
		h   cache.ResourceEventHandler
	}{"Services": {services.Informer(), onService}, "EndpointSlices": {sliceInformer, onSlice}} {
		reg, err := w.inf.AddEventHandler(w.h)
		if err != nil {
			return fmt.Errorf("watch %s: %w", what, err)
		}
		defer func() { _ = w.inf.RemoveEventHandler(reg) }()
		if !cache.WaitForCacheSync(ctx.Done(), reg.HasSynced) {
			return nil // ctx ended
		}
	}
	p.services, p.slices = services.Lister(), sliceInformer.GetIndexer()
	p.log.Info("informers synced; programming Services", "table", "inet "+p.cfg.Table)
	return p.loop(ctx)
}

// eventRecorder returns a recorder of the Events of component on node,
// written through client until stop is called.
func eventRecorder(ctx context.Context, client kubernetes.Interface, component, node string) (r record.EventRecorder, stop func()) {
	events := record.NewBroadcaster(record.WithContext(ctx))
	events.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	return events.NewRecorder(scheme.Scheme, v1.EventSource{Component: component, Host: node}), events.Shutdown
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
		p.dp, p.st = nil, nil
	}
}

// loop runs syncs: on changes, when syncDue says; fully every
// ResyncPeriod and after a failure; failures retried with backoff.
func (p *Proxier) loop(ctx context.Context) error {
	full := time.NewTicker(p.cfg.ResyncPeriod)
	defer full.Stop()
	var (
		last  time.Time     // when the last sync started
		took  time.Duration // how long the last partial sync took
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
		for { // changes that come while it waits are part of this sync
			now := time.Now()
			wait := syncDue(now, last, time.Unix(0, p.lastChange.Load()), took, p.cfg.MinSyncInterval).Sub(now)
			if wait <= 0 {
				break
			}
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(wait):
			}
		}
		select {
		case <-p.trigger:
		default:
		}
		last = time.Now()
		err := p.sync(wantFull)
		if took = 0; !wantFull {
			took = time.Since(last)
		}
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

// Sync pacing: after a burst of changes ends, a sync waits for the
// changes to be quiet for syncQuiet, and starts no sooner after the last
// one than syncSpacing times that one's duration, so that syncing takes
// at most a fifth of a core however long a sync is at the cluster's size.
const (
	syncQuiet   = 100 * time.Millisecond
	syncSpacing = 5
)

// syncDue is when a sync of the changes made until now should start, given
// when the last sync started and how long it took (zero if it was a full
// one) and when the last change came. A change after MinSyncInterval
// without a sync is written at once. A burst of changes is written every
// minInterval while it lasts, and once more when it ends: the last change
// of a burst waits about syncQuiet, not up to minInterval.
func syncDue(now, last, lastChange time.Time, took, minInterval time.Duration) time.Time {
	burst := last.Add(minInterval)
	if !now.Before(burst) {
		return now
	}
	quiet := lastChange.Add(syncQuiet)
	if spaced := last.Add(syncSpacing * took); spaced.After(quiet) {
		quiet = spaced
	}
	if quiet.Before(burst) {
		return quiet
	}
	return burst
}

// changed marks the Service key (namespace/name) for the next sync.
func (p *Proxier) changed(key string) {
	if key == "" {
		return
	}
	p.dirtyMu.Lock()
	p.dirty[key] = true
	p.dirtyMu.Unlock()
	p.requestSync()
}

// takeDirty returns the Services changed since the last call.
func (p *Proxier) takeDirty() []string {
	p.dirtyMu.Lock()
	defer p.dirtyMu.Unlock()
	keys := slices.Sorted(maps.Keys(p.dirty))
	clear(p.dirty)
	return keys
}

// sync writes what changed in one transaction. A full sync builds every
// Service's fragment and compares the whole table with the kernel's; a
// partial one rebuilds the changed Services' fragments and writes their
// differences only.
func (p *Proxier) sync(full bool) error {
	start := time.Now()
	keys := p.takeDirty()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dp == nil {
		return errors.New("proxy is not running")
	}
	if full || p.st == nil {
		return p.fullSync(start)
	}
	if len(keys) == 0 {
		return nil
	}
	next := make(map[string]*fragment, len(keys))
	var oldPorts, curPorts []map[string]portState
	for _, key := range keys {
		next[key] = p.fragment(key)
		if old := p.st.services[key]; old != nil {
			oldPorts = append(oldPorts, old.ports)
		}
	}
	ops, err := p.change(next)
	if err != nil {
		p.st = nil
		p.metrics.failed()
		return err
	}
	for _, key := range keys {
		if fr := p.st.services[key]; fr != nil {
			curPorts = append(curPorts, fr.ports)
		}
	}
	p.flushStale(union(oldPorts), union(curPorts))
	p.synced(false, start, ops)
	return nil
}

// fullSync builds the whole table and writes what the kernel's lacks or
// has beyond it, in one transaction. If the kernel refuses it, the table
// is reset to its fixed part and the Services are added as change does,
// so that those whose objects the kernel refuses are left out and the
// others programmed. A Service refused before is left out while it is
// unchanged: it would be refused again.
func (p *Proxier) fullSync(start time.Time) error {
	svcs, _ := p.services.List(labels.Everything())
	keys := make([]string, 0, len(svcs))
	for _, svc := range svcs {
		keys = append(keys, svc.Namespace+"/"+svc.Name)
	}
	slices.Sort(keys)
	mc := p.modelConfig()
	st := newState(mc)
	for _, key := range keys {
		fr := p.fragment(key)
		if fr == nil {
			continue
		}
		if d, ok := p.refused[key]; ok && d == fr.digest() {
			continue
		}
		if c := st.put(key, fr); len(c) > 0 {
			p.tellConflicts(key, c)
		}
	}
	for key := range p.told {
		if st.services[key] == nil && p.refused[key] == "" {
			delete(p.told, key)
		}
	}
	var oldPorts map[string]portState
	if p.st != nil {
		oldPorts = p.st.ports()
	}
	ops, err := p.writeWhole(st)
	if err != nil {
		services := st.services
		if _, err2 := p.writeWhole(newState(mc)); err2 != nil {
			p.st = nil
			p.metrics.failed()
			return err
		}
		p.log.Warn("the kernel refused the full table; writing its Services in parts", "err", err)
		if ops, err = p.change(services); err != nil {
			p.metrics.failed()
			return err
		}
	}
	p.flushStale(oldPorts, p.st.ports())
	p.synced(true, start, ops)
	// A full sync's models and transaction, megabytes per thousand
	// Services, are garbage now: their pages go back to the kernel at once,
	// not over minutes at the runtime's pace. Full syncs are rare (at start,
	// every ResyncPeriod, after a failure), and the collection is cheap
	// beside the sync.
	debug.FreeOSMemory()
	return nil
}

// writeWhole makes the kernel's table st's, in one transaction, and st the
// proxier's state.
func (p *Proxier) writeWhole(st *state) (ops int, err error) {
	want := st.table()
	old, err := p.dp.observe(want)
	if err != nil {
		return 0, err
	}
	pl := makePlan(old, want, true)
	if !pl.empty() {
		if err := p.dp.apply(pl); err != nil {
			return 0, err
		}
	}
	p.st = st
	for key := range st.services {
		delete(p.refused, key)
	}
	return len(pl.touched()), nil
}

// change writes the fragments in next (nil: the Service is gone) in one
// transaction. If the kernel refuses it, the Services are written in
// halves, and those halves in halves, so that a Service whose objects the
// kernel refuses keeps what it had and is told why (an Event), and the
// others are programmed. If it refuses every Service, the fault is not
// theirs: the error is returned and the state is what the kernel has.
func (p *Proxier) change(next map[string]*fragment) (ops int, err error) {
	ops, err = p.tryChange(next)
	if err == nil || len(next) == 0 {
		return ops, err
	}
	refused := map[string]error{}
	ops = p.bisect(next, err, refused)
	if len(refused) == len(next) {
		return 0, err
	}
	for key, rerr := range refused {
		p.refuse(key, next[key], rerr)
	}
	return ops, nil
}

// bisect writes next, which the kernel refused as a whole with err, in
// halves; a Service refused on its own goes into refused.
func (p *Proxier) bisect(next map[string]*fragment, err error, refused map[string]error) (ops int) {
	keys := slices.Sorted(maps.Keys(next))
	if len(keys) == 1 {
		refused[keys[0]] = err
		return 0
	}
	for _, half := range [][]string{keys[:len(keys)/2], keys[len(keys)/2:]} {
		part := make(map[string]*fragment, len(half))
		for _, key := range half {
			part[key] = next[key]
		}
		n, err := p.tryChange(part)
		if err != nil {
			n = p.bisect(part, err, refused)
		}
		ops += n
	}
	return ops
}

// tryChange writes the fragments in next in one transaction; if the
// kernel refuses it, the state stays what the kernel has.
func (p *Proxier) tryChange(next map[string]*fragment) (ops int, err error) {
	old := make(map[string]*fragment, len(next))
	for key := range next {
		old[key] = p.st.services[key]
	}
	before, after, conflicts := p.st.change(next)
	pl := makePlan(before, after, false)
	if !pl.empty() {
		if err := p.dp.apply(pl); err != nil {
			p.st.change(old)
			return 0, err
		}
	}
	for key, c := range conflicts {
		p.tellConflicts(key, c)
	}
	for key := range next {
		delete(p.refused, key)
	}
	return len(pl.touched()), nil
}

// refuse tells that the kernel refused the Service key's objects fr: they
// stay out of the table, and so out of later full syncs while the
// Service's fragment is the same.
func (p *Proxier) refuse(key string, fr *fragment, err error) {
	p.refused[key] = fr.digest()
	p.log.Warn("the kernel refused a Service's nftables objects; it keeps what it had", "service", key, "err", err)
	p.tellMore(key, fieldProblem{reason: reasonKernelRefused, field: "spec", msg: "not programmed: the kernel refused its nftables objects: " + err.Error()})
}

// flushStale deletes the conntrack entries that the change from old to cur
// left stale.
func (p *Proxier) flushStale(old, cur map[string]portState) {
	n, err := p.dp.deleteFlows(staleFlows(old, cur, p.cfg.NodeIPs))
	if err != nil {
		p.log.Warn("deleting stale UDP conntrack entries failed", "err", err)
	}
	if n > 0 {
		p.metrics.conntrackDeleted(n)
		p.log.Debug("deleted stale UDP conntrack entries", "count", n)
	}
}

func (p *Proxier) synced(full bool, start time.Time, ops int) {
	chains, rules, elems := p.st.counts()
	d := time.Since(start)
	p.metrics.synced(full, d, chains, rules, elems)
	p.log.Debug("synced", "full", full, "duration", d, "ops", ops, "rules", rules, "elements", elems)
}

// fragment builds the fragment of the Service key (namespace/name) from
// the informers' caches, and tells its problems; nil if the Service is
// gone or not the proxy's.
func (p *Proxier) fragment(key string) *fragment {
	ns, name, _ := strings.Cut(key, "/")
	svc, err := p.services.Services(ns).Get(name)
	if err != nil || !ours(svc.Labels) {
		delete(p.told, key)
		return nil
	}
	objs, _ := p.slices.ByIndex(indexService, key)
	var sls []*discovery.EndpointSlice
	for _, o := range objs {
		if sl, ok := o.(*discovery.EndpointSlice); ok && ours(sl.Labels) {
			sls = append(sls, sl)
		}
	}
	ports, problems := servicePorts(svc, sls, p.cfg.NodeName, p.cfg.Hostname)
	p.tell(key, svc, problems)
	mc := p.modelConfig()
	return buildFragment(&mc, ports)
}

func (p *Proxier) modelConfig() modelConfig {
	return modelConfig{
		clusterCIDRs: p.cfg.ClusterCIDRs,
		nodeIPs:      p.cfg.NodeIPs,
		masqAll:      p.cfg.MasqueradeAll,
		mark:         p.cfg.MasqueradeMark,
	}
}

// tell logs a Service's problems and records them as Warning Events on
// it, each problem once for as long as the Service has it.
func (p *Proxier) tell(key string, svc *v1.Service, problems []fieldProblem) {
	seen := map[fieldProblem]bool{}
	for _, pr := range problems {
		seen[pr] = true
		if p.told[key][pr] {
			continue
		}
		p.log.Warn("Service not programmed as asked", "service", key, "field", pr.field, "problem", pr.msg)
		if p.events != nil {
			p.events.Event(svc, v1.EventTypeWarning, pr.reason, pr.String())
			p.metrics.evented()
		}
	}
	if len(seen) == 0 {
		delete(p.told, key)
		return
	}
	p.told[key] = seen
}

// tellConflicts tells the elements of Service key that another Service
// has (a shared external IP and port, or NodePort): the first keeps them.
func (p *Proxier) tellConflicts(key string, conflicts []setElem) {
	var problems []fieldProblem
	for _, c := range conflicts {
		problems = append(problems, conflictProblem(c))
	}
	p.tellMore(key, problems...)
}

// tellMore tells problems of the Service key besides those told already.
func (p *Proxier) tellMore(key string, more ...fieldProblem) {
	ns, name, _ := strings.Cut(key, "/")
	svc, err := p.services.Services(ns).Get(name)
	if err != nil {
		return
	}
	problems := slices.AppendSeq(more, maps.Keys(p.told[key]))
	p.tell(key, svc, problems)
}

// ours says whether a Service or EndpointSlice with labels l is the
// proxy's: not another proxy's, not headless.
func ours(l map[string]string) bool {
	_, other := l[labelServiceProxyName]
	_, headless := l[labelHeadless]
	return !other && !headless
}

// indexService indexes EndpointSlices by their Service's namespace/name.
const indexService = "cairn-proxy-service"

// serviceKey is a Service's namespace/name.
func serviceKey(obj any) string {
	key, _ := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	return key
}

// sliceService is an EndpointSlice's Service's namespace/name, "" if it
// has none.
func sliceService(obj any) string {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	m, err := meta.Accessor(obj)
	if err != nil || m.GetLabels()[discovery.LabelServiceName] == "" {
		return ""
	}
	return m.GetNamespace() + "/" + m.GetLabels()[discovery.LabelServiceName]
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
