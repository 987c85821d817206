package machineconfig

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestEvictionHard(t *testing.T) {
	c, err := Parse([]byte(doc(t, header+machineSection+`  eviction:
    hard: {memory.available: 500Mi, nodefs.available: 15%, pid.available: 5%}
`)))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]uint64{"memory.available": 500 << 20, "nodefs.available": 15, "pid.available": 5}
	if diff := cmp.Diff(want, c.Machine.Eviction.HardThresholds()); diff != "" {
		t.Errorf("HardThresholds() (-want +got):\n%s", diff)
	}
	_, err = Parse([]byte(doc(t, header+machineSection+`  eviction:
    hard: {memory.available: 10%, nodefs.available: 100Mi, imagefs.available: 0%, disk.available: 1%, pid.available: 100%}
`)))
	var verr *ValidationError
	if !errors.As(err, &verr) {
		t.Fatalf("Parse() = %v, want a *ValidationError", err)
	}
	wantErrs := []FieldError{
		{`machine.eviction.hard["disk.available"]`, "not a signal: use one of memory.available, nodefs.available, nodefs.inodesFree, imagefs.available, pid.available"},
		{`machine.eviction.hard["imagefs.available"]`, `"0%" is not a percent between 1% and 99%, such as 10%`},
		{`machine.eviction.hard["memory.available"]`, `"10%" is not a quantity of memory above 0, such as 500Mi`},
		{`machine.eviction.hard["nodefs.available"]`, `"100Mi" is not a percent between 1% and 99%, such as 10%`},
		{`machine.eviction.hard["pid.available"]`, `"100%" is not a percent between 1% and 99%, such as 10%`},
	}
	if diff := cmp.Diff(wantErrs, verr.Errors); diff != "" {
		t.Errorf("errors (-want +got):\n%s", diff)
	}
}

func TestEvictionSoft(t *testing.T) {
	c, err := Parse([]byte(doc(t, header+machineSection+`  eviction:
    soft: {memory.available: 1Gi}
    softGracePeriod: {memory.available: 1m30s}
    maxPodGracePeriod: 10s
`)))
	if err != nil {
		t.Fatal(err)
	}
	soft, grace, maxPod := c.Machine.Eviction.SoftThresholds()
	if soft["memory.available"] != 1<<30 || grace["memory.available"] != 90*time.Second || maxPod != 10*time.Second {
		t.Errorf("SoftThresholds() = %v, %v, %v; want 1Gi, 1m30s, 10s", soft, grace, maxPod)
	}
	_, err = Parse([]byte(doc(t, header+machineSection+`  eviction:
    soft: {memory.available: 1Gi, nodefs.available: 20%}
    softGracePeriod: {memory.available: soon, pid.available: 1m}
    maxPodGracePeriod: -1s
`)))
	var verr *ValidationError
	if !errors.As(err, &verr) {
		t.Fatalf("Parse() = %v, want a *ValidationError", err)
	}
	want := []FieldError{
		{`machine.eviction.softGracePeriod["nodefs.available"]`, "required: how long the soft threshold must stay crossed"},
		{`machine.eviction.softGracePeriod["memory.available"]`, `"soon" is not a duration of 0s or more, such as 1m30s`},
		{`machine.eviction.softGracePeriod["pid.available"]`, "no soft threshold of this signal in machine.eviction.soft"},
		{"machine.eviction.maxPodGracePeriod", `"-1s" is not a duration of 0s or more, such as 30s`},
	}
	if diff := cmp.Diff(want, verr.Errors); diff != "" {
		t.Errorf("errors (-want +got):\n%s", diff)
	}
}
