package kubelet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/cairn-os/cairn/agent/node"
)

// Mirror pods: once the node joined, each static pod has a mirror Pod in
// the API, as the kubelet makes them — the same name, labels, annotations
// and spec, bound to the node and owned by its Node, annotated
// kubernetes.io/config.mirror with the static pod's hash — whose status
// is the static pod's. The node does not run mirrors (seen and removed
// skip them): it keeps them in step. A mirror that someone deletes is made
// again; a mirror whose static pod is gone or changed (another hash) is
// deleted. Each pass reads the mirrors from the member's Pod informer and
// runs when the static pods or their status change, when a mirror does,
// and every PodResync.

// pokeMirrors wakes runMirrors.
func (s *podSyncer) pokeMirrors() {
	select {
	case s.mirrorWake <- struct{}{}:
	default:
	}
}

// runMirrors keeps the static pods' mirrors in the API with m's client,
// reading them from store, until ctx ends.
func (s *podSyncer) runMirrors(ctx context.Context, m *node.Member, store cache.Store) {
	errBackoff := newBackoff(time.Second, 30*time.Second)
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.mirrorWake:
		case <-timer.C:
		}
		d := s.k.cfg.PodResync
		if err := s.syncMirrors(ctx, m, store); err != nil {
			if ctx.Err() != nil {
				return
			}
			// The API server is likely away: no faster than its back-off.
			d = max(d, errBackoff.Next())
			s.k.log.Warn("mirror pods not in step", "err", err, "retry in", d)
		} else {
			errBackoff.Reset()
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(d)
	}
}

// syncMirrors makes the mirrors in store those of the static pods, with
// their status.
func (s *podSyncer) syncMirrors(ctx context.Context, m *node.Member, store cache.Store) error {
	static := map[string]*corev1.Pod{}
	for _, p := range s.staticPods() {
		static[p.Namespace+"/"+p.Name] = p
	}
	mirrors := map[string]*corev1.Pod{}
	for _, obj := range store.List() {
		if p, ok := obj.(*corev1.Pod); ok && isMirror(p) {
			mirrors[p.Namespace+"/"+p.Name] = p
		}
	}
	var errs []error
	for key, mp := range mirrors {
		sp := static[key]
		if sp != nil && mp.Annotations[configMirrorAnnotation] == sp.Annotations[configHashAnnotation] && mp.DeletionTimestamp == nil {
			continue
		}
		// Gone, changed, or deleted by someone with a grace period that
		// no kubelet would honour: its static pod runs on.
		if err := deleteMirror(ctx, m, mp); err != nil {
			errs = append(errs, err)
			continue
		}
		delete(mirrors, key)
	}
	for key, sp := range static {
		mp := mirrors[key]
		if mp == nil {
			var err error
			if mp, err = createMirror(ctx, m, sp); err != nil {
				errs = append(errs, err)
				continue
			}
			if mp == nil {
				continue // made by an earlier pass the informer has yet to tell of
			}
		}
		if err := writeMirrorStatus(ctx, m, mp, sp.Status); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// createMirror creates the mirror of the static pod sp; nil if it exists.
func createMirror(ctx context.Context, m *node.Member, sp *corev1.Pod) (*corev1.Pod, error) {
	n := m.Node()
	mp := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: sp.Name, Namespace: sp.Namespace, Labels: sp.Labels, Annotations: map[string]string{},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: n.Name, UID: n.UID, Controller: new(true)}},
		},
		Spec: *sp.Spec.DeepCopy(),
	}
	for k, v := range sp.Annotations {
		mp.Annotations[k] = v
	}
	mp.Annotations[configMirrorAnnotation] = sp.Annotations[configHashAnnotation]
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	got, err := m.Client.CoreV1().Pods(mp.Namespace).Create(ctx, mp, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("create mirror pod %s/%s: %w", mp.Namespace, mp.Name, err)
	}
	return got, nil
}

// deleteMirror deletes mp at once: nothing of it runs.
func deleteMirror(ctx context.Context, m *node.Member, mp *corev1.Pod) error {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	uid := mp.UID
	err := m.Client.CoreV1().Pods(mp.Namespace).Delete(ctx, mp.Name, metav1.DeleteOptions{
		GracePeriodSeconds: new(int64),
		Preconditions:      &metav1.Preconditions{UID: &uid},
	})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("delete mirror pod %s/%s: %w", mp.Namespace, mp.Name, err)
	}
	return nil
}

// writeMirrorStatus makes mp's status the static pod's, if it differs once
// through the API's encoding (times in seconds).
func writeMirrorStatus(ctx context.Context, m *node.Member, mp *corev1.Pod, status corev1.PodStatus) error {
	data, err := json.Marshal(status)
	if err != nil {
		return err
	}
	var encoded corev1.PodStatus
	if err := json.Unmarshal(data, &encoded); err != nil {
		return err
	}
	if apiequality.Semantic.DeepEqual(mp.Status, encoded) {
		return nil
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"uid": mp.UID}, "status": status})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	_, err = m.Client.CoreV1().Pods(mp.Namespace).Patch(ctx, mp.Name, types.MergePatchType, patch, metav1.PatchOptions{}, "status")
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("write the status of mirror pod %s/%s: %w", mp.Namespace, mp.Name, err)
	}
	return nil
}
