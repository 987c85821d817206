package proxy

import (
	"testing"
	"time"
)

func TestSyncDue(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	for _, c := range []struct {
		what                  string
		now, last, lastChange time.Time
		took                  time.Duration
		want                  time.Time
	}{
		{"a change after a second without a sync is written at once",
			ms(5000), ms(0), ms(5000), 3 * time.Millisecond, ms(5000)},
		{"a burst's change waits for the burst to be quiet",
			ms(300), ms(0), ms(290), 3 * time.Millisecond, ms(390)},
		{"a burst that keeps on is written a second after the last sync",
			ms(950), ms(0), ms(940), 3 * time.Millisecond, ms(1000)},
		{"a slow sync spaces the next: five times its duration",
			ms(300), ms(0), ms(100), 120 * time.Millisecond, ms(600)},
		{"spacing never goes past the burst's second",
			ms(300), ms(0), ms(100), 400 * time.Millisecond, ms(1000)},
		{"after a full sync (took zero), quiet alone counts",
			ms(50), ms(0), ms(40), 0, ms(140)},
	} {
		if got := syncDue(c.now, c.last, c.lastChange, c.took, time.Second); !got.Equal(c.want) {
			t.Errorf("%s: due at %v, want %v", c.what, got.Sub(t0), c.want.Sub(t0))
		}
	}
}
