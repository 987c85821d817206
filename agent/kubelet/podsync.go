package kubelet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	resourcehelper "k8s.io/component-helpers/resource"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cairn-os/cairn/agent/kubelet/imagegc"
	"github.com/cairn-os/cairn/agent/kubelet/logrotate"
	"github.com/cairn-os/cairn/agent/kubelet/pods"
	"github.com/cairn-os/cairn/agent/kubelet/probe"
	"github.com/cairn-os/cairn/agent/node"
	"github.com/cairn-os/cairn/agent/node/host"
)

// The pod sync loop. The node runs one goroutine per pod UID, for the
// pods of two sources: its static pods (static.go), from the start, and
// once it joined the Pods bound to it in the API, which it watches (the
// Node authorizer lets a node list and watch Pods only by the field
// selector spec.nodeName=NODE), but for the static pods' mirrors
// (mirror.go). A static pod's status stays here, for its mirror; its
// removal from the directory counts as its object gone, though it is
// killed with its grace period. Each pod is in one phase (podPhase),
// which advance alone changes:
//
//   - syncing: the goroutine calls the worker's Sync when the pod changes
//     and every PodResync, later after errors (backoff), and patches the
//     Pod's status when what it sees differs from what the API holds. A
//     pod in a terminal API phase is not synced again: its containers
//     would otherwise be started anew should its sandbox be gone. A pod
//     the node's admission refuses (admit.go) ends Failed before
//     anything of it starts; one that runs past its activeDeadlineSeconds
//     (counted from status.startTime, as its spec now says) is stopped
//     and ends Failed, DeadlineExceeded. The status tells the spec's
//     generation it comes from (observedGeneration).
//   - terminating: its deletion was asked for (deletionTimestamp), and it
//     is killed with its grace period and then its object deleted with
//     grace 0, which takes the object away; or its object went away
//     without that, and it is killed at once.
//   - terminated: killed and its object deleted; it waits for the watch
//     to tell the object is gone.
//   - gone: the object is gone and nothing of the pod runs; the node
//     forgets it.

// wakeSource is what woke a pod's worker to sync the pod: the label of
// the pod_worker_wakeups_total metric.
type wakeSource string

const (
	wakePod      wakeSource = "pod"      // the Pod object was added, its spec changed, or it is being deleted
	wakeEvent    wakeSource = "event"    // a CRI container event (pleg)
	wakeRelist   wakeSource = "relist"   // the runtime's periodic list (pleg)
	wakeProbe    wakeSource = "probe"    // a probe's result changed
	wakeConflict wakeSource = "conflict" // a status write met a newer Pod
	wakeResync   wakeSource = "resync"   // PodResync passed
	wakeBackoff  wakeSource = "backoff"  // a container's back-off ended
	wakeDeadline wakeSource = "deadline" // the pod's activeDeadlineSeconds passed
	wakeRetry    wakeSource = "retry"    // the error back-off after a failed sync ended
	wakeResize   wakeSource = "resize"   // a pod left the node, where a deferred resize may fit now
)

// housekeepingInterval is how often the runtime's sandboxes of pods the
// node no longer has are removed.
const housekeepingInterval = 30 * time.Second

// podSyncer runs the node's pods.
type podSyncer struct {
	k       *Kubelet
	node    func() *corev1.Node // the Node the pods run on
	scheme  string              // of container IDs: "containerd"
	worker  *pods.Worker
	probes  *probe.Manager
	results *probe.Results
	// ctx is Run's, which the pods' goroutines run on.
	ctx context.Context
	// mirrorWake wakes runMirrors: the static pods or their status
	// changed.
	mirrorWake chan struct{}

	// shutdown is the node's shutdown once it began (shutdown.go).
	shutdown atomic.Pointer[nodeShutdown]
	// evicted holds the podEnd of each pod evicted under pressure, by
	// UID; lastEvicted is the last one, which watchPressure alone uses.
	evicted     sync.Map
	lastEvicted types.UID
	// softSince is since when the first soft threshold crossed has been,
	// by signal name; watchPressure alone uses it.
	softSince map[string]time.Time

	mu      sync.Mutex
	workers map[types.UID]*podWorker // until the pod is gone
	static  map[types.UID]*corev1.Pod
	wg      sync.WaitGroup
}

// podPhase is where a pod is in its life on the node (see above).
type podPhase int

const (
	podSyncing podPhase = iota
	podTerminating
	podTerminated
	podGone
)

// podEvent is what moves a pod from one phase to the next.
type podEvent int

const (
	podDeleting podEvent = iota // the Pod has a deletionTimestamp
	podRemoved                  // the watch told the object is gone
	podKilled                   // its containers and volumes are gone, its object deleted unless gone
)

// podWorker is the goroutine of one pod.
type podWorker struct {
	uid  types.UID
	seen time.Time // when the node first saw the pod
	wake chan struct{}
	// admitted says the pod passed the node's admission (admit.go),
	// which is done once; only the pod's goroutine uses it.
	admitted bool
	// ended is closed once the node ended the pod (podEnd) or its
	// goroutine returned.
	ended     chan struct{}
	endedOnce sync.Once

	mu    sync.Mutex
	pod   *corev1.Pod // latest seen
	phase podPhase
	// objectGone says the watch told the object is gone: the kill takes
	// no grace, and there is no object to delete.
	objectGone bool
	// cancelSync cancels the Sync in flight, if any: a pod being deleted
	// need not wait for an image pull.
	cancelSync context.CancelFunc
	// wakes holds what said, since the last sync, that the runtime's
	// containers or a probe's result changed, or that a status write met
	// a newer Pod: sync without waiting.
	wakes []wakeSource
}

// advance moves w to its next phase after e, the one place where a pod's
// phase changes; w.mu is held. Entering terminating cancels the Sync in
// flight.
func (w *podWorker) advance(e podEvent) {
	if e == podRemoved {
		w.objectGone = true
	}
	from := w.phase
	switch {
	case from == podSyncing && (e == podDeleting || e == podRemoved):
		w.phase = podTerminating
	case from == podTerminating && e == podKilled:
		w.phase = podTerminated
	}
	if w.phase == podTerminated && w.objectGone {
		w.phase = podGone
	}
	if from == podSyncing && w.phase != podSyncing && w.cancelSync != nil {
		w.cancelSync()
	}
}

// newSyncer makes the pod worker, the probes and the syncer of k.
func (k *Kubelet) newSyncer() error {
	results := probe.NewResults()
	worker, stop, err := k.newPodWorker(results)
	if err != nil {
		return err // pods.New's, which names the pod worker
	}
	probes, err := probe.New(probe.Config{Runtime: k.cfg.Pods.Runtime, Results: results, Stopper: worker, Events: worker,
		Probed: k.metrics.probed, Log: k.log})
	if err != nil {
		stop()
		return fmt.Errorf("probes: %w", err)
	}
	k.stop = stop
	k.syncer = &podSyncer{k: k, node: k.hostNode, worker: worker, probes: probes, results: results,
		workers: map[types.UID]*podWorker{}, static: map[types.UID]*corev1.Pod{}, mirrorWake: make(chan struct{}, 1),
		softSince: map[string]time.Time{},
		scheme:    "containerd"}
	k.qos.active = k.syncer.activePods
	return nil
}

// Run runs the node's pods until ctx ends and returns once everything it
// started has stopped: the static pods from the start, the API's once
// Join is called. Run is called once.
func (k *Kubelet) Run(ctx context.Context) {
	defer k.stop()
	s := k.syncer
	if v, err := k.cfg.RuntimeInfo.RuntimeVersion(ctx); err == nil {
		if i := indexScheme(v); i > 0 {
			s.scheme = v[:i]
		}
	}
	s.ctx = ctx
	if m, err := host.ReadMemory(); err != nil {
		k.log.Warn("the pods' cgroups are not limited: the node's memory", "err", err)
	} else if err := k.qos.setup(int64(m.Total) - node.ReservedMemory); err != nil {
		k.log.Warn("the pods' cgroups", "err", err)
	}
	var src *staticSource
	if k.cfg.StaticPodDir != "" {
		src = newStaticSource(k.cfg.StaticPodDir, k.cfg.NodeName, k.log)
		s.setStatic(src.read())
	}
	close(k.started)
	k.log.Info("pod sync loop started", "static pods", len(s.static))
	if src != nil {
		s.wg.Go(func() { s.watchStatic(ctx, src, k.cfg.staticResync) })
	}
	s.wg.Go(func() { s.probeUpdates(ctx) })
	p := &pleg{rt: k.cfg.Pods.Runtime, wake: s.changed, log: k.log, relistEvery: k.cfg.plegRelist}
	s.wg.Go(func() { p.run(ctx) })
	rotator := &logrotate.Rotator{Runtime: k.cfg.Pods.Runtime, Log: k.log}
	s.wg.Go(func() { rotator.Run(ctx) })
	s.wg.Go(func() { s.watchPressure(ctx) })
	images := imagegc.New(imagegc.Config{Runtime: k.cfg.Pods.Runtime, Images: k.cfg.Pods.Images, Log: k.log.With("part", "image gc")})
	s.wg.Go(func() { images.Run(ctx) })
	<-ctx.Done()
	s.wg.Wait()
	s.probes.RemoveAll()
}

// Join adds the Pods bound to the node in the API, watched with m's
// informers, to the pods Run runs, and keeps the static pods' mirror Pods
// there, until ctx ends. It is the node's "kubelet" component
// (node.Component's Run): m's client is the node's from then on.
func (k *Kubelet) Join(ctx context.Context, m *node.Member) error {
	select {
	case <-k.started:
	case <-ctx.Done():
		return nil
	}
	s := k.syncer
	stopEvents := k.join(m)
	defer stopEvents()
	// The pods' goroutines run on Run's context: a Join that ends (the
	// component restarted) does not stop the pods it handed over.
	inf := m.Informers.Core().V1().Pods().Informer()
	reg, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { s.seen(s.ctx, obj) },
		UpdateFunc: func(_, obj any) { s.seen(s.ctx, obj) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if pod, ok := obj.(*corev1.Pod); ok {
				s.removed(s.ctx, pod)
			}
		},
	})
	if err != nil {
		return fmt.Errorf("watch the node's pods: %w", err)
	}
	defer func() { _ = inf.RemoveEventHandler(reg) }()
	k.log.Info("pod sync loop joined the cluster")
	var wg sync.WaitGroup
	wg.Go(func() { s.runMirrors(ctx, m, inf.GetStore()) })
	if cache.WaitForCacheSync(ctx.Done(), reg.HasSynced) {
		wg.Go(func() { s.housekeeping(ctx, inf.GetStore()) })
	}
	<-ctx.Done()
	wg.Wait()
	return nil
}

// probeUpdates wakes the pods whose probe results changed, until ctx
// ends.
func (s *podSyncer) probeUpdates(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case u := <-s.results.Updates():
			s.changed(u.UID, wakeProbe)
		}
	}
}

// changed wakes a pod's goroutine for a change in the runtime or a probe
// result, which source tells.
func (s *podSyncer) changed(uid types.UID, source wakeSource) {
	s.mu.Lock()
	w := s.workers[uid]
	s.mu.Unlock()
	if w != nil {
		w.nudge(source)
	}
}

// nudge has the goroutine sync without waiting, for source.
func (w *podWorker) nudge(source wakeSource) {
	w.mu.Lock()
	if !slices.Contains(w.wakes, source) {
		w.wakes = append(w.wakes, source)
	}
	w.mu.Unlock()
	w.poke()
}

func indexScheme(v string) int {
	for i := 0; i+3 <= len(v); i++ {
		if v[i:i+3] == "://" {
			return i
		}
	}
	return -1
}

// seen hands the latest version of a pod to its goroutine, starting one
// if it has none.
func (s *podSyncer) seen(ctx context.Context, obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	if isMirror(pod) {
		s.pokeMirrors() // its static pod runs, not it
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.see(ctx, pod, false)
}

// see hands pod to its goroutine, starting one if it has none; removed
// says its object is gone. s.mu is held.
func (s *podSyncer) see(ctx context.Context, pod *corev1.Pod, removed bool) {
	w := s.workers[pod.UID]
	if w == nil {
		if ctx.Err() != nil {
			return
		}
		w = &podWorker{uid: pod.UID, seen: time.Now(), wake: make(chan struct{}, 1), ended: make(chan struct{})}
		s.workers[pod.UID] = w
		wctx, cancel := context.WithCancel(ctx)
		s.wg.Go(func() {
			defer cancel()
			s.runWorker(wctx, w)
		})
	}
	w.mu.Lock()
	if w.phase < podTerminated {
		w.pod = pod
	}
	switch {
	case removed:
		w.advance(podRemoved)
	case pod.DeletionTimestamp != nil:
		w.advance(podDeleting)
	}
	if w.phase == podGone {
		delete(s.workers, pod.UID)
	}
	w.mu.Unlock()
	w.poke()
}

// removed tells a pod's goroutine that the object is gone; if none runs,
// one is started to make sure the pod's containers are gone too.
func (s *podSyncer) removed(ctx context.Context, pod *corev1.Pod) {
	if isMirror(pod) {
		s.pokeMirrors() // made again if its static pod runs
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.see(ctx, pod, true)
}

// killed moves w on once its pod was killed, and then has the pods whose
// resize was deferred try again: it may fit now.
func (s *podSyncer) killed(w *podWorker) {
	defer s.retryDeferredResizes() // once the locks are released
	// Once the locks are released: it lists the pods.
	defer func() { s.k.qos.weighBurstable(s.activePods()) }()
	s.mu.Lock()
	defer s.mu.Unlock()
	w.mu.Lock()
	defer w.mu.Unlock()
	w.advance(podKilled)
	if w.phase == podGone && s.workers[w.uid] == w {
		delete(s.workers, w.uid)
		// A static pod's manifest put back while the pod was stopping
		// starts it again.
		if p := s.static[w.uid]; p != nil {
			s.see(s.ctx, p, false)
		}
	}
}

// markEnded says the pod ended for good, or its goroutine returned.
func (w *podWorker) markEnded() { w.endedOnce.Do(func() { close(w.ended) }) }

func (w *podWorker) poke() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// latest is the pod as last seen, its phase, whether its object is gone,
// and what woke the goroutine since the last call.
func (w *podWorker) latest() (pod *corev1.Pod, phase podPhase, objectGone bool, wakes []wakeSource) {
	w.mu.Lock()
	defer w.mu.Unlock()
	wakes, w.wakes = w.wakes, nil
	return w.pod, w.phase, w.objectGone, wakes
}

// setStatus keeps status as a static pod's, which has no object in the
// API to hold it, and reports whether it changed.
func (w *podWorker) setStatus(status corev1.PodStatus) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if apiequality.Semantic.DeepEqual(w.pod.Status, status) {
		return false
	}
	p := *w.pod
	p.Status = status
	w.pod = &p
	return true
}

// setLatest keeps pod, as the API server returned it after a write, unless
// a newer version was seen meanwhile.
func (w *podWorker) setLatest(pod *corev1.Pod) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.pod == nil || newerOrSame(pod.ResourceVersion, w.pod.ResourceVersion) {
		w.pod = pod
	}
}

// newer says whether a newer version of pod than this one was seen.
func (w *podWorker) newer(pod *corev1.Pod) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.pod != nil && w.pod.ResourceVersion != pod.ResourceVersion && newerOrSame(w.pod.ResourceVersion, pod.ResourceVersion)
}

// newerOrSame compares resource versions, which the API server makes
// from etcd's revisions: decimal numbers.
func newerOrSame(a, b string) bool {
	if len(a) != len(b) {
		return len(a) > len(b)
	}
	return a >= b
}

// runWorker syncs one pod while it is syncing and kills it once it is
// terminating, until it is killed or ctx ends.
func (s *podSyncer) runWorker(ctx context.Context, w *podWorker) {
	defer w.markEnded()
	defer s.probes.Remove(w.uid)
	defer s.k.metrics.podGone(w.uid)
	log := s.k.log
	errBackoff := newBackoff(time.Second, 30*time.Second)
	var synced *corev1.Pod // the pod as last synced, to tell spec changes from status writes
	next := time.Now()
	due := wakePod // what the timer is set for
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.wake:
		case <-timer.C:
		}
		pod, phase, objectGone, wakes := w.latest()
		if pod == nil {
			continue
		}
		if phase >= podTerminated {
			return
		}
		log := log.With("pod", pod.Namespace+"/"+pod.Name, "uid", pod.UID)
		// A wake by an update that changed only the status (our own
		// writes) waits for the timer, which keeps the error backoff.
		podChanged := synced == nil || phase == podTerminating || pod.Generation != synced.Generation || gatesChanged(synced, pod)
		if !podChanged && len(wakes) == 0 && time.Now().Before(next) {
			continue
		}
		// Counted by each source that asked for this sync; the timer's
		// only when nothing else did.
		for _, source := range wakes {
			s.k.metrics.woke(source)
		}
		switch {
		case podChanged:
			s.k.metrics.woke(wakePod)
		case len(wakes) == 0:
			s.k.metrics.woke(due)
		}
		var err error
		var at timedWake
		switch phase {
		case podSyncing:
			at, err = s.syncOnce(ctx, w, pod, log)
		case podTerminating:
			s.probes.Terminating(pod.UID)
			if err = s.terminateShowingReadiness(ctx, w, pod, objectGone, log); err == nil {
				s.killed(w)
				return
			}
		}
		synced = pod
		d := s.k.cfg.PodResync
		due = wakeResync
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			// The error backoff spaces out retries of what failed, often
			// a status write to an API server that is away.
			if b := errBackoff.Next(); b > d {
				d, due = b, wakeRetry
			}
		} else {
			errBackoff.Reset()
		}
		// A container's back-off ends when it ends, whatever else failed:
		// restarting it needs only the runtime; so does killing a pod
		// past its deadline.
		if !at.at.IsZero() && time.Until(at.at) < d {
			d, due = max(time.Until(at.at), 0), at.source
		}
		if err != nil {
			log.Warn("pod sync failed", "err", err, "retry in", d)
		}
		next = time.Now().Add(d)
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(d)
	}
}

// timedWake is when a pod is worth syncing again, and why; zero if only
// its resync is due.
type timedWake struct {
	at     time.Time
	source wakeSource
}

// syncOnce takes the next steps for a running pod and reports its status;
// the returned wake, if set, is when a backoff ends or its deadline
// passes. A pod the node's admission refuses, or whose deadline passed,
// ends Failed instead, with nothing started again.
func (s *podSyncer) syncOnce(ctx context.Context, w *podWorker, pod *corev1.Pod, log *slog.Logger) (timedWake, error) {
	if terminal(pod.Status.Phase) {
		return timedWake{}, nil // ended for good: nothing runs again
	}
	if !w.admitted {
		if reason, message := admit(pod, s.node()); reason != "" {
			return timedWake{}, s.reject(ctx, w, pod, reason, message, log)
		}
		w.admitted = true
	}
	sctx, cancel := context.WithTimeout(ctx, 5*time.Minute) // image pulls take long
	w.mu.Lock()
	terminating := w.phase != podSyncing
	w.cancelSync = cancel
	w.mu.Unlock()
	if terminating {
		cancel()
		w.poke() // deleted meanwhile: terminate next
		return timedWake{}, nil
	}
	var st *pods.Status
	var syncErr error
	end := s.endOf(pod)
	if end != nil {
		st, syncErr = s.stopEnded(sctx, pod, end, log)
	} else {
		st, syncErr = s.worker.Sync(sctx, pod)
	}
	w.mu.Lock()
	w.cancelSync = nil
	w.mu.Unlock()
	canceled := sctx.Err() == context.Canceled
	cancel()
	if ctx.Err() != nil {
		return timedWake{}, ctx.Err()
	}
	if canceled {
		w.poke() // deleted meanwhile: terminate next
		return timedWake{}, nil
	}
	if st == nil {
		// The runtime could not be read: the API keeps the last status,
		// and the probes go on until the runtime answers again.
		return timedWake{}, syncErr
	}
	if end != nil && syncErr != nil {
		return timedWake{}, syncErr // not stopped yet: it is not over
	}
	status := s.podStatus(pod, st, metav1.Now())
	if end != nil {
		status.Phase, status.Reason, status.Message = corev1.PodFailed, end.reason, end.message
		if c := end.condition; c != nil {
			c.LastTransitionTime = metav1.Now()
			status.Conditions = append(slices.DeleteFunc(status.Conditions, func(o corev1.PodCondition) bool { return o.Type == c.Type }), *c)
		}
		defer w.markEnded() // stopped; its status written if it can be
	}
	next := timedWake{at: st.RetryAt(), source: wakeBackoff}
	if d := deadline(pod, status.StartTime); !d.IsZero() && end == nil && (next.at.IsZero() || d.Before(next.at)) {
		next = timedWake{at: d, source: wakeDeadline}
	}
	var running []probe.Running
	if !terminal(status.Phase) {
		for _, c := range slices.Concat(st.InitContainers, st.Containers) { // sidecars have probes too
			if c.State == pods.Running {
				running = append(running, probe.Running{Name: c.Name, ContainerID: c.ID})
			}
		}
	}
	s.probes.Update(pod, status.PodIP, running)
	if terminal(status.Phase) && st.SandboxID != "" {
		// Nothing will run again: release the pod's network, keeping
		// the exited containers and their logs until the pod is deleted.
		rctx, cancel := context.WithTimeout(ctx, requestTimeout)
		_, err := s.k.cfg.Pods.Runtime.StopPodSandbox(rctx, &criv1.StopPodSandboxRequest{PodSandboxId: st.SandboxID})
		cancel()
		if err != nil {
			return next, errors.Join(syncErr, fmt.Errorf("stop sandbox of ended pod: %w", err))
		}
	}
	written, err := s.publish(ctx, w, pod, status)
	if err != nil {
		return next, errors.Join(syncErr, err)
	}
	if written && status.Phase != pod.Status.Phase {
		log.Info("pod phase", "phase", status.Phase)
		if status.Phase == corev1.PodRunning && pod.Status.Phase == corev1.PodPending {
			s.k.metrics.podStarted(w.seen)
		}
	}
	return next, syncErr
}

// publish writes status as pod's, in the API, or here for a static pod,
// whose mirror Pod shows it; written says it changed.
func (s *podSyncer) publish(ctx context.Context, w *podWorker, pod *corev1.Pod, status corev1.PodStatus) (written bool, err error) {
	if isStatic(pod) {
		if written = w.setStatus(status); written {
			s.pokeMirrors()
		}
		return written, nil
	}
	return s.writeStatus(ctx, w, pod, status)
}

// reject ends pod Failed, without starting anything of it, for the
// reason and message of the node's admission, told in an event too.
func (s *podSyncer) reject(ctx context.Context, w *podWorker, pod *corev1.Pod, reason, message string, log *slog.Logger) error {
	status := *pod.Status.DeepCopy()
	status.Phase, status.Reason, status.Message = corev1.PodFailed, reason, message
	status.ObservedGeneration = pod.Generation
	written, err := s.publish(ctx, w, pod, status)
	if written {
		s.worker.Event(pod, "", corev1.EventTypeWarning, reason, "%s", message)
		log.Info("pod rejected", "reason", reason, "message", message)
	}
	return err
}

// The status of a pod killed for running past its activeDeadlineSeconds,
// in the kubelet's words.
const (
	deadlineReason  = "DeadlineExceeded"
	deadlineMessage = "Pod was active on the node longer than the specified deadline"
)

// deadline is when pod, started at start, runs out its
// activeDeadlineSeconds; zero if it has none or has not started.
func deadline(pod *corev1.Pod, start *metav1.Time) time.Time {
	if pod.Spec.ActiveDeadlineSeconds == nil || start == nil {
		return time.Time{}
	}
	return start.Add(time.Duration(*pod.Spec.ActiveDeadlineSeconds) * time.Second)
}

// pastDeadline says whether pod, as the API holds it, ran past its
// activeDeadlineSeconds at now.
func pastDeadline(pod *corev1.Pod, now time.Time) bool {
	d := deadline(pod, pod.Status.StartTime)
	return !d.IsZero() && !now.Before(d)
}

// stopEnded stops the containers and sandbox of pod, which the node ends
// for good as end says, and returns what the runtime then holds: their
// ends, for the pod's Failed status.
func (s *podSyncer) stopEnded(ctx context.Context, pod *corev1.Pod, end *podEnd, log *slog.Logger) (*pods.Status, error) {
	log.Info("ending the pod", "reason", end.reason, "grace", end.grace)
	s.worker.Event(pod, "", corev1.EventTypeNormal, end.reason, "%s", end.message)
	stopErr := s.worker.Stop(ctx, pod, end.grace)
	st, err := s.worker.Observe(ctx, pod)
	if err != nil {
		return nil, errors.Join(stopErr, err)
	}
	if st == nil {
		st = &pods.Status{} // nothing of it ever ran
	}
	return st, stopErr
}

// gatesChanged says whether the conditions of pod's readiness gates, which
// others set through the status, changed from was to is: its Ready
// condition follows them.
func gatesChanged(was, is *corev1.Pod) bool {
	for _, g := range is.Spec.ReadinessGates {
		find := func(p *corev1.Pod) corev1.ConditionStatus {
			for _, c := range p.Status.Conditions {
				if c.Type == g.ConditionType {
					return c.Status
				}
			}
			return ""
		}
		if find(was) != find(is) {
			return true
		}
	}
	return false
}

// terminate kills a pod whose deletion was asked for and then deletes
// its object, or, if its object is gone, kills it at once.
func (s *podSyncer) terminate(ctx context.Context, pod *corev1.Pod, objectGone bool, log *slog.Logger) error {
	grace := pods.GracePeriod(pod)
	if objectGone && !isStatic(pod) {
		grace = 0 // a removed manifest's pod stops with its grace period
	}
	kctx, cancel := context.WithTimeout(ctx, grace+time.Minute)
	err := s.worker.Terminate(kctx, pod, grace)
	cancel()
	if err != nil {
		return err
	}
	if err := s.k.qos.remove(pod); err != nil {
		return err
	}
	if objectGone {
		log.Info("pod gone, its containers removed")
		return nil
	}
	dctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	uid := pod.UID
	err = s.k.client().CoreV1().Pods(pod.Namespace).Delete(dctx, pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: new(int64),
		Preconditions:      &metav1.Preconditions{UID: &uid},
	})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("delete the Pod object: %w", err)
	}
	log.Info("pod killed and deleted", "grace", grace)
	return nil
}

// housekeeping removes, now and then, the runtime's sandboxes, the
// volumes and (a minute later) the container logs of pods the node no
// longer has: deleted, or deleted while the agent was not running; and
// weighs the Burstable class.
func (s *podSyncer) housekeeping(ctx context.Context, store cache.Store) {
	for {
		s.removeOrphans(ctx, store)
		// After a restart, no pod is new: the class is weighed here.
		s.k.qos.weighBurstable(s.activePods())
		if !sleep(ctx, housekeepingInterval) {
			return
		}
	}
}

// removeOrphans has the worker remove what pods that neither the API nor
// a pod goroutine knows left on the node.
func (s *podSyncer) removeOrphans(ctx context.Context, store cache.Store) {
	known := map[types.UID]bool{}
	for _, obj := range store.List() {
		if pod, ok := obj.(*corev1.Pod); ok {
			known[pod.UID] = true
		}
	}
	s.worker.Cleanup(ctx, func(uid types.UID) bool {
		if known[uid] {
			return true
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.workers[uid] != nil
	})
}

func terminal(p corev1.PodPhase) bool {
	return p == corev1.PodSucceeded || p == corev1.PodFailed
}

// retryDeferredResizes wakes the workers of the pods whose resize is
// Deferred.
func (s *podSyncer) retryDeferredResizes() {
	for _, w := range s.podWorkers() {
		w.mu.Lock()
		pod := w.pod
		w.mu.Unlock()
		if pod == nil {
			continue
		}
		if i := slices.IndexFunc(pod.Status.Conditions, func(c corev1.PodCondition) bool {
			return c.Type == corev1.PodResizePending && c.Reason == corev1.PodReasonDeferred
		}); i >= 0 {
			w.nudge(wakeResize)
		}
	}
}

// activePods are the pods whose containers run, or are yet to stop.
func (s *podSyncer) activePods() []*corev1.Pod {
	var out []*corev1.Pod
	for _, w := range s.podWorkers() {
		w.mu.Lock()
		if w.pod != nil && (w.phase == podSyncing || w.phase == podTerminating) {
			out = append(out, w.pod)
		}
		w.mu.Unlock()
	}
	return out
}

// podWorkers are the workers of the node's pods now.
func (s *podSyncer) podWorkers() []*podWorker {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*podWorker, 0, len(s.workers))
	for _, w := range s.workers {
		out = append(out, w)
	}
	return out
}

// resizeFits admits the resize of pod, running on the node, as the
// kubelet does: Infeasible if its new requests exceed what the node has
// allocatable at all, Deferred if they do not fit beside the requests of
// the node's other pods, with the kubelet's messages.
func (k *Kubelet) resizeFits(pod *corev1.Pod) (reason, message string) {
	s := k.syncer
	allocatable := s.node().Status.Allocatable
	want := resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{})
	used := corev1.ResourceList{}
	for _, w := range s.podWorkers() {
		w.mu.Lock()
		other := w.pod
		w.mu.Unlock()
		if other == nil || other.UID == pod.UID || terminal(other.Status.Phase) {
			continue
		}
		for name, q := range resourcehelper.PodRequests(other, resourcehelper.PodResourcesOptions{}) {
			sum := used[name]
			sum.Add(q)
			used[name] = sum
		}
	}
	for _, name := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		req, ok := want[name]
		capacity, known := allocatable[name]
		if !ok || !known {
			continue
		}
		value := func(q resource.Quantity) int64 {
			if name == corev1.ResourceCPU {
				return q.MilliValue()
			}
			return q.Value()
		}
		u := used[name]
		switch {
		case value(req) > value(capacity):
			return corev1.PodReasonInfeasible, fmt.Sprintf("Node didn't have enough capacity: %s, requested: %d, capacity: %d",
				name, value(req), value(capacity))
		case value(req)+value(u) > value(capacity):
			return corev1.PodReasonDeferred, fmt.Sprintf("Node didn't have enough resource: %s, requested: %d, used: %d, capacity: %d",
				name, value(req), value(u), value(capacity))
		}
	}
	return "", ""
}
