package kubelet

import (
	"context"
	"log/slog"
	"time"

	"k8s.io/apimachinery/pkg/types"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cairn-os/cairn/agent/kubelet/pods"
)

// The pod lifecycle event generator: it wakes a pod's goroutine when the
// runtime's view of the pod changes — a container started, exited, was
// removed; a sandbox stopped — so that a pod's status follows its
// containers without each pod polling the runtime. The CRI's container
// events stream (GetContainerEvents) tells at once; a relist every
// plegRelist compares the runtime's containers and sandboxes with the
// previous list and catches what the stream missed, e.g. while the
// runtime restarted.

// plegRelist is how often the runtime is listed whole.
const plegRelist = 5 * time.Second

// pleg watches the runtime for changes to pods. wake is called with the
// pod's UID and what told (wakeEvent or wakeRelist), from pleg's
// goroutines.
type pleg struct {
	rt   criv1.RuntimeServiceClient
	wake func(types.UID, wakeSource)
	log  *slog.Logger
	// relistEvery is how often the runtime is listed: 0 means
	// plegRelist, a negative duration never (tests that prove what the
	// events alone do).
	relistEvery time.Duration
	// last is the state of each container and sandbox (by ID) at the
	// previous relist, with its pod.
	last map[string]plegEntry
}

type plegEntry struct {
	uid   types.UID
	state int32
}

// run wakes pods until ctx ends.
func (p *pleg) run(ctx context.Context) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.watch(ctx)
	}()
	every := p.relistEvery
	if every == 0 {
		every = plegRelist
	}
	for every > 0 {
		p.relist(ctx)
		if !sleep(ctx, every) {
			break
		}
	}
	<-done
}

// watch follows the runtime's container events, again after the stream
// breaks.
func (p *pleg) watch(ctx context.Context) {
	b := newBackoff(time.Second, 30*time.Second)
	for {
		stream, err := p.rt.GetContainerEvents(ctx, &criv1.GetEventsRequest{})
		for err == nil {
			var ev *criv1.ContainerEventResponse
			ev, err = stream.Recv()
			if err != nil {
				break
			}
			b.Reset()
			if uid := eventPod(ev); uid != "" {
				p.wake(uid, wakeEvent)
			}
		}
		if ctx.Err() != nil {
			return
		}
		d := b.Next()
		p.log.Debug("CRI container events interrupted; the relist covers meanwhile", "err", err, "retry in", d)
		if !sleep(ctx, d) {
			return
		}
	}
}

// eventPod is the UID of the pod an event is about.
func eventPod(ev *criv1.ContainerEventResponse) types.UID {
	sb := ev.GetPodSandboxStatus()
	if uid := sb.GetMetadata().GetUid(); uid != "" {
		return types.UID(uid)
	}
	return types.UID(sb.GetLabels()[pods.LabelPodUID])
}

// relist lists the runtime's sandboxes and containers and wakes the pods
// whose sandboxes or containers appeared, changed state or went away.
func (p *pleg) relist(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	sandboxes, err := p.rt.ListPodSandbox(ctx, &criv1.ListPodSandboxRequest{})
	if err != nil {
		p.log.Debug("relist: list sandboxes", "err", err)
		return
	}
	containers, err := p.rt.ListContainers(ctx, &criv1.ListContainersRequest{})
	if err != nil {
		p.log.Debug("relist: list containers", "err", err)
		return
	}
	now := make(map[string]plegEntry, len(sandboxes.Items)+len(containers.Containers))
	for _, sb := range sandboxes.Items {
		now[sb.Id] = plegEntry{uid: types.UID(sb.GetMetadata().GetUid()), state: int32(sb.State)}
	}
	for _, c := range containers.Containers {
		now[c.Id] = plegEntry{uid: types.UID(c.Labels[pods.LabelPodUID]), state: int32(c.State)}
	}
	changed := map[types.UID]bool{}
	for id, e := range now {
		if old, ok := p.last[id]; !ok || old.state != e.state {
			changed[e.uid] = true
		}
	}
	for id, e := range p.last {
		if _, ok := now[id]; !ok {
			changed[e.uid] = true
		}
	}
	first := p.last == nil
	p.last = now
	if first {
		return // everything is new: the pods' goroutines sync anyway
	}
	for uid := range changed {
		if uid != "" {
			p.wake(uid, wakeRelist)
		}
	}
}
