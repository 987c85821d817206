// Package drain empties a node of its pods before it goes away, for an
// upgrade's reboot or a reset, as kubectl drain does but with the node's
// own credentials: the Node cordoned (spec.unschedulable), each pod bound
// to it evicted through the Eviction API, which holds an eviction back
// while a PodDisruptionBudget does not allow it, and waited for until it
// is gone. DaemonSet pods and static pods stay: they go with the node.
//
// A marker file says that a drain cordoned the Node, so that the node,
// back from its reboot, uncordons it once Ready: the file is on the
// node's disk, which a power cut at any point leaves with or without it.
package drain

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/cairn-os/cairn/agent/node"
	"github.com/cairn-os/cairn/internal/atomicfile"
)

// DefaultTimeout is how long the pods have to go when Options say nothing.
const DefaultTimeout = 5 * time.Minute

// Options say how to drain.
type Options struct {
	// Timeout bounds the eviction and the wait; 0 means DefaultTimeout.
	Timeout time.Duration
	// Force: past the timeout, delete the pods still there (their grace
	// periods respected) and go on, rather than fail.
	Force bool
	// Progress, if set, hears each step: cordoned, draining (the pods
	// left), drained.
	Progress func(step, message string)
}

// Drainer drains the node while it is a member of its cluster.
type Drainer struct {
	marker string
	log    *slog.Logger
	// every is how often pods held back are evicted again and the pods
	// looked at; tests shorten it.
	every time.Duration

	mu     sync.Mutex
	client kubernetes.Interface
	name   string
}

// New returns a Drainer that keeps its marker at markerPath.
func New(markerPath string, log *slog.Logger) *Drainer {
	return &Drainer{marker: markerPath, log: log, every: 2 * time.Second}
}

// marker is what the marker file holds.
type marker struct {
	// Cordoned: the drain cordoned the Node, which was schedulable.
	Cordoned bool `json:"cordoned"`
	Since    time.Time
}

// Run is the drainer's node component: Drain works while it runs. If a
// drain cordoned the Node before the node went away, Run uncordons it once
// the Node is Ready again.
func (d *Drainer) Run(ctx context.Context, m *node.Member) error {
	d.mu.Lock()
	d.client, d.name = m.Client, m.Name
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		d.client, d.name = nil, ""
		d.mu.Unlock()
	}()
	if _, err := os.Stat(d.marker); err == nil {
		if err := d.uncordonWhenReady(ctx, m.Client, m.Name); err != nil {
			return err
		}
	}
	<-ctx.Done()
	return nil
}

// Joined says whether the node is in its cluster now: Drain needs it.
func (d *Drainer) Joined() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.client != nil
}

func (d *Drainer) member() (kubernetes.Interface, string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.client == nil {
		return nil, "", errors.New("the node is not in its cluster now (the API server unreachable, or the node not joined yet)")
	}
	return d.client, d.name, nil
}

// Drain cordons the Node and empties it of its pods. If it fails, the Node
// is left as it was found; if it succeeds, the Node stays cordoned until
// the node is back (Run) or Undo.
func (d *Drainer) Drain(ctx context.Context, o Options) error {
	c, name, err := d.member()
	if err != nil {
		return err
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultTimeout
	}
	progress := func(step, format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		d.log.Info("drain: "+msg, "step", step)
		if o.Progress != nil {
			o.Progress(step, msg)
		}
	}
	n, err := c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("get the Node %s: %w", name, err)
	}
	if err := d.writeMarker(marker{Cordoned: !n.Spec.Unschedulable, Since: time.Now()}); err != nil {
		return err
	}
	if err := setUnschedulable(ctx, c, name, true); err != nil {
		return errors.Join(err, d.Undo(context.WithoutCancel(ctx)))
	}
	progress("cordoned", "the Node %s cordoned: no new pods come", name)
	if err := d.empty(ctx, c, name, o, progress); err != nil {
		return errors.Join(err, d.Undo(context.WithoutCancel(ctx)))
	}
	progress("drained", "the node has no pods left but DaemonSet and static pods")
	return nil
}

// empty evicts the node's pods and waits until they are gone, or the
// timeout passes.
func (d *Drainer) empty(ctx context.Context, c kubernetes.Interface, name string, o Options, progress func(step, format string, args ...any)) error {
	deadline := time.Now().Add(o.Timeout)
	evicted := map[types.UID]bool{}
	var last string
	for {
		left, err := drainable(ctx, c, name)
		if err != nil {
			return err
		}
		if len(left) == 0 {
			return nil
		}
		var held []string
		for _, p := range left {
			if p.DeletionTimestamp != nil {
				continue // going: evicted, or deleted by someone else
			}
			err := c.PolicyV1().Evictions(p.Namespace).Evict(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name}})
			switch {
			case err == nil:
				evicted[p.UID] = true
			case apierrors.IsNotFound(err):
			case apierrors.IsTooManyRequests(err):
				held = append(held, p.Namespace+"/"+p.Name+" (held by a PodDisruptionBudget)")
			default:
				return fmt.Errorf("evict %s/%s: %w", p.Namespace, p.Name, err)
			}
		}
		var names []string
		for _, p := range left {
			names = append(names, p.Namespace+"/"+p.Name)
		}
		if msg := "pods left: " + strings.Join(names, ", "); msg != last {
			progress("draining", "%s", msg)
			last = msg
		}
		if time.Now().After(deadline) {
			if !o.Force {
				return fmt.Errorf("drain: pods still on the node after %s: %s; wait, or force the pods out (--force)", o.Timeout, strings.Join(append(held, names...), ", "))
			}
			return d.forceOut(ctx, c, name, left, progress)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d.every):
		}
	}
}

// forceOut deletes the pods left, as the timeout passed with force, and
// waits a while for them to go; the node goes on either way.
func (d *Drainer) forceOut(ctx context.Context, c kubernetes.Interface, name string, left []corev1.Pod, progress func(step, format string, args ...any)) error {
	wait := time.Duration(0)
	for _, p := range left {
		if err := c.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete %s/%s: %w", p.Namespace, p.Name, err)
		}
		if g := p.Spec.TerminationGracePeriodSeconds; g != nil {
			wait = max(wait, time.Duration(*g)*time.Second)
		}
	}
	progress("draining", "timed out: %d pods deleted, PodDisruptionBudgets or not (forced)", len(left))
	for deadline := time.Now().Add(wait + 30*time.Second); time.Now().Before(deadline); {
		left, err := drainable(ctx, c, name)
		if err != nil || len(left) == 0 {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d.every):
		}
	}
	return nil
}

// drainable lists the node's pods that a drain evicts: all but DaemonSet
// pods and static (mirror) pods.
func drainable(ctx context.Context, c kubernetes.Interface, name string) ([]corev1.Pod, error) {
	pods, err := c.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + name})
	if err != nil {
		return nil, fmt.Errorf("list the node's pods: %w", err)
	}
	return slices.DeleteFunc(pods.Items, func(p corev1.Pod) bool {
		if _, mirror := p.Annotations[corev1.MirrorPodAnnotationKey]; mirror {
			return true
		}
		ref := metav1.GetControllerOf(&p)
		return ref != nil && ref.Kind == "DaemonSet"
	}), nil
}

// Undo uncordons the Node if a drain cordoned it, and forgets the drain:
// for an upgrade that did not reboot after all.
func (d *Drainer) Undo(ctx context.Context) error {
	c, name, err := d.member()
	if err != nil {
		return err
	}
	return d.uncordon(ctx, c, name)
}

func (d *Drainer) uncordon(ctx context.Context, c kubernetes.Interface, name string) error {
	m, err := d.readMarker()
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if m.Cordoned {
		if err := setUnschedulable(ctx, c, name, false); err != nil {
			return err
		}
		d.log.Info("drain: the Node uncordoned", "node", name, "cordoned since", m.Since)
	}
	return os.Remove(d.marker)
}

// uncordonWhenReady waits for the Node to be Ready, then uncordons it.
func (d *Drainer) uncordonWhenReady(ctx context.Context, c kubernetes.Interface, name string) error {
	for {
		n, err := c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err == nil && ready(n) {
			if err = d.uncordon(ctx, c, name); err == nil {
				return nil
			}
		}
		if err != nil {
			d.log.Debug("drain: not uncordoned yet", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(d.every):
		}
	}
}

func ready(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func setUnschedulable(ctx context.Context, c kubernetes.Interface, name string, v bool) error {
	patch := fmt.Appendf(nil, `{"spec":{"unschedulable":%t}}`, v)
	if _, err := c.CoreV1().Nodes().Patch(ctx, name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("set the Node %s unschedulable=%t: %w", name, v, err)
	}
	return nil
}

func (d *Drainer) readMarker() (marker, error) {
	var m marker
	data, err := os.ReadFile(d.marker)
	if err != nil {
		return m, err
	}
	if err := json.Unmarshal(data, &m); err != nil {
		return m, fmt.Errorf("drain marker %s: %w", d.marker, err)
	}
	return m, nil
}

func (d *Drainer) writeMarker(m marker) error {
	data, err := json.Marshal(m)
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(d.marker, data, 0o600); err != nil {
		return fmt.Errorf("write the drain marker: %w", err)
	}
	return nil
}

// Leave deletes the Node, for a node that resets: the cluster forgets it
// rather than wait for it. A standard cluster does not let a node delete
// its own Node (its authorizer gives nodes no delete); then the Node stays,
// cordoned, and what Leave says tells the operator what to do.
func (d *Drainer) Leave(ctx context.Context) string {
	c, name, err := d.member()
	if err == nil {
		err = c.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{})
	}
	switch {
	case err == nil || apierrors.IsNotFound(err):
		return fmt.Sprintf("the Node %s deleted", name)
	case apierrors.IsForbidden(err):
		return fmt.Sprintf("the Node %s stays, cordoned: the cluster does not let a node delete its own Node; delete it with `kubectl delete node %s`", name, name)
	default:
		return fmt.Sprintf("the Node %s stays, cordoned: %v", name, err)
	}
}
