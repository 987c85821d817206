package volumes

import (
	"testing"
	"time"
)

func TestRenewAt(t *testing.T) {
	issued := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		name string
		life time.Duration
		want time.Duration // after issued
	}{
		{"the API server's minimum of 10 min: at 8 min", 10 * time.Minute, 8 * time.Minute},
		{"kube-api-access's 3607 s: at 80 %", 3607 * time.Second, 2885600 * time.Millisecond},
		{"a day: at 80 %", 24 * time.Hour, 19*time.Hour + 12*time.Minute},
		{"30 h: after a day", 30 * time.Hour, 24 * time.Hour},
		{"a year, as the API server extends kube-api-access tokens: after a day", 365 * 24 * time.Hour, 24 * time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := renewAt(issued, issued.Add(tc.life)).Sub(issued); got != tc.want {
				t.Errorf("renewAt(issued, issued+%v) = issued+%v, want issued+%v", tc.life, got, tc.want)
			}
		})
	}
}
