package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/cairn-os/cairn/agent/node/host"
	"github.com/cairn-os/cairn/internal/backoff"
)

// observation is one look at what the conditions report.
type observation struct {
	runtimeReady, networkReady bool
	runtimeReason              string
	runtimeErr                 error
	// routesReady says whether the routes to other nodes' pods are in,
	// routesWhy why not.
	routesReady bool
	routesWhy   string

	memory    host.Memory
	memoryErr error
	disk      host.Filesystem
	diskErr   error
	// imagefs is the runtime's images' filesystem, if imagefsErr is nil.
	imagefs    host.Filesystem
	imagefsErr error
	pids       host.PIDs
	pidsErr    error

	thresholds Thresholds
}

func (j *joiner) observe(ctx context.Context) observation {
	var o observation
	o.runtimeReady, o.networkReady, o.runtimeReason, o.runtimeErr = j.cfg.RuntimeStatus.RuntimeStatus(ctx)
	o.routesReady = true
	if j.cfg.PodRoutes != nil {
		o.routesReady, o.routesWhy = j.cfg.PodRoutes()
	}
	o.memory, o.memoryErr = host.ReadMemory()
	o.disk, o.diskErr = host.StatFS(j.cfg.Dir)
	o.imagefsErr = errors.New("the images' filesystem is not known")
	if j.cfg.ImageFS != nil {
		var dir string
		if dir, o.imagefsErr = j.cfg.ImageFS(ctx); o.imagefsErr == nil {
			o.imagefs, o.imagefsErr = host.StatFS(dir)
		}
	}
	o.pids, o.pidsErr = host.ReadPIDs()
	o.thresholds = j.cfg.Thresholds.WithDefaults()
	return o
}

// ourConditions are the condition types the node reports, in order.
var ourConditions = []corev1.NodeConditionType{
	corev1.NodeReady, corev1.NodeMemoryPressure, corev1.NodeDiskPressure,
	corev1.NodePIDPressure, corev1.NodeNetworkUnavailable,
}

// conditions returns the Node's conditions after o: those of ourConditions
// computed from o with heartbeat now, keeping the transition time of prev
// when the status stays, and then the other conditions of prev as they
// are, for others own them.
func conditions(prev []corev1.NodeCondition, o *observation, now metav1.Time) []corev1.NodeCondition {
	cs := []corev1.NodeCondition{
		readyCondition(o), memoryCondition(o), diskCondition(o), pidCondition(o), networkCondition(o),
	}
	for i := range cs {
		c := &cs[i]
		c.LastHeartbeatTime, c.LastTransitionTime = now, now
		if p := findCondition(prev, c.Type); p != nil && p.Status == c.Status {
			c.LastTransitionTime = p.LastTransitionTime
		}
	}
	for _, p := range prev {
		if !slices.Contains(ourConditions, p.Type) {
			cs = append(cs, p)
		}
	}
	return cs
}

func findCondition(cs []corev1.NodeCondition, t corev1.NodeConditionType) *corev1.NodeCondition {
	for i := range cs {
		if cs[i].Type == t {
			return &cs[i]
		}
	}
	return nil
}

func condition(t corev1.NodeConditionType, s corev1.ConditionStatus, reason, message string) corev1.NodeCondition {
	return corev1.NodeCondition{Type: t, Status: s, Reason: reason, Message: message}
}

func readyCondition(o *observation) corev1.NodeCondition {
	const t = corev1.NodeReady
	switch {
	case o.runtimeErr != nil:
		return condition(t, corev1.ConditionFalse, "RuntimeStatusUnknown", "cannot get the container runtime's status: "+o.runtimeErr.Error())
	case !o.runtimeReady:
		return condition(t, corev1.ConditionFalse, "RuntimeNotReady", "container runtime not ready: "+o.runtimeReason)
	case !o.networkReady:
		return condition(t, corev1.ConditionFalse, "NetworkNotReady", "container runtime network not ready: "+o.runtimeReason)
	}
	return condition(t, corev1.ConditionTrue, "KubeletReady", "cairn-agent is posting ready status")
}

func networkCondition(o *observation) corev1.NodeCondition {
	const t = corev1.NodeNetworkUnavailable
	switch {
	case o.runtimeErr != nil:
		return condition(t, corev1.ConditionUnknown, "RuntimeStatusUnknown", "cannot get the container runtime's status: "+o.runtimeErr.Error())
	case !o.networkReady:
		return condition(t, corev1.ConditionTrue, "NetworkPluginNotReady", "pod network not ready: "+o.runtimeReason)
	case !o.routesReady:
		return condition(t, corev1.ConditionTrue, "NoRouteCreated", o.routesWhy)
	}
	return condition(t, corev1.ConditionFalse, "NetworkReady", "pod network is ready")
}

// Messages say the threshold, not the measurement, so that they change
// only with the status.

func memoryCondition(o *observation) corev1.NodeCondition {
	const t = corev1.NodeMemoryPressure
	if o.memoryErr != nil {
		return condition(t, corev1.ConditionUnknown, "MemoryNotMeasured", o.memoryErr.Error())
	}
	if s := o.thresholds.Memory(o.memory); s != nil {
		return condition(t, corev1.ConditionTrue, "KubeletHasInsufficientMemory", s.Message)
	}
	return condition(t, corev1.ConditionFalse, "KubeletHasSufficientMemory", "node has sufficient memory available")
}

func diskCondition(o *observation) corev1.NodeCondition {
	const t = corev1.NodeDiskPressure
	if o.diskErr != nil {
		return condition(t, corev1.ConditionUnknown, "DiskNotMeasured", o.diskErr.Error())
	}
	if s := o.thresholds.Nodefs(o.disk); s != nil {
		return condition(t, corev1.ConditionTrue, "KubeletHasDiskPressure", s.Message)
	}
	// The images' filesystem, where it is known, as the kubelet does; not
	// knowing it leaves the node's filesystem to tell.
	if o.imagefsErr == nil {
		if s := o.thresholds.Imagefs(o.imagefs); s != nil {
			return condition(t, corev1.ConditionTrue, "KubeletHasDiskPressure", s.Message)
		}
	}
	return condition(t, corev1.ConditionFalse, "KubeletHasNoDiskPressure", "node has no disk pressure")
}

func pidCondition(o *observation) corev1.NodeCondition {
	const t = corev1.NodePIDPressure
	if o.pidsErr != nil {
		return condition(t, corev1.ConditionUnknown, "PIDsNotMeasured", o.pidsErr.Error())
	}
	if s := o.thresholds.PIDs(o.pids); s != nil {
		return condition(t, corev1.ConditionTrue, "KubeletHasInsufficientPID", s.Message)
	}
	return condition(t, corev1.ConditionFalse, "KubeletHasSufficientPID", "node has sufficient PID available")
}

// nodeStatus measures the node: the status it would report now, prev
// being the conditions it reports so far.
func (j *joiner) nodeStatus(ctx context.Context, prev []corev1.NodeCondition, now metav1.Time) corev1.NodeStatus {
	o := j.observe(ctx)
	var mem *host.Memory
	if o.memoryErr == nil {
		mem = &o.memory
	}
	var disk *host.Filesystem
	if o.diskErr == nil {
		disk = &o.disk
	}
	c := capacity(runtime.NumCPU(), mem, disk)
	return corev1.NodeStatus{
		Capacity:    c,
		Allocatable: allocatable(c, o.thresholds),
		Conditions:  conditions(prev, &o, now),
		Addresses:   j.addresses(),
		NodeInfo:    j.nodeInfo(ctx),
		DaemonEndpoints: corev1.NodeDaemonEndpoints{
			KubeletEndpoint: corev1.DaemonEndpoint{Port: int32(j.cfg.KubeletPort)},
		},
		DeclaredFeatures: j.cfg.DeclaredFeatures,
		VolumesInUse:     j.volumesInUse(),
	}
}

// volumesInUse is the status's list of the volumes mounted on the node.
func (j *joiner) volumesInUse() []corev1.UniqueVolumeName {
	if j.cfg.VolumesInUse == nil {
		return nil
	}
	return j.cfg.VolumesInUse()
}

// addresses returns the node's InternalIPs, the configured one or else
// its host's, and its Hostname.
func (j *joiner) addresses() []corev1.NodeAddress {
	ips := []netip.Addr{j.cfg.NodeIP}
	if !j.cfg.NodeIP.IsValid() {
		var err error
		if ips, err = host.Addresses(); err != nil {
			j.log.Warn("cannot read the node's addresses", "err", err)
		}
	}
	var as []corev1.NodeAddress
	for _, ip := range ips {
		as = append(as, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip.String()})
	}
	return append(as, corev1.NodeAddress{Type: corev1.NodeHostName, Address: j.cfg.NodeName})
}

// sameStatus reports whether a and b differ in nothing that nodeStatus
// sets but heartbeat times.
func sameStatus(a, b *corev1.NodeStatus) bool {
	noHeartbeat := func(cs []corev1.NodeCondition) []corev1.NodeCondition {
		cs = slices.Clone(cs)
		for i := range cs {
			cs[i].LastHeartbeatTime = metav1.Time{}
		}
		return cs
	}
	eq := apiequality.Semantic.DeepEqual
	return eq(a.Addresses, b.Addresses) && eq(a.Capacity, b.Capacity) && eq(a.Allocatable, b.Allocatable) &&
		eq(a.NodeInfo, b.NodeInfo) && eq(a.DaemonEndpoints, b.DaemonEndpoints) && eq(a.DeclaredFeatures, b.DeclaredFeatures) &&
		eq(a.VolumesInUse, b.VolumesInUse) && eq(noHeartbeat(a.Conditions), noHeartbeat(b.Conditions))
}

// reportStatus measures the node every StatusInterval and patches the
// Node's status when it differs from what the Node says, or when
// StatusReportInterval passed since the last patch, until ctx ends.
func (j *joiner) reportStatus(ctx context.Context) {
	nodes := j.client.CoreV1().Nodes()
	lastPatch := time.Now() // registration wrote a status
	b := backoff.Backoff{Initial: 200 * time.Millisecond, Max: j.cfg.StatusInterval, Jitter: 0.2}
	wait := j.cfg.StatusInterval
	for backoff.Sleep(ctx, backoff.RealClock, wait) == nil {
		patched, err := j.updateStatus(ctx, nodes, time.Since(lastPatch) >= j.cfg.StatusReportInterval)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if apierrors.IsConflict(err) {
				// The attach/detach controller (volumesAttached) or an
				// operator changed the Node meanwhile: read it again soon.
				j.log.Debug("the Node changed while its status was patched; again", "err", err)
				wait = 50 * time.Millisecond
				continue
			}
			wait = b.Next()
			j.log.Warn("cannot update the node status; retrying", "err", err, "in", wait.Round(time.Millisecond))
			continue
		}
		j.statusChecks.Add(1)
		if b.Reset() {
			j.log.Info("updating the node status again")
		}
		if patched {
			lastPatch = time.Now()
		}
		wait = j.cfg.StatusInterval
	}
}

// updateStatus reads the Node and patches its status if it differs from
// the node's measurement, or if force is set; it reports whether it
// patched. The patch carries the resourceVersion read: if someone changed
// the Node in between, the API server refuses it, and the next try starts
// from their version rather than overwrite their conditions.
func (j *joiner) updateStatus(ctx context.Context, nodes corev1client.NodeInterface, force bool) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	node, err := nodes.Get(ctx, j.cfg.NodeName, metav1.GetOptions{})
	if err != nil {
		return false, fmt.Errorf("get Node: %w", err)
	}
	status := j.nodeStatus(ctx, node.Status.Conditions, metav1.Now())
	if !force && sameStatus(&node.Status, &status) {
		return false, nil
	}
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"resourceVersion": node.ResourceVersion},
		"status": map[string]any{
			"capacity":         status.Capacity,
			"allocatable":      status.Allocatable,
			"conditions":       status.Conditions,
			"addresses":        status.Addresses,
			"nodeInfo":         status.NodeInfo,
			"daemonEndpoints":  status.DaemonEndpoints,
			"declaredFeatures": status.DeclaredFeatures,
			"volumesInUse":     status.VolumesInUse,
		},
	})
	if err != nil {
		return false, err
	}
	if _, err := nodes.Patch(ctx, j.cfg.NodeName, types.MergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		return false, fmt.Errorf("patch Node status: %w", err)
	}
	j.logConditions(node.Status.Conditions, status.Conditions)
	return true, nil
}

// logConditions logs those of ourConditions in cs whose status or reason
// differs from prev.
func (j *joiner) logConditions(prev, cs []corev1.NodeCondition) {
	for _, c := range cs {
		if p := findCondition(prev, c.Type); slices.Contains(ourConditions, c.Type) &&
			(p == nil || p.Status != c.Status || p.Reason != c.Reason) {
			j.log.Info("node condition", "type", c.Type, "status", c.Status, "reason", c.Reason, "message", c.Message)
		}
	}
}
