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
// out from the exited containers the runtime keeps, so the worker survives
// its own restart; what it remembers is which containers it stopped for
// failing a probe (StopUnhealthy), which restart whatever their exit
// code, the failed image pulls that the pull backoff counts, and which
// backoffs it told as events. postStart hooks run as a container starts,
// preStop hooks before it is stopped.
//
// A container's environment comes from its spec and what that refers to
// through Refs (ConfigMaps, Secrets, the Node), with $(VAR) expanded in
// env, command and args; images are pulled with the pod's
// imagePullSecrets. A container that cannot start waits with the
// kubelet's reason and message (ErrImagePull, CreateContainerConfigError…,
// see reasons.go), and what happens is recorded as Events.
//
// Terminate stops the containers with a grace period and removes the
// sandbox and the volumes, while Observe tells, doing nothing, what the
// runtime holds meanwhile; Cleanup removes, now and then, what pods the
// node no longer has left behind: sandboxes, volumes, logs.
//
//	w, err := pods.New(pods.Config{Runtime: rt, Images: img, LogRoot: "/var/log/pods"})
//	st, err := w.Sync(ctx, pod)
//
// Sidecars (init containers with restartPolicy Always, see sidecar.go)
// start in order with the other init containers, but the next one waits
// only for them to have started, not exited; they restart whatever the
// pod's restartPolicy, do not count for its phase, and stop after the app
// containers. Ephemeral containers (kubectl debug) run once as soon as the
// sandbox does, in their target container's process namespace if they
// name one. A container that must not run as root but would is refused
// (CreateContainerConfigError), as by the kubelet.
//
// A running container whose resources change in the spec (the resize
// subresource) is resized in place once Config.ResizeFits admits it,
// or restarted where its resizePolicy says RestartContainer
// (resize.go); the status tells each running container's resources.
//
// Exited containers are collected as the pod syncs: the latest
// keepExited of each of its containers are kept (the API's lastState and
// `kubectl logs --previous` need the latest, the restart backoff, read
// from them, the rest), the older ones removed with their logs.
package pods

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// ClusterDNS is the cluster's DNS service, for pods with dnsPolicy
// ClusterFirst.
type ClusterDNS struct {
	Servers []string // such as 10.96.0.10
	Domain  string   // such as cluster.local
}

// Config is what a Worker needs.
type Config struct {
	// Runtime and Images are the CRI runtime's services.
	Runtime criv1.RuntimeServiceClient
	Images  criv1.ImageServiceClient
	// LogRoot holds the pods' log directories, /var/log/pods on a node.
	LogRoot string
	// PodsDir, if set, holds a directory per pod, named by its UID, where
	// the worker writes the /etc/hosts of the pod's containers
	// (etchosts.go) and their termination message files
	// (termination.go); without it, they have the runtime's /etc/hosts
	// and no such file. The kubelet makes it the Volumes' root, whose
	// TearDown removes a pod's directory, the files with it.
	PodsDir string
	// ClusterDNS, if set, is the resolver of ClusterFirst pods.
	ClusterDNS *ClusterDNS
	// CgroupParent, if set, names the cgroup a pod's sandbox goes under;
	// otherwise the runtime decides.
	CgroupParent func(*corev1.Pod) string
	// RuntimeHandler is the CRI runtime handler (RuntimeClass); empty is
	// the runtime's default.
	RuntimeHandler string
	// Now is the clock of restart and image pull backoffs and of how long
	// Cleanup keeps orphaned logs; time.Now if nil.
	Now func() time.Time
	// Refs, if set, reads the ConfigMaps, Secrets and Node that
	// containers' env and pods' imagePullSecrets refer to; without it,
	// such references cannot be resolved.
	Refs Refs
	// Started, if set, says whether the running container containerID,
	// named name, of pod passed its startup probe (probe.Results): a
	// sidecar holds back the containers after it until then. Without
	// it, a running sidecar has started.
	Started func(pod *corev1.Pod, name, containerID string) bool
	// Events, if set, records what happens to the pods' containers as
	// the kubelet's Events (Pulling, Pulled, Created, Started, Failed,
	// BackOff, Killing).
	Events Events
	// Volumes, if set, keeps the volumes that containers mount; without
	// it, a container that mounts one cannot start.
	Volumes Volumes
	// ResizeFits, if set, admits the resize of a running pod (its
	// containers' resources changed in the spec): it returns "", "" if
	// the node can apply it, else the reason (corev1.PodReasonInfeasible
	// or PodReasonDeferred) and message of the pod's PodResizePending
	// condition. Without it, every resize is admitted.
	ResizeFits func(pod *corev1.Pod) (reason, message string)
	// Log receives what Sync and Cleanup only log; nil means
	// slog.Default().
	Log *slog.Logger
}

// Worker syncs pods against a CRI runtime. Its methods may be called
// from many goroutines, one at a time per pod.
type Worker struct {
	cfg Config

	// unhealthy holds the IDs of containers stopped for failing a probe
	// (StopUnhealthy), which restart whatever their exit code.
	unhealthy sync.Map
	// pulls holds the failed image pulls of pods (pullKey → pullFailure).
	pulls sync.Map
	// toldBackoff holds, by backoffKey, the ID of the exited container
	// whose restart backoff was last recorded as an event.
	toldBackoff sync.Map
	// resized holds, by container ID, the resources (resizedTo) the
	// worker last resized a running container to (resize.go).
	resized sync.Map
	// orphanLogs holds when Cleanup first found the logs of a pod to
	// remove.
	orphanLogsMu sync.Mutex
	orphanLogs   map[types.UID]time.Time
}

// New returns the Worker of cfg.
func New(cfg Config) (*Worker, error) {
	var errs []error
	if cfg.Runtime == nil || cfg.Images == nil {
		errs = append(errs, errors.New("no CRI runtime or image service"))
	}
	if cfg.LogRoot == "" {
		errs = append(errs, errors.New("no pod log directory"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("pod worker: %w", err)
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	return &Worker{cfg: cfg, orphanLogs: map[types.UID]time.Time{}}, nil
}

func (w *Worker) now() time.Time {
	if w.cfg.Now != nil {
		return w.cfg.Now()
	}
	return time.Now()
}

func (w *Worker) cgroupParent(pod *corev1.Pod) string {
	if w.cfg.CgroupParent == nil {
		return ""
	}
	return w.cfg.CgroupParent(pod)
}

// Sync takes the next steps to run pod, refreshes its volumes (tokens
// before they expire, ConfigMaps and Secrets that changed) and returns
// its status. An error says which step failed; the status is still as
// complete as it could be made, or nil if the runtime could not be read
// at all (containerd away): then nothing is known of the pod's
// containers, not even that they are gone. A pod that ended for good
// (Succeeded or Failed) in a sandbox that is no longer ready is not run
// again in a new one. A volume that cannot be refreshed is only logged:
// the containers keep what was written, and a later Sync retries.
func (w *Worker) Sync(ctx context.Context, pod *corev1.Pod) (*Status, error) {
	st, err := w.sync(ctx, pod)
	if st != nil && ctx.Err() == nil && w.cfg.Volumes != nil {
		rctx, cancel := context.WithTimeout(ctx, time.Minute)
		if rerr := w.cfg.Volumes.Refresh(rctx, pod); rerr != nil && ctx.Err() == nil {
			w.cfg.Log.Warn("refresh the pod's volumes", "pod", pod.Namespace+"/"+pod.Name, "uid", pod.UID, "err", rerr)
		}
		cancel()
	}
	return st, err
}

// sync takes the next steps to run pod and returns its status, as Sync.
func (w *Worker) sync(ctx context.Context, pod *corev1.Pod) (*Status, error) {
	sandboxes, err := w.sandboxes(ctx, pod)
	if err != nil {
		return nil, err
	}
	if st, err := w.ended(ctx, pod, sandboxes); st != nil || err != nil {
		return st, err
	}
	sandboxID, sandboxCfg, made, err := w.ensureSandbox(ctx, pod, sandboxes)
	if err != nil {
		return &Status{Phase: corev1.PodPending}, err
	}
	st := &Status{SandboxID: sandboxID}
	if st.PodIP, err = w.podIP(ctx, pod, sandboxID); err != nil {
		return nil, err
	}
	history := map[string][]*criv1.ContainerStatus{} // a sandbox just made has none
	if !made {
		if history, err = w.history(ctx, sandboxID); err != nil {
			return nil, fmt.Errorf("containers of pod %s/%s: %w", pod.Namespace, pod.Name, err)
		}
	}
	sb := sandbox{id: sandboxID, cfg: sandboxCfg, ip: st.PodIP, latest: map[string]string{}}
	for name, h := range history {
		sb.latest[name] = h[len(h)-1].Id
	}
	// In a sandbox that replaced one that died, containers go on from
	// the attempts of the earlier ones: the runtime keeps their names
	// (name, pod, attempt) until the pod is killed, and the restarts
	// count on.
	var first map[string]uint32
	if older := len(sandboxes) > 1 || made && len(sandboxes) > 0; older {
		if first, err = w.nextAttempts(ctx, pod); err != nil {
			return nil, err
		}
	}
	now := w.now()
	var errs []error
	step := func(c *corev1.Container, policy corev1.RestartPolicy) ContainerStatus {
		cs, err := w.syncContainer(ctx, pod, c, policy, history[c.Name], first[c.Name], sb, now)
		if err != nil {
			errs = append(errs, err)
		}
		return cs
	}

	appsEnded := appsEnded(pod, history, w.stoppedUnhealthy)
	begun := begunAfter(pod, history)
	initsDone := true
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		if !initsDone {
			cs := containerStatus(c.Name, nil)
			cs.Reason = ReasonPodInitializing
			st.InitContainers = append(st.InitContainers, cs)
			continue
		}
		if isSidecar(c) {
			var cs ContainerStatus
			if h := history[c.Name]; appsEnded {
				// The pod is done: its sidecars are stopped, not
				// started or restarted.
				cs = containerStatus(c.Name, nil)
				if len(h) > 0 {
					cs = containerStatus(c.Name, h[len(h)-1])
				}
			} else {
				cs = step(c, corev1.RestartPolicyAlways)
			}
			// Once a container after it began, the sidecar started
			// before: a restart of it holds nothing back.
			initsDone = begun[i] || w.sidecarStarted(pod, cs)
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
	// Ephemeral containers run once, as soon as the sandbox does, even
	// before the pod is initialized.
	for i := range pod.Spec.EphemeralContainers {
		c := (*corev1.Container)(&pod.Spec.EphemeralContainers[i].EphemeralContainerCommon)
		st.EphemeralContainers = append(st.EphemeralContainers, step(c, corev1.RestartPolicyNever))
	}
	latest := map[string]*criv1.ContainerStatus{}
	for name, h := range history {
		latest[name] = h[len(h)-1]
	}
	if err := w.resize(ctx, pod, st, latest, sb); err != nil {
		errs = append(errs, err)
	}
	if appsEnded {
		if err := w.stopSidecars(ctx, pod, st.InitContainers, sb.ip, GracePeriod(pod)); err != nil {
			errs = append(errs, err)
		}
	}
	if err := w.removeExited(ctx, history); err != nil {
		errs = append(errs, err)
	}
	st.capMessages()
	st.Phase = phase(pod, st.InitContainers, st.Containers)
	return st, errors.Join(errs...)
}

// ended returns the status of a pod that ended for good in its last
// sandbox, which is no longer ready (the pod worker stops the sandbox of
// a pod that ended): nothing runs again, in no new sandbox, as with the
// kubelet. It returns nil if the pod has a ready sandbox, none at all, or
// would run again in a new one (its restartPolicy restarts a container).
func (w *Worker) ended(ctx context.Context, pod *corev1.Pod, sandboxes []*criv1.PodSandbox) (*Status, error) {
	for _, sb := range sandboxes {
		if sb.State == criv1.PodSandboxState_SANDBOX_READY {
			return nil, nil
		}
	}
	st, err := w.observe(ctx, pod, sandboxes)
	if st == nil || err != nil || st.Phase != corev1.PodSucceeded && st.Phase != corev1.PodFailed {
		return nil, err
	}
	return st, nil
}

// Observe returns the status of pod as the runtime holds it, doing
// nothing towards its spec: what a pod being killed shows meanwhile. Nil
// if the pod has no sandbox.
func (w *Worker) Observe(ctx context.Context, pod *corev1.Pod) (*Status, error) {
	sandboxes, err := w.sandboxes(ctx, pod)
	if err != nil {
		return nil, err
	}
	return w.observe(ctx, pod, sandboxes)
}

// observe returns the status of pod in its ready sandbox among
// sandboxes, else in its last one; nil if it has none.
func (w *Worker) observe(ctx context.Context, pod *corev1.Pod, sandboxes []*criv1.PodSandbox) (*Status, error) {
	var last *criv1.PodSandbox
	for _, sb := range sandboxes {
		if last == nil || last.State != criv1.PodSandboxState_SANDBOX_READY &&
			(sb.State == criv1.PodSandboxState_SANDBOX_READY || sb.GetMetadata().GetAttempt() > last.GetMetadata().GetAttempt()) {
			last = sb
		}
	}
	if last == nil {
		return nil, nil
	}
	history, err := w.history(ctx, last.Id)
	if err != nil {
		return nil, fmt.Errorf("containers of pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	st := &Status{}
	if last.State == criv1.PodSandboxState_SANDBOX_READY {
		st.SandboxID = last.Id
		if st.PodIP, err = w.podIP(ctx, pod, last.Id); err != nil {
			return nil, err
		}
	}
	seen := func(c *corev1.Container, policy corev1.RestartPolicy) ContainerStatus {
		h := history[c.Name]
		if len(h) == 0 {
			return containerStatus(c.Name, nil)
		}
		cs := containerStatus(c.Name, h[len(h)-1])
		if cs.State == Terminated && policy != corev1.RestartPolicyNever && w.stoppedUnhealthy(cs.ID) {
			cs.State = Waiting // to restart, whatever its exit code
		}
		return cs
	}
	for i := range pod.Spec.InitContainers {
		st.InitContainers = append(st.InitContainers, seen(&pod.Spec.InitContainers[i], initRestartPolicy(pod.Spec.RestartPolicy)))
	}
	for i := range pod.Spec.Containers {
		st.Containers = append(st.Containers, seen(&pod.Spec.Containers[i], pod.Spec.RestartPolicy))
	}
	for i := range pod.Spec.EphemeralContainers {
		c := (*corev1.Container)(&pod.Spec.EphemeralContainers[i].EphemeralContainerCommon)
		st.EphemeralContainers = append(st.EphemeralContainers, seen(c, corev1.RestartPolicyNever))
	}
	st.capMessages()
	st.Phase = phase(pod, st.InitContainers, st.Containers)
	return st, nil
}

// ensureSandbox returns the pod's ready sandbox among its sandboxes,
// making one if there is none (again if an earlier one died, with the
// next attempt number); made says it did.
func (w *Worker) ensureSandbox(ctx context.Context, pod *corev1.Pod, sandboxes []*criv1.PodSandbox) (id string, cfg *criv1.PodSandboxConfig, made bool, err error) {
	var attempt uint32
	for _, sb := range sandboxes {
		if sb.State == criv1.PodSandboxState_SANDBOX_READY {
			return sb.Id, w.sandboxConfig(pod, sb.GetMetadata().GetAttempt()), false, nil
		}
		attempt = max(attempt, sb.GetMetadata().GetAttempt()+1)
	}
	cfg = w.sandboxConfig(pod, attempt)
	resp, err := w.cfg.Runtime.RunPodSandbox(ctx, &criv1.RunPodSandboxRequest{Config: cfg, RuntimeHandler: w.cfg.RuntimeHandler})
	if err != nil {
		return "", nil, false, fmt.Errorf("run sandbox of pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return resp.PodSandboxId, cfg, true, nil
}

// sandboxes lists the runtime's sandboxes of pod, by its UID.
func (w *Worker) sandboxes(ctx context.Context, pod *corev1.Pod) ([]*criv1.PodSandbox, error) {
	resp, err := w.cfg.Runtime.ListPodSandbox(ctx, &criv1.ListPodSandboxRequest{
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
	resp, err := w.cfg.Runtime.ListContainers(ctx, &criv1.ListContainersRequest{
		Filter: &criv1.ContainerFilter{PodSandboxId: sandboxID},
	})
	if err != nil {
		return nil, err
	}
	out := map[string][]*criv1.ContainerStatus{}
	for _, c := range resp.Containers {
		st, err := w.cfg.Runtime.ContainerStatus(ctx, &criv1.ContainerStatusRequest{ContainerId: c.Id})
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

// keepExited is how many exited containers of each of a pod's containers
// the node keeps. The latest is the API's lastState; six finished runs
// hold the whole restart backoff, which is read from them: 10 s doubled
// at each of five more exits reaches its 5 min cap.
const keepExited = 6

// removeExited removes, with their logs, the exited containers of each
// name in history (each name's oldest first) but its latest keepExited.
func (w *Worker) removeExited(ctx context.Context, history map[string][]*criv1.ContainerStatus) error {
	var errs []error
	for _, h := range history {
		var exited []*criv1.ContainerStatus
		for _, c := range h {
			if c.State == criv1.ContainerState_CONTAINER_EXITED {
				exited = append(exited, c)
			}
		}
		for _, c := range exited[:max(len(exited)-keepExited, 0)] {
			if _, err := w.cfg.Runtime.RemoveContainer(ctx, &criv1.RemoveContainerRequest{ContainerId: c.Id}); err != nil {
				errs = append(errs, fmt.Errorf("remove exited container %s: %w", c.Id, err))
				continue
			}
			if c.LogPath != "" {
				if err := os.Remove(c.LogPath); err != nil && !errors.Is(err, fs.ErrNotExist) {
					errs = append(errs, fmt.Errorf("remove the log of exited container %s: %w", c.Id, err))
				}
			}
		}
	}
	return errors.Join(errs...)
}

// nextAttempts returns, by container name, the attempt after the last of
// the pod's containers in any of its sandboxes.
func (w *Worker) nextAttempts(ctx context.Context, pod *corev1.Pod) (map[string]uint32, error) {
	resp, err := w.cfg.Runtime.ListContainers(ctx, &criv1.ListContainersRequest{
		Filter: &criv1.ContainerFilter{LabelSelector: map[string]string{LabelPodUID: string(pod.UID)}},
	})
	if err != nil {
		return nil, fmt.Errorf("containers of pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	next := map[string]uint32{}
	for _, c := range resp.Containers {
		name := c.GetMetadata().GetName()
		next[name] = max(next[name], c.GetMetadata().GetAttempt()+1)
	}
	return next, nil
}

// sandbox is the pod's ready sandbox, as its containers are made in it.
type sandbox struct {
	id  string
	cfg *criv1.PodSandboxConfig
	ip  string // empty on the host network
	// latest holds, by name, the runtime's ID of the latest container
	// of each of the pod's containers that the sandbox had when the sync
	// began: the targets of ephemeral containers.
	latest map[string]string
}

// syncContainer takes the next step for one container, whose CRI
// containers in the sandbox so far are history: it starts it, as the
// first-th attempt, if it has none, or if the latest exited and policy
// restarts it once its backoff has passed.
func (w *Worker) syncContainer(ctx context.Context, pod *corev1.Pod, c *corev1.Container, policy corev1.RestartPolicy,
	history []*criv1.ContainerStatus, first uint32, sb sandbox, now time.Time) (ContainerStatus, error) {
	if len(history) == 0 {
		return w.startContainer(ctx, pod, c, first, sb)
	}
	latest := history[len(history)-1]
	cs := containerStatus(c.Name, latest)
	switch latest.State {
	case criv1.ContainerState_CONTAINER_CREATED: // made, but its start failed
		return w.run(ctx, pod, c, latest.Id, sb, cs)
	case criv1.ContainerState_CONTAINER_EXITED:
		unhealthy := policy != corev1.RestartPolicyNever && w.stoppedUnhealthy(latest.Id)
		if !unhealthy && !Restarts(policy, latest.ExitCode) {
			return cs, nil
		}
		var runs []Run
		for _, h := range history {
			runs = append(runs, Run{StartedAt: unixNano(h.StartedAt), FinishedAt: unixNano(h.FinishedAt)})
		}
		if next := NextStart(runs); now.Before(next) {
			cs.State, cs.Reason, cs.BackoffUntil = Waiting, ReasonCrashLoopBackOff, next
			cs.Message = fmt.Sprintf("back-off %v restarting failed container %s of pod %s/%s", RestartDelay(runs), c.Name, pod.Namespace, pod.Name)
			if told, _ := w.toldBackoff.Swap(backoffKey{pod.UID, c.Name}, latest.Id); told != latest.Id {
				w.Event(pod, c.Name, corev1.EventTypeWarning, "BackOff", "Back-off restarting failed container %s in pod %s/%s", c.Name, pod.Namespace, pod.Name)
			}
			return cs, nil
		}
		w.unhealthy.Delete(latest.Id)
		return w.startContainer(ctx, pod, c, latest.GetMetadata().GetAttempt()+1, sb)
	}
	return cs, nil
}

// startContainer pulls the image as its policy says, creates the
// attempt-th container of c and starts it. When a step fails, the
// container waits with the kubelet's reason and message; a pull backing
// off is no error, as it ends on its own.
func (w *Worker) startContainer(ctx context.Context, pod *corev1.Pod, c *corev1.Container, attempt uint32, sb sandbox) (ContainerStatus, error) {
	waiting := ContainerStatus{Name: c.Name, State: Waiting, Reason: ReasonContainerCreating, RestartCount: int32(attempt), Image: c.Image}
	image, retryAt, err := w.ensureImage(ctx, pod, c, sb.cfg)
	if err != nil {
		var we *waitError
		if errors.As(err, &we) {
			waiting.Reason, waiting.Message = we.reason.Error(), we.msg
		}
		if errors.Is(err, ErrImagePullBackOff) {
			waiting.BackoffUntil = retryAt
			return waiting, nil
		}
		w.Event(pod, c.Name, corev1.EventTypeWarning, "Failed", "Error: %s", waiting.Reason)
		return waiting, fmt.Errorf("%s: %w", containerName(pod, c), err)
	}
	if err := w.verifyNonRoot(ctx, pod, c, image); err != nil {
		return w.failed(pod, c, waiting, &waitError{ErrCreateContainerConfig, err.Error()})
	}
	env, err := w.containerEnv(ctx, pod, c, sb)
	if err != nil {
		return w.failed(pod, c, waiting, &waitError{ErrCreateContainerConfig, err.Error()})
	}
	mounts, devices, err := w.mounts(ctx, pod, c, sb.ip, env)
	if err != nil {
		return w.failed(pod, c, waiting, &waitError{ErrCreateContainerConfig, err.Error()})
	}
	if m, err := w.messageMount(pod, c, attempt); err != nil {
		return w.failed(pod, c, waiting, &waitError{ErrCreateContainerConfig, err.Error()})
	} else if m != nil {
		mounts = append(mounts, m)
	}
	params := containerParams{attempt: attempt, image: image, env: env, mounts: mounts, devices: devices}
	if target := ephemeralTarget(pod, c.Name); target != "" {
		if params.pidTarget = sb.latest[target]; params.pidTarget == "" {
			return w.failed(pod, c, waiting, &waitError{ErrCreateContainerConfig, fmt.Sprintf("target container %q has not been made", target)})
		}
	}
	created, err := w.cfg.Runtime.CreateContainer(ctx, &criv1.CreateContainerRequest{
		PodSandboxId:  sb.id,
		Config:        containerConfig(pod, c, params),
		SandboxConfig: sb.cfg,
	})
	if err != nil {
		return w.failed(pod, c, waiting, &waitError{ErrCreateContainer, criMessage(err)})
	}
	w.Event(pod, c.Name, corev1.EventTypeNormal, "Created", "Created container: %s", c.Name)
	return w.run(ctx, pod, c, created.ContainerId, sb, waiting)
}

// run starts the created container id of c; if the runtime cannot, c
// waits, as waiting but with RunContainerError.
func (w *Worker) run(ctx context.Context, pod *corev1.Pod, c *corev1.Container, id string, sb sandbox, waiting ContainerStatus) (ContainerStatus, error) {
	if _, err := w.cfg.Runtime.StartContainer(ctx, &criv1.StartContainerRequest{ContainerId: id}); err != nil {
		// Not counted as made: the pod stays Pending until the
		// runtime's exited container shows on the next sync.
		waiting.ID, waiting.StartedAt, waiting.FinishedAt = "", time.Time{}, time.Time{}
		return w.failed(pod, c, waiting, &waitError{ErrRunContainer, criMessage(err)})
	}
	w.Event(pod, c.Name, corev1.EventTypeNormal, "Started", "Started container %s", c.Name)
	return w.started(ctx, pod, c, id, sb)
}

// failed records why c cannot start as an event and returns its waiting
// status and the error for Sync.
func (w *Worker) failed(pod *corev1.Pod, c *corev1.Container, waiting ContainerStatus, err *waitError) (ContainerStatus, error) {
	waiting.State, waiting.Reason, waiting.Message = Waiting, err.reason.Error(), err.msg
	w.Event(pod, c.Name, corev1.EventTypeWarning, "Failed", "Error: %s", err.msg)
	return waiting, fmt.Errorf("%s: %w", containerName(pod, c), err)
}

// started runs the postStart hook of the container id that just started
// and returns its status.
func (w *Worker) started(ctx context.Context, pod *corev1.Pod, c *corev1.Container, id string, sb sandbox) (ContainerStatus, error) {
	if err := w.postStart(ctx, pod, c, id, sb.ip); err != nil {
		cs, _ := w.status(ctx, c.Name, id)
		if cs.State != Running {
			cs.Reason = ReasonPostStartHookError
		}
		return cs, err
	}
	return w.status(ctx, c.Name, id)
}

func (w *Worker) status(ctx context.Context, name, id string) (ContainerStatus, error) {
	resp, err := w.cfg.Runtime.ContainerStatus(ctx, &criv1.ContainerStatusRequest{ContainerId: id})
	if err != nil {
		return ContainerStatus{Name: name, ID: id, State: Waiting}, fmt.Errorf("status of container %s: %w", id, err)
	}
	return containerStatus(name, resp.Status), nil
}

// Terminate stops every container of pod, running preStop hooks and
// giving each grace to exit after SIGTERM before SIGKILL; once they have
// stopped it removes the pod's volumes, as the kubelet unmounts them
// then, before the network goes; then it stops and removes the pod's
// sandboxes, which removes the containers, their logs' handles and the
// pod's network, and last its termination message files. If a container
// would not stop, its volumes are removed only once its sandbox is: the
// runtime removes a sandbox's containers with it, forcibly.
func (w *Worker) Terminate(ctx context.Context, pod *corev1.Pod, grace time.Duration) error {
	sandboxes, err := w.sandboxes(ctx, pod)
	if err != nil {
		return fmt.Errorf("kill: %w", err)
	}
	w.forget(pod)
	w.forgetResized(pod)
	var errs []error
	for _, sb := range sandboxes {
		errs = append(errs, w.stopContainers(ctx, pod, sb, grace))
	}
	stopped := errors.Join(errs...) == nil
	var errVolumes error
	if stopped {
		errVolumes = w.tearDownVolumes(pod)
	}
	for _, sb := range sandboxes {
		if _, err := w.cfg.Runtime.StopPodSandbox(ctx, &criv1.StopPodSandboxRequest{PodSandboxId: sb.Id}); err != nil {
			errs = append(errs, fmt.Errorf("stop sandbox %s of pod %s/%s: %w", sb.Id, pod.Namespace, pod.Name, err))
		}
		if _, err := w.cfg.Runtime.RemovePodSandbox(ctx, &criv1.RemovePodSandboxRequest{PodSandboxId: sb.Id}); err != nil {
			errs = append(errs, fmt.Errorf("remove sandbox %s of pod %s/%s: %w", sb.Id, pod.Namespace, pod.Name, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("kill: %w", err)
	}
	if !stopped {
		errVolumes = w.tearDownVolumes(pod)
	}
	if errVolumes != nil {
		return errVolumes
	}
	return w.removePodFiles(pod.UID)
}

// tearDownVolumes removes pod's volumes, if the worker keeps volumes.
func (w *Worker) tearDownVolumes(pod *corev1.Pod) error {
	if w.cfg.Volumes == nil {
		return nil
	}
	return w.cfg.Volumes.TearDown(pod.UID)
}
