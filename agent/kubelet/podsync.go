package kubelet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cairn-os/cairn/agent/kubelet/logrotate"
	"github.com/cairn-os/cairn/agent/kubelet/pods"
	"github.com/cairn-os/cairn/agent/kubelet/probe"
)

// The pod sync loop. The node watches the Pods bound to it (the Node
// authorizer lets a node list and watch Pods only by the field selector
// spec.nodeName=NODE) and runs one goroutine per pod UID. That goroutine
// calls the worker's Sync when the pod changes and every PodResync, later
// after errors (backoff), and patches the Pod's status when what it sees
// differs from what the API holds. A pod whose deletion was asked for
// (deletionTimestamp) is killed with its grace period and then deleted
// with grace 0, which takes the object away; a pod whose object went
// away without that is killed at once. A pod in a terminal phase is not
// synced again: its containers would otherwise be started anew should its
// sandbox be gone.

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
	wakeRetry    wakeSource = "retry"    // the error back-off after a failed sync ended
)

// housekeepingInterval is how often the runtime's sandboxes of pods the
// node no longer has are removed.
const housekeepingInterval = 30 * time.Second

// podSyncer runs the node's pods.
type podSyncer struct {
	k      *kubelet
	node   *corev1.Node
	store  cache.Store
	scheme string // of container IDs: "containerd"
	probes *probe.Manager

	mu      sync.Mutex
	workers map[types.UID]*podWorker
	// killed are the pods whose goroutine killed them and deleted their
	// object, until the watch tells the object is gone.
	killed map[types.UID]bool
	// orphanLogs holds when housekeeping first found the logs of a pod
	// the node no longer has (its goroutine only).
	orphanLogs map[types.UID]time.Time
	wg         sync.WaitGroup
}

// podWorker is the goroutine of one pod.
type podWorker struct {
	uid    types.UID
	seen   time.Time // when the node first saw the pod
	mu     sync.Mutex
	pod    *corev1.Pod // latest seen
	gone   bool        // the object was removed from the API
	wake   chan struct{}
	cancel context.CancelFunc
	// syncing cancels the Sync in flight, if any: a pod being deleted
	// need not wait for an image pull.
	syncing context.CancelFunc
	// dirty holds what said, since the last sync, that the runtime's
	// containers or a probe's result changed, or that a status write met
	// a newer Pod: sync without waiting.
	dirty []wakeSource
}

func (k *kubelet) syncPods(ctx context.Context, node *corev1.Node) {
	s := &podSyncer{k: k, node: node, workers: map[types.UID]*podWorker{}, killed: map[types.UID]bool{}, orphanLogs: map[types.UID]time.Time{}, scheme: "containerd"}
	s.probes = &probe.Manager{Runtime: k.cfg.Pods.Runtime, Stop: k.cfg.Pods.StopUnhealthy, Event: k.cfg.Pods.Event, Log: k.log,
		Changed: func(uid types.UID) { s.changed(uid, wakeProbe) }}
	if v, err := k.cfg.RuntimeInfo.RuntimeVersion(ctx); err == nil {
		if i := indexScheme(v); i > 0 {
			s.scheme = v[:i]
		}
	}
	inf := k.member.Informers.Core().V1().Pods().Informer()
	s.store = inf.GetStore()
	reg, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { s.seen(ctx, obj) },
		UpdateFunc: func(_, obj any) { s.seen(ctx, obj) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if pod, ok := obj.(*corev1.Pod); ok {
				s.removed(ctx, pod)
			}
		},
	})
	if err != nil {
		k.log.Error("pod sync loop not started", "err", err)
		return
	}
	defer func() { _ = inf.RemoveEventHandler(reg) }()
	k.log.Info("pod sync loop started")
	if cache.WaitForCacheSync(ctx.Done(), reg.HasSynced) {
		s.wg.Go(func() { s.housekeeping(ctx) })
		p := &pleg{rt: k.cfg.Pods.Runtime, wake: s.changed, log: k.log, relistEvery: k.cfg.plegRelist}
		s.wg.Go(func() { p.run(ctx) })
		rotator := &logrotate.Rotator{Runtime: k.cfg.Pods.Runtime, Log: k.log}
		s.wg.Go(func() { rotator.Run(ctx) })
	}
	<-ctx.Done()
	s.wg.Wait()
	s.probes.RemoveAll()
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
	if !slices.Contains(w.dirty, source) {
		w.dirty = append(w.dirty, source)
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
	s.mu.Lock()
	defer s.mu.Unlock()
	w := s.workers[pod.UID]
	if w == nil {
		if ctx.Err() != nil {
			return
		}
		wctx, cancel := context.WithCancel(ctx)
		w = &podWorker{uid: pod.UID, seen: time.Now(), wake: make(chan struct{}, 1), cancel: cancel}
		s.workers[pod.UID] = w
		s.wg.Go(func() {
			defer cancel()
			killed := s.runWorker(wctx, w)
			s.mu.Lock()
			if s.workers[w.uid] == w {
				delete(s.workers, w.uid)
			}
			if killed {
				s.killed[w.uid] = true
			}
			s.mu.Unlock()
		})
	}
	w.mu.Lock()
	w.pod = pod
	if pod.DeletionTimestamp != nil && w.syncing != nil {
		w.syncing()
	}
	w.mu.Unlock()
	w.poke()
}

// removed tells a pod's goroutine that the object is gone; if none runs,
// one is started to make sure the pod's containers are gone too.
func (s *podSyncer) removed(ctx context.Context, pod *corev1.Pod) {
	s.mu.Lock()
	killed := s.killed[pod.UID] && s.workers[pod.UID] == nil
	delete(s.killed, pod.UID)
	s.mu.Unlock()
	if killed {
		return
	}
	s.seen(ctx, pod)
	s.mu.Lock()
	w := s.workers[pod.UID]
	s.mu.Unlock()
	if w == nil {
		return
	}
	w.mu.Lock()
	w.gone = true
	if w.syncing != nil {
		w.syncing()
	}
	w.mu.Unlock()
	w.poke()
}

func (w *podWorker) poke() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

func (w *podWorker) latest() (pod *corev1.Pod, gone bool, dirty []wakeSource) {
	w.mu.Lock()
	defer w.mu.Unlock()
	dirty, w.dirty = w.dirty, nil
	return w.pod, w.gone, dirty
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

// newerOrSame compares resource versions, which the API server makes
// from etcd's revisions: decimal numbers.
func newerOrSame(a, b string) bool {
	if len(a) != len(b) {
		return len(a) > len(b)
	}
	return a >= b
}

// runWorker syncs one pod until it is gone or ctx ends; killed says it
// killed the pod and deleted its object.
func (s *podSyncer) runWorker(ctx context.Context, w *podWorker) (killed bool) {
	defer s.probes.Remove(w.uid)
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
			return false
		case <-w.wake:
		case <-timer.C:
		}
		pod, gone, dirty := w.latest()
		if pod == nil {
			continue
		}
		log := log.With("pod", pod.Namespace+"/"+pod.Name, "uid", pod.UID)
		// A wake by an update that changed only the status (our own
		// writes) waits for the timer, which keeps the error backoff.
		deleting := gone || pod.DeletionTimestamp != nil
		podChanged := synced == nil || deleting || pod.Generation != synced.Generation
		if !podChanged && len(dirty) == 0 && time.Now().Before(next) {
			continue
		}
		// Counted by each source that asked for this sync; the timer's
		// only when nothing else did.
		for _, source := range dirty {
			s.k.metrics.woke(source)
		}
		switch {
		case podChanged:
			s.k.metrics.woke(wakePod)
		case len(dirty) == 0:
			s.k.metrics.woke(due)
		}
		var err error
		var retryAt time.Time
		if deleting {
			var done bool
			s.probes.Remove(pod.UID)
			done, err = s.terminate(ctx, w, pod, gone, log)
			if done {
				return !gone
			}
		} else {
			retryAt, err = s.syncOnce(ctx, w, pod, log)
		}
		synced = pod
		d := s.k.cfg.PodResync
		due = wakeResync
		if !retryAt.IsZero() && time.Until(retryAt) < d {
			d, due = max(time.Until(retryAt), 0), wakeBackoff
		}
		if err != nil {
			if ctx.Err() != nil {
				return false
			}
			if b := errBackoff.Next(); b > d {
				d, due = b, wakeRetry
			}
			log.Warn("pod sync failed", "err", err, "retry in", d)
		} else {
			errBackoff.Reset()
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

// syncOnce takes the next steps for a running pod and reports its status;
// retryAt, if not zero, is when a backoff ends.
func (s *podSyncer) syncOnce(ctx context.Context, w *podWorker, pod *corev1.Pod, log *slog.Logger) (retryAt time.Time, err error) {
	if terminal(pod.Status.Phase) {
		return time.Time{}, nil // ended for good: nothing runs again
	}
	sctx, cancel := context.WithTimeout(ctx, 5*time.Minute) // image pulls take long
	w.mu.Lock()
	w.syncing = cancel
	w.mu.Unlock()
	st, syncErr := s.k.cfg.Pods.Sync(sctx, pod)
	w.mu.Lock()
	w.syncing = nil
	w.mu.Unlock()
	canceled := sctx.Err() == context.Canceled
	cancel()
	if ctx.Err() != nil {
		return time.Time{}, ctx.Err()
	}
	if canceled {
		w.poke() // deleted meanwhile: terminate next
		return time.Time{}, nil
	}
	if st == nil {
		// The runtime could not be read: the API keeps the last status,
		// and the probes go on until the runtime answers again.
		return time.Time{}, syncErr
	}
	s.refreshVolumes(ctx, pod, log)
	status := s.podStatus(pod, st, metav1.Now())
	var running []probe.Running
	if !terminal(status.Phase) {
		for _, c := range st.Containers {
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
			return st.RetryAt(), errors.Join(syncErr, fmt.Errorf("stop sandbox of ended pod: %w", err))
		}
	}
	written, err := s.writeStatus(ctx, w, pod, status)
	if err != nil {
		return st.RetryAt(), errors.Join(syncErr, err)
	}
	if written && status.Phase != pod.Status.Phase {
		log.Info("pod phase", "phase", status.Phase)
		if status.Phase == corev1.PodRunning && pod.Status.Phase == corev1.PodPending {
			s.k.metrics.podStarted(w.seen)
		}
	}
	return st.RetryAt(), syncErr
}

// terminate kills a pod whose deletion was asked for and then deletes its
// object; done says the goroutine has nothing more to do.
func (s *podSyncer) terminate(ctx context.Context, w *podWorker, pod *corev1.Pod, gone bool, log *slog.Logger) (done bool, err error) {
	grace := pods.GracePeriod(pod)
	if gone {
		grace = 0
	}
	kctx, cancel := context.WithTimeout(ctx, grace+time.Minute)
	err = s.k.cfg.Pods.Kill(kctx, pod, grace)
	cancel()
	if err != nil {
		return false, fmt.Errorf("kill: %w", err)
	}
	if err := s.tearDownVolumes(pod.UID); err != nil {
		return false, err
	}
	if gone {
		log.Info("pod gone, its containers removed")
		return true, nil
	}
	dctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	uid := pod.UID
	err = s.k.client.CoreV1().Pods(pod.Namespace).Delete(dctx, pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: new(int64),
		Preconditions:      &metav1.Preconditions{UID: &uid},
	})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return false, fmt.Errorf("delete the Pod object: %w", err)
	}
	log.Info("pod killed and deleted", "grace", grace)
	return true, nil
}

// housekeeping removes, now and then, the runtime's sandboxes, the
// volumes and (a minute later) the container logs of pods the node no
// longer has: deleted, or deleted while the agent was not running.
func (s *podSyncer) housekeeping(ctx context.Context) {
	for {
		s.removeOrphans(ctx)
		if !sleep(ctx, housekeepingInterval) {
			return
		}
	}
}

func (s *podSyncer) removeOrphans(ctx context.Context) {
	rt := s.k.cfg.Pods.Runtime
	lctx, cancel := context.WithTimeout(ctx, requestTimeout)
	resp, err := rt.ListPodSandbox(lctx, &criv1.ListPodSandboxRequest{})
	cancel()
	if err != nil {
		s.k.log.Warn("housekeeping: list sandboxes", "err", err)
		return
	}
	known := map[types.UID]bool{}
	for _, obj := range s.store.List() {
		if pod, ok := obj.(*corev1.Pod); ok {
			known[pod.UID] = true
		}
	}
	for _, sb := range resp.Items {
		uid := types.UID(sb.Labels[pods.LabelPodUID])
		if uid == "" || s.keep(known, uid) {
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, time.Minute)
		_, err := rt.StopPodSandbox(rctx, &criv1.StopPodSandboxRequest{PodSandboxId: sb.Id})
		if err == nil {
			_, err = rt.RemovePodSandbox(rctx, &criv1.RemovePodSandboxRequest{PodSandboxId: sb.Id})
		}
		cancel()
		if err != nil {
			s.k.log.Warn("housekeeping: remove sandbox of a pod the node no longer has", "sandbox", sb.Id, "uid", uid, "err", err)
			known[uid] = true // its containers may still use its volumes
			continue
		}
		s.k.log.Info("housekeeping: removed sandbox of a pod the node no longer has", "sandbox", sb.Id, "uid", uid,
			"pod", sb.GetMetadata().GetNamespace()+"/"+sb.GetMetadata().GetName())
	}
	s.removeOrphanVolumes(known)
	s.removeOrphanLogs(known, time.Now())
}

// keep says whether what a pod left on the node is still wanted: the API
// still has the pod, or its goroutine still runs.
func (s *podSyncer) keep(known map[types.UID]bool, uid types.UID) bool {
	if known[uid] {
		return true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.workers[uid] != nil
}

func terminal(p corev1.PodPhase) bool {
	return p == corev1.PodSucceeded || p == corev1.PodFailed
}
