package server

import (
	"context"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cairn-os/cairn/agent/kubelet/pods"
)

// targetsTTL is how long a list of the runtime's running containers and
// ready sandboxes serves the streams, as the kubelet's runtime cache does.
const targetsTTL = 2 * time.Second

// targets are what exec, attach, run and port-forward stream to: the
// running containers and ready sandboxes of the node's pods, as the
// runtime listed them at most targetsTTL ago. A stream then costs the
// runtime one call, not a list and a call; the handlers look afresh when
// the runtime refuses what the list named (it stopped since).
type targets struct {
	rt  criv1.RuntimeServiceClient
	now func() time.Time

	mu         sync.Mutex
	listedAt   time.Time
	containers map[containerKey]string
	sandboxes  map[types.UID]string
}

type containerKey struct {
	pod  types.UID
	name string
}

func newTargets(rt criv1.RuntimeServiceClient) *targets {
	return &targets{rt: rt, now: time.Now}
}

// container is the ID of the pod's running container of that name, or ""
// if the list has none.
func (t *targets) container(ctx context.Context, pod types.UID, name string) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.refresh(ctx)
	return t.containers[containerKey{pod, name}]
}

// sandbox is the ID of the pod's ready sandbox, or "".
func (t *targets) sandbox(ctx context.Context, pod types.UID) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.refresh(ctx)
	return t.sandboxes[pod]
}

// forget drops the list: the next lookup lists again.
func (t *targets) forget() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.listedAt = time.Time{}
}

// refresh lists the runtime again if the list is older than targetsTTL.
// A failed list leaves nothing cached: the handlers then ask the runtime
// themselves and answer its error.
func (t *targets) refresh(ctx context.Context) {
	now := t.now()
	if !t.listedAt.IsZero() && now.Sub(t.listedAt) < targetsTTL {
		return
	}
	t.listedAt, t.containers, t.sandboxes = time.Time{}, nil, nil
	cs, err := t.rt.ListContainers(ctx, &criv1.ListContainersRequest{Filter: &criv1.ContainerFilter{
		State: &criv1.ContainerStateValue{State: criv1.ContainerState_CONTAINER_RUNNING}}})
	if err != nil {
		return
	}
	sbs, err := t.rt.ListPodSandbox(ctx, &criv1.ListPodSandboxRequest{Filter: &criv1.PodSandboxFilter{
		State: &criv1.PodSandboxStateValue{State: criv1.PodSandboxState_SANDBOX_READY}}})
	if err != nil {
		return
	}
	t.containers = make(map[containerKey]string, len(cs.Containers))
	for _, c := range cs.Containers {
		t.containers[containerKey{types.UID(c.Labels[pods.LabelPodUID]), c.Labels[pods.LabelContainerName]}] = c.Id
	}
	t.sandboxes = make(map[types.UID]string, len(sbs.Items))
	for _, sb := range sbs.Items {
		t.sandboxes[types.UID(sb.GetMetadata().GetUid())] = sb.Id
	}
	t.listedAt = now
}
