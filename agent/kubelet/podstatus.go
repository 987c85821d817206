package kubelet

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/cairn-os/cairn/agent/kubelet/pods"
)

// podStatus is the Pod status that st shows, on top of what the API holds
// (pod.Status): the fields the node owns are set, the others kept. Times
// are whole seconds, as the API stores them, so that an unchanged status
// compares equal.
func (s *podSyncer) podStatus(pod *corev1.Pod, st *pods.Status, now metav1.Time) corev1.PodStatus {
	now = metav1.NewTime(now.Truncate(time.Second))
	out := *pod.Status.DeepCopy()
	out.Phase = st.Phase
	// The spec this status comes from, as the kubelet tells since 1.34.
	out.ObservedGeneration = pod.Generation
	if out.StartTime == nil {
		out.StartTime = &now
	}
	out.HostIP, out.HostIPs = "", nil
	for _, ip := range pods.HostIPs(s.node()) {
		if out.HostIP == "" {
			out.HostIP = ip
		}
		out.HostIPs = append(out.HostIPs, corev1.HostIP{IP: ip})
	}
	switch {
	case pod.Spec.HostNetwork:
		out.PodIP = out.HostIP
		out.PodIPs = nil
		for _, h := range out.HostIPs {
			out.PodIPs = append(out.PodIPs, corev1.PodIP(h))
		}
	case st.PodIP != "":
		out.PodIP, out.PodIPs = st.PodIP, []corev1.PodIP{{IP: st.PodIP}}
	}

	prev := map[string]corev1.ContainerStatus{}
	for _, c := range slices.Concat(pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses, pod.Status.EphemeralContainerStatuses) {
		prev[c.Name] = c
	}
	// A sidecar is ready as an app container is, and counts for the
	// pod's readiness; it has initialized once it started, or once an
	// app container began (it may restart since).
	appBegun := slices.ContainsFunc(st.Containers, func(c pods.ContainerStatus) bool { return c.ID != "" })
	out.InitContainerStatuses = nil
	initialized, initPending := true, []string{}
	allReady, unready := true, []string{}
	for i, c := range st.InitContainers {
		spec := &pod.Spec.InitContainers[i]
		cs := s.containerStatus(c, prev[c.Name], spec)
		done := c.State == pods.Terminated && c.ExitCode == 0
		cs.Ready = done
		if sidecar := spec.RestartPolicy != nil && *spec.RestartPolicy == corev1.ContainerRestartPolicyAlways; sidecar {
			s.probed(pod, c, &cs)
			done = appBegun || cs.Started != nil && *cs.Started
			if !cs.Ready {
				allReady = false
				unready = append(unready, c.Name)
			}
		}
		if !done {
			initialized = false
			initPending = append(initPending, c.Name)
		}
		out.InitContainerStatuses = append(out.InitContainerStatuses, cs)
	}
	out.ContainerStatuses = nil
	for i, c := range st.Containers {
		cs := s.containerStatus(c, prev[c.Name], &pod.Spec.Containers[i])
		s.probed(pod, c, &cs)
		if !cs.Ready {
			allReady = false
			unready = append(unready, c.Name)
		}
		out.ContainerStatuses = append(out.ContainerStatuses, cs)
	}
	out.EphemeralContainerStatuses = nil
	for i, c := range st.EphemeralContainers {
		out.EphemeralContainerStatuses = append(out.EphemeralContainerStatuses,
			s.containerStatus(c, prev[c.Name], (*corev1.Container)(&pod.Spec.EphemeralContainers[i].EphemeralContainerCommon)))
	}

	conds := []corev1.PodCondition{
		{Type: corev1.PodReadyToStartContainers, Status: boolStatus(st.SandboxID != "" && (pod.Spec.HostNetwork || st.PodIP != "") && !terminal(st.Phase))},
		{Type: corev1.PodInitialized, Status: boolStatus(initialized)},
	}
	if !initialized {
		conds[1].Reason, conds[1].Message = "ContainersNotInitialized", fmt.Sprintf("containers with incomplete status: [%s]", strings.Join(initPending, " "))
	}
	ready := corev1.PodCondition{Type: corev1.ContainersReady, Status: boolStatus(allReady)}
	switch {
	case terminal(st.Phase):
		ready.Status, ready.Reason = corev1.ConditionFalse, "PodCompleted"
	case !allReady:
		ready.Reason, ready.Message = "ContainersNotReady", fmt.Sprintf("containers with unready status: [%s]", strings.Join(unready, " "))
	}
	podReady := ready
	podReady.Type = corev1.PodReady
	if ready.Status == corev1.ConditionTrue {
		if unmet := unmetGates(pod, out.Conditions); len(unmet) > 0 {
			podReady.Status, podReady.Reason, podReady.Message = corev1.ConditionFalse, "ReadinessGatesNotReady", strings.Join(unmet, ", ")
		}
	}
	conds = append(conds, ready, podReady)
	switch {
	case st.ResizePending != nil:
		conds = append(conds, corev1.PodCondition{Type: corev1.PodResizePending, Status: corev1.ConditionTrue,
			Reason: st.ResizePending.Reason, Message: st.ResizePending.Message})
	case st.ResizeError != "":
		conds = append(conds, corev1.PodCondition{Type: corev1.PodResizeInProgress, Status: corev1.ConditionTrue,
			Reason: corev1.PodReasonError, Message: st.ResizeError})
	}
	// A resize condition the node no longer holds goes.
	out.Conditions = slices.DeleteFunc(out.Conditions, func(c corev1.PodCondition) bool {
		resize := c.Type == corev1.PodResizePending || c.Type == corev1.PodResizeInProgress
		return resize && !slices.ContainsFunc(conds, func(n corev1.PodCondition) bool { return n.Type == c.Type })
	})
	for _, c := range conds {
		c.ObservedGeneration = pod.Generation
		setCondition(&out.Conditions, c, now)
	}
	return out
}

// unmetGates says, in the kubelet's words, which of pod's readiness gates
// the conditions that others set (through the status) do not hold True.
func unmetGates(pod *corev1.Pod, conds []corev1.PodCondition) []string {
	var unmet []string
	for _, g := range pod.Spec.ReadinessGates {
		i := slices.IndexFunc(conds, func(c corev1.PodCondition) bool { return c.Type == g.ConditionType })
		switch {
		case i < 0:
			unmet = append(unmet, fmt.Sprintf("corresponding condition of pod readiness gate %q does not exist.", g.ConditionType))
		case conds[i].Status != corev1.ConditionTrue:
			unmet = append(unmet, fmt.Sprintf("the status of pod readiness gate %q is not \"True\", but %v", g.ConditionType, conds[i].Status))
		}
	}
	return unmet
}

// probed sets whether the container c, an app container or a sidecar,
// is ready and started as its probes say.
func (s *podSyncer) probed(pod *corev1.Pod, c pods.ContainerStatus, cs *corev1.ContainerStatus) {
	cs.Ready = c.State == pods.Running && s.results.Ready(pod, c.Name, c.ID)
	if c.State == pods.Running {
		started := s.results.Started(pod, c.Name, c.ID)
		cs.Started = &started
	}
}

// terminateShowingReadiness terminates pod, as terminate, and meanwhile,
// while its object is there, writes its status whenever a readiness probe
// or the runtime's containers change: its containers' readiness, and its
// Ready condition, follow the probes and the containers stopping, as with
// the kubelet. The phase stays what the API holds until the pod is gone.
func (s *podSyncer) terminateShowingReadiness(ctx context.Context, w *podWorker, pod *corev1.Pod, objectGone bool, log *slog.Logger) error {
	if objectGone {
		return s.terminate(ctx, pod, objectGone, log)
	}
	done := make(chan error, 1)
	go func() { done <- s.terminate(ctx, pod, objectGone, log) }()
	woke := false
	for {
		select {
		case err := <-done:
			if err != nil && woke {
				// What changed meanwhile (containers stopped) is worth
				// another try at once, as if the kill had not waited.
				w.poke()
			}
			return err
		case <-w.wake:
			woke = true
		}
		latest, _, _, _ := w.latest()
		if err := s.writeTerminating(ctx, w, latest); err != nil && ctx.Err() == nil {
			log.Warn("write the status of a terminating pod", "err", err)
		}
	}
}

// writeTerminating writes the status of a pod being killed, as the
// runtime holds it while its sandbox is ready, with its phase kept.
func (s *podSyncer) writeTerminating(ctx context.Context, w *podWorker, pod *corev1.Pod) error {
	octx, cancel := context.WithTimeout(ctx, requestTimeout)
	st, err := s.worker.Observe(octx, pod)
	cancel()
	if st == nil || st.SandboxID == "" || err != nil {
		// Without a ready sandbox its containers are being removed: what
		// the runtime holds is no longer the whole pod.
		return err
	}
	st.Phase = pod.Status.Phase
	_, err = s.writeStatus(ctx, w, pod, s.podStatus(pod, st, metav1.Now()))
	return err
}

func boolStatus(b bool) corev1.ConditionStatus {
	if b {
		return corev1.ConditionTrue
	}
	return corev1.ConditionFalse
}

// setCondition sets c in cs, keeping the transition time of the
// condition there if its status stays. Other conditions, such as
// PodScheduled that the scheduler sets, stay as they are.
func setCondition(cs *[]corev1.PodCondition, c corev1.PodCondition, now metav1.Time) {
	c.LastTransitionTime = now
	for i := range *cs {
		p := &(*cs)[i]
		if p.Type != c.Type {
			continue
		}
		if p.Status == c.Status {
			c.LastTransitionTime = p.LastTransitionTime
		}
		c.LastProbeTime = p.LastProbeTime
		*p = c
		return
	}
	*cs = append(*cs, c)
}

// containerStatus is the API's status of one container, spec; prev is
// what the API held, whose state becomes lastState when a new container
// replaced the one it described. The requests the node admitted
// (allocatedResources) are those applied to a running container, else
// the spec's.
func (s *podSyncer) containerStatus(c pods.ContainerStatus, prev corev1.ContainerStatus, spec *corev1.Container) corev1.ContainerStatus {
	out := corev1.ContainerStatus{
		Name:                 c.Name,
		Image:                c.Image,
		ImageID:              c.ImageID,
		RestartCount:         c.RestartCount,
		LastTerminationState: prev.LastTerminationState,
		AllocatedResources:   spec.Resources.Requests,
	}
	if c.Resources != nil {
		out.Resources = c.Resources.DeepCopy()
		out.AllocatedResources = out.Resources.Requests
	}
	if out.Image == "" {
		out.Image = spec.Image
	}
	if c.ID != "" {
		out.ContainerID = s.scheme + "://" + c.ID
	}
	if prev.ContainerID != "" && prev.ContainerID != out.ContainerID {
		// A new container replaced the one prev described: that one's
		// end is the last termination (prev was Terminated, or waiting
		// for its restart with its end as lastState already).
		out.LastTerminationState = prev.LastTerminationState
		if prev.State.Terminated != nil {
			out.LastTerminationState = corev1.ContainerState{Terminated: prev.State.Terminated}
		}
	}
	secs := func(t time.Time) metav1.Time { return metav1.NewTime(t.Truncate(time.Second)) }
	if c.State == pods.Waiting && c.ID != "" && !c.FinishedAt.IsZero() {
		// Exited and waiting to be restarted (CrashLoopBackOff): the
		// run that ended is the last termination.
		reason := "Error"
		if c.ExitCode == 0 {
			reason = "Completed"
		}
		out.LastTerminationState = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
			ExitCode: c.ExitCode, Reason: reason,
			StartedAt: secs(c.StartedAt), FinishedAt: secs(c.FinishedAt), ContainerID: out.ContainerID,
		}}
	}
	switch c.State {
	case pods.Running:
		out.State.Running = &corev1.ContainerStateRunning{StartedAt: secs(c.StartedAt)}
	case pods.Terminated:
		out.State.Terminated = &corev1.ContainerStateTerminated{
			ExitCode: c.ExitCode, Reason: c.Reason, Message: c.Message,
			StartedAt: secs(c.StartedAt), FinishedAt: secs(c.FinishedAt), ContainerID: out.ContainerID,
		}
	default:
		reason := c.Reason
		if reason == "" {
			reason = pods.ReasonContainerCreating
		}
		out.State.Waiting = &corev1.ContainerStateWaiting{Reason: reason, Message: c.Message}
	}
	started := c.State == pods.Running
	out.Started = &started
	return out
}

// writeStatus writes status as the Pod's if it differs from what the API
// holds, and keeps the Pod the API server returns; written says it wrote.
//
// It patches the status alone, with the Pod's UID and resourceVersion as
// preconditions: a Pod changed since (labels, annotations, someone else's
// condition) makes the write conflict, and it is done again from the Pod
// as it is now. An update of the whole Pod would instead be refused
// (Forbidden) when the labels changed: the API server's NodeRestriction
// lets a node change no labels through the status, and reads the stale
// labels as a change.
func (s *podSyncer) writeStatus(ctx context.Context, w *podWorker, pod *corev1.Pod, status corev1.PodStatus) (written bool, err error) {
	if apiequality.Semantic.DeepEqual(pod.Status, status) {
		return false, nil
	}
	if w.newer(pod) {
		// A newer Pod came meanwhile (its spec updated many times in a
		// row): this write would conflict, and the next sync, at once,
		// writes the status of that one.
		w.nudge(wakeConflict)
		return false, nil
	}
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"uid": pod.UID, "resourceVersion": pod.ResourceVersion},
		"status":   status,
	})
	if err != nil {
		return false, err
	}
	uctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	got, err := s.k.client().CoreV1().Pods(pod.Namespace).Patch(uctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{}, "status")
	switch {
	case apierrors.IsConflict(err):
		// The Pod changed since the watch told, or the watch is behind
		// (for a while after the API server was away): sync again at
		// once with the Pod as it is now.
		fresh, gerr := s.k.client().CoreV1().Pods(pod.Namespace).Get(uctx, pod.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(gerr) || (gerr == nil && fresh.UID != pod.UID) {
			return false, nil
		}
		if gerr != nil {
			return false, fmt.Errorf("patch the Pod's status: %w; get the Pod: %w", err, gerr)
		}
		w.setLatest(fresh)
		w.nudge(wakeConflict)
		return false, nil
	case apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("patch the Pod's status: %w", err)
	}
	w.setLatest(got)
	return true, nil
}
