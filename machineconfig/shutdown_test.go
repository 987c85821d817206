package machineconfig

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestShutdownPeriods(t *testing.T) {
	for _, tc := range []struct {
		yaml            string
		grace, critical time.Duration
	}{
		{"", 30 * time.Second, 10 * time.Second},
		{"  shutdown: {gracePeriod: 2m}\n", 2 * time.Minute, 10 * time.Second},
		{"  shutdown: {gracePeriod: 0s, criticalPodsGracePeriod: 0s}\n", 0, 0},
		{"  shutdown: {gracePeriod: 45s, criticalPodsGracePeriod: 15s}\n", 45 * time.Second, 15 * time.Second},
	} {
		c, err := Parse([]byte(doc(t, header+machineSection+tc.yaml)))
		if err != nil {
			t.Fatalf("%q: Parse() = %v", tc.yaml, err)
		}
		if g, cr := c.Machine.Shutdown.Periods(); g != tc.grace || cr != tc.critical {
			t.Errorf("%q: Periods() = %v, %v, want %v, %v", tc.yaml, g, cr, tc.grace, tc.critical)
		}
	}
}

func TestShutdownInvalid(t *testing.T) {
	for _, tc := range []struct {
		yaml string
		want []FieldError
	}{
		{"  shutdown: {gracePeriod: soon}\n", []FieldError{{"machine.shutdown.gracePeriod", `"soon" is not a duration of 0s or more, such as 30s`}}},
		{"  shutdown: {gracePeriod: -1s}\n", []FieldError{{"machine.shutdown.gracePeriod", `"-1s" is not a duration of 0s or more, such as 30s`}}},
		{"  shutdown: {gracePeriod: 5s}\n", []FieldError{{"machine.shutdown.criticalPodsGracePeriod", "10s is longer than gracePeriod 5s, of which it is a part"}}},
		{"  shutdown: {criticalPodsGracePeriod: 1}\n", []FieldError{{"machine.shutdown.criticalPodsGracePeriod", `"1" is not a duration of 0s or more, such as 10s`}}},
	} {
		_, err := Parse([]byte(doc(t, header+machineSection+tc.yaml)))
		var verr *ValidationError
		if !errors.As(err, &verr) {
			t.Fatalf("%q: Parse() = %v, want a *ValidationError", tc.yaml, err)
		}
		if diff := cmp.Diff(tc.want, verr.Errors); diff != "" {
			t.Errorf("%q: errors (-want +got):\n%s", tc.yaml, diff)
		}
	}
}
