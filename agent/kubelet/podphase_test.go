package kubelet

import "testing"

var phaseNames = map[podPhase]string{podSyncing: "syncing", podTerminating: "terminating", podTerminated: "terminated", podGone: "gone"}

// TestAdvance walks a pod's phases through what can happen to it: only
// the moves of the lifecycle happen, a terminated pod never syncs again,
// and a Sync in flight is canceled once the pod is to be killed.
func TestAdvance(t *testing.T) {
	for _, tc := range []struct {
		name       string
		from       podPhase
		objectGone bool // before the event
		events     []podEvent
		want       podPhase
		canceled   bool
	}{
		{"deletion asked", podSyncing, false, []podEvent{podDeleting}, podTerminating, true},
		{"object gone while running", podSyncing, false, []podEvent{podRemoved}, podTerminating, true},
		{"deletion asked again while killing", podTerminating, false, []podEvent{podDeleting}, podTerminating, false},
		{"killed, object deleted", podTerminating, false, []podEvent{podKilled}, podTerminated, false},
		{"killed, object already gone", podTerminating, true, []podEvent{podKilled}, podGone, false},
		{"object gone while killing, then killed", podTerminating, false, []podEvent{podRemoved, podKilled}, podGone, false},
		{"terminated, then the watch tells it is gone", podTerminated, false, []podEvent{podRemoved}, podGone, false},
		{"terminated pods do not sync again", podTerminated, false, []podEvent{podDeleting}, podTerminated, false},
		{"a syncing pod is not killed by a stray kill", podSyncing, false, []podEvent{podKilled}, podSyncing, false},
		{"gone stays gone", podGone, true, []podEvent{podDeleting, podRemoved, podKilled}, podGone, false},
	} {
		canceled := false
		w := &podWorker{phase: tc.from, objectGone: tc.objectGone, cancelSync: func() { canceled = true }}
		for _, e := range tc.events {
			w.advance(e)
		}
		if w.phase != tc.want || canceled != tc.canceled {
			t.Errorf("%s: phase %s (Sync canceled %v), want %s (canceled %v)", tc.name, phaseNames[w.phase], canceled, phaseNames[tc.want], tc.canceled)
		}
	}
}
