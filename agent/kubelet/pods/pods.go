// Package pods is the core of the kubelet's Pod sync worker: it makes a
// Pod's containers happen through a CRI runtime, and takes them away.
//
// Sync is level-triggered and never waits for a container: each call looks
// at what the runtime holds for the pod, takes the next steps towards the
// spec (the sandbox, the first init container not yet completed, or every
// app container that is missing or due for a restart) and returns the
// status it sees. Its caller calls it again when something changes or
// after a while; init containers thus run one after another, each to
// completion, before the app containers start. Restarts follow the pod's
// restartPolicy with the kubelet's CrashLoopBackOff (RestartDelay), worked
// out from the exited containers the runtime keeps, so the worker holds no
// state of its own and survives its own restart.
//
// Kill stops the containers with a grace period and removes the sandbox.
//
//	w := &pods.Worker{Runtime: rt, Images: img, LogRoot: "/var/log/pods"}
//	st, err := w.Sync(ctx, pod)
//
// Not yet here: volumes, env from references and $(VAR) expansion,
// probes, lifecycle hooks, sidecar (restartable) init containers, garbage
// collection of exited containers (they are kept until Kill, as the
// backoff's history).
package pods

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Errors a container's image can fail with; wrapped with details.
var (
	ErrImagePull      = errors.New("ErrImagePull")
	ErrImageNeverPull = errors.New("ErrImageNeverPull")
)

// ClusterDNS is the cluster's DNS service, for pods with dnsPolicy
// ClusterFirst.
type ClusterDNS struct {
	Servers []string // such as 10.96.0.10
	Domain  string   // such as cluster.local
}

// Worker syncs pods against a CRI runtime. Its fields are set before the
// first call and not changed after; its methods may be called from many
// goroutines, one at a time per pod.
type Worker struct {
	Runtime criv1.RuntimeServiceClient
	Images  criv1.ImageServiceClient
	// LogRoot holds the pods' log directories, /var/log/pods on a node.
	LogRoot string
	// ClusterDNS, if set, is the resolver of ClusterFirst pods.
	ClusterDNS *ClusterDNS
	// CgroupParent, if set, names the cgroup a pod's sandbox goes under;
	// otherwise the runtime decides.
	CgroupParent func(*corev1.Pod) string
	// RuntimeHandler is the CRI runtime handler (RuntimeClass); empty is
	// the runtime's default.
	RuntimeHandler string
	// Now is the clock of restart backoffs; time.Now if nil.
	Now func() time.Time
}

func (w *Worker) now() time.Time {
	if w.Now != nil {
		return w.Now()
	}
	return time.Now()
}

func (w *Worker) cgroupParent(pod *corev1.Pod) string {
	if w.CgroupParent == nil {
		return ""
	}
	return w.CgroupParent(pod)
}

// Sync takes the next steps to run pod and returns its status. An error
// says which step failed; the status is still as complete as it could be
// made.
func (w *Worker) Sync(ctx context.Context, pod *corev1.Pod) (*Status, error) {
	sandboxID, sandboxCfg, err := w.ensureSandbox(ctx, pod)
	if err != nil {
		return &Status{Phase: corev1.PodPending}, err
	}
	st := &Status{SandboxID: sandboxID}
	if !pod.Spec.HostNetwork {
		ss, err := w.Runtime.PodSandboxStatus(ctx, &criv1.PodSandboxStatusRequest{PodSandboxId: sandboxID})
		if err != nil {
			return st, fmt.Errorf("status of sandbox %s of pod %s/%s: %w", sandboxID, pod.Namespace, pod.Name, err)
		}
		st.PodIP = ss.GetStatus().GetNetwork().GetIp()
	}
	history, err := w.history(ctx, sandboxID)
	if err != nil {
		return st, fmt.Errorf("containers of pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	now := w.now()
	var errs []error
	step := func(c *corev1.Container, policy corev1.RestartPolicy) ContainerStatus {
		cs, err := w.syncContainer(ctx, pod, c, policy, history[c.Name], sandboxID, sandboxCfg, now)
		if err != nil {
			errs = append(errs, err)
		}
		return cs
	}

	initsDone := true
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		if !initsDone {
			cs := containerStatus(c.Name, nil)
			cs.Reason = ReasonPodInitializing
			st.InitContainers = append(st.InitContainers, cs)
			continue
		}
		cs := step(c, initRestartPolicy(pod.Spec.RestartPolicy))
		st.InitContainers = append(st.InitContainers, cs)
		initsDone = cs.State == Terminated && cs.ExitCode == 0
	}
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		if !initsDone {
			cs := containerStatus(c.Name, nil)
			cs.Reason = ReasonPodInitializing
			st.Containers = append(st.Containers, cs)
			continue
		}
		st.Containers = append(st.Containers, step(c, pod.Spec.RestartPolicy))
	}
	st.Phase = phase(pod, st.InitContainers, st.Containers)
	return st, errors.Join(errs...)
}

// ensureSandbox returns the pod's ready sandbox, making one if there is
// none (again if an earlier one died, with the next attempt number).
func (w *Worker) ensureSandbox(ctx context.Context, pod *corev1.Pod) (string, *criv1.PodSandboxConfig, error) {
	sandboxes, err := w.sandboxes(ctx, pod)
	if err != nil {
		return "", nil, err
	}
	var attempt uint32
	for _, sb := range sandboxes {
		if sb.State == criv1.PodSandboxState_SANDBOX_READY {
			return sb.Id, w.sandboxConfig(pod, sb.GetMetadata().GetAttempt()), nil
		}
		attempt = max(attempt, sb.GetMetadata().GetAttempt()+1)
	}
	cfg := w.sandboxConfig(pod, attempt)
	resp, err := w.Runtime.RunPodSandbox(ctx, &criv1.RunPodSandboxRequest{Config: cfg, RuntimeHandler: w.RuntimeHandler})
	if err != nil {
		return "", nil, fmt.Errorf("run sandbox of pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return resp.PodSandboxId, cfg, nil
}

// sandboxes lists the runtime's sandboxes of pod, by its UID.
func (w *Worker) sandboxes(ctx context.Context, pod *corev1.Pod) ([]*criv1.PodSandbox, error) {
	resp, err := w.Runtime.ListPodSandbox(ctx, &criv1.ListPodSandboxRequest{
		Filter: &criv1.PodSandboxFilter{LabelSelector: map[string]string{LabelPodUID: string(pod.UID)}},
	})
	if err != nil {
		return nil, fmt.Errorf("list sandboxes of pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return resp.Items, nil
}

// history returns the sandbox's containers by name, each name's oldest
// attempt first.
func (w *Worker) history(ctx context.Context, sandboxID string) (map[string][]*criv1.ContainerStatus, error) {
	resp, err := w.Runtime.ListContainers(ctx, &criv1.ListContainersRequest{
		Filter: &criv1.ContainerFilter{PodSandboxId: sandboxID},
	})
	if err != nil {
		return nil, err
	}
	out := map[string][]*criv1.ContainerStatus{}
	for _, c := range resp.Containers {
		st, err := w.Runtime.ContainerStatus(ctx, &criv1.ContainerStatusRequest{ContainerId: c.Id})
		if err != nil {
			return nil, fmt.Errorf("status of container %s: %w", c.Id, err)
		}
		name := c.GetMetadata().GetName()
		out[name] = append(out[name], st.Status)
	}
	for _, h := range out {
		sort.Slice(h, func(i, j int) bool { return h[i].GetMetadata().GetAttempt() < h[j].GetMetadata().GetAttempt() })
	}
	return out, nil
}

// syncContainer takes the next step for one container, whose CRI
// containers so far are history: it starts it if it has none, or if the
// latest exited and policy restarts it once its backoff has passed.
func (w *Worker) syncContainer(ctx context.Context, pod *corev1.Pod, c *corev1.Container, policy corev1.RestartPolicy,
	history []*criv1.ContainerStatus, sandboxID string, sandboxCfg *criv1.PodSandboxConfig, now time.Time) (ContainerStatus, error) {
	if len(history) == 0 {
		return w.startContainer(ctx, pod, c, 0, sandboxID, sandboxCfg)
	}
	latest := history[len(history)-1]
	cs := containerStatus(c.Name, latest)
	switch latest.State {
	case criv1.ContainerState_CONTAINER_CREATED: // made, but its start failed
		if _, err := w.Runtime.StartContainer(ctx, &criv1.StartContainerRequest{ContainerId: latest.Id}); err != nil {
			return cs, fmt.Errorf("start %s: %w", containerName(pod, c), err)
		}
		return w.status(ctx, c.Name, latest.Id)
	case criv1.ContainerState_CONTAINER_EXITED:
		if !Restarts(policy, latest.ExitCode) {
			return cs, nil
		}
		var runs []Run
		for _, h := range history {
			runs = append(runs, Run{StartedAt: unixNano(h.StartedAt), FinishedAt: unixNano(h.FinishedAt)})
		}
		if now.Before(NextStart(runs)) {
			cs.State, cs.Reason = Waiting, ReasonCrashLoopBackOff
			return cs, nil
		}
		return w.startContainer(ctx, pod, c, latest.GetMetadata().GetAttempt()+1, sandboxID, sandboxCfg)
	}
	return cs, nil
}

// startContainer pulls the image as its policy says, creates the
// attempt-th container of c and starts it.
func (w *Worker) startContainer(ctx context.Context, pod *corev1.Pod, c *corev1.Container, attempt uint32, sandboxID string, sandboxCfg *criv1.PodSandboxConfig) (ContainerStatus, error) {
	waiting := ContainerStatus{Name: c.Name, State: Waiting, Reason: ReasonContainerCreating, RestartCount: int32(attempt), Image: c.Image}
	image, err := w.ensureImage(ctx, pod, c, sandboxCfg)
	if err != nil {
		for _, reason := range []error{ErrImageNeverPull, ErrImagePull} {
			if errors.Is(err, reason) {
				waiting.Reason = reason.Error()
			}
		}
		return waiting, err
	}
	created, err := w.Runtime.CreateContainer(ctx, &criv1.CreateContainerRequest{
		PodSandboxId:  sandboxID,
		Config:        containerConfig(pod, c, attempt, image),
		SandboxConfig: sandboxCfg,
	})
	if err != nil {
		waiting.Reason = "CreateContainerError"
		return waiting, fmt.Errorf("create %s: %w", containerName(pod, c), err)
	}
	if _, err := w.Runtime.StartContainer(ctx, &criv1.StartContainerRequest{ContainerId: created.ContainerId}); err != nil {
		cs, _ := w.status(ctx, c.Name, created.ContainerId)
		return cs, fmt.Errorf("start %s: %w", containerName(pod, c), err)
	}
	return w.status(ctx, c.Name, created.ContainerId)
}

func (w *Worker) status(ctx context.Context, name, id string) (ContainerStatus, error) {
	resp, err := w.Runtime.ContainerStatus(ctx, &criv1.ContainerStatusRequest{ContainerId: id})
	if err != nil {
		return ContainerStatus{Name: name, ID: id, State: Waiting}, fmt.Errorf("status of container %s: %w", id, err)
	}
	return containerStatus(name, resp.Status), nil
}

// Kill stops every container of pod, giving each grace to exit after
// SIGTERM before SIGKILL, then stops and removes its sandboxes, which
// removes the containers, their logs' handles and the pod's network.
func (w *Worker) Kill(ctx context.Context, pod *corev1.Pod, grace time.Duration) error {
	sandboxes, err := w.sandboxes(ctx, pod)
	if err != nil {
		return err
	}
	var errs []error
	for _, sb := range sandboxes {
		resp, err := w.Runtime.ListContainers(ctx, &criv1.ListContainersRequest{
			Filter: &criv1.ContainerFilter{PodSandboxId: sb.Id},
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("list containers of sandbox %s: %w", sb.Id, err))
			continue
		}
		// All at once, as the kubelet does: the grace period is the
		// pod's, not each container's.
		var wg sync.WaitGroup
		var mu sync.Mutex
		for _, c := range resp.Containers {
			if c.State != criv1.ContainerState_CONTAINER_RUNNING {
				continue
			}
			wg.Go(func() {
				_, err := w.Runtime.StopContainer(ctx, &criv1.StopContainerRequest{ContainerId: c.Id, Timeout: int64(grace.Seconds())})
				if err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("stop container %s of pod %s/%s: %w", c.GetMetadata().GetName(), pod.Namespace, pod.Name, err))
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		if _, err := w.Runtime.StopPodSandbox(ctx, &criv1.StopPodSandboxRequest{PodSandboxId: sb.Id}); err != nil {
			errs = append(errs, fmt.Errorf("stop sandbox %s of pod %s/%s: %w", sb.Id, pod.Namespace, pod.Name, err))
			continue
		}
		if _, err := w.Runtime.RemovePodSandbox(ctx, &criv1.RemovePodSandboxRequest{PodSandboxId: sb.Id}); err != nil {
			errs = append(errs, fmt.Errorf("remove sandbox %s of pod %s/%s: %w", sb.Id, pod.Namespace, pod.Name, err))
		}
	}
	return errors.Join(errs...)
}
