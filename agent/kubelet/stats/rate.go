package stats

import (
	"sync"
	"time"
)

// cpuRates turns cumulative CPU usage into a rate, as the kubelet's
// usageNanoCores: the usage since the previous sample of the same
// container, pod or node over the time between the two.
type cpuRates struct {
	mu   sync.Mutex
	last map[string]cpuSample
}

// cpuSample is one reading of cumulative usage and the rate it gave.
type cpuSample struct {
	at    int64  // Unix nanoseconds
	usage uint64 // core-nanoseconds
	rate  *uint64
}

// minRateInterval is the shortest time a rate is taken over: a process
// that sleeps and runs by turns has a rate of 0 or of a whole core over a
// few milliseconds. Two scrapers at once (metrics-server and a person)
// read the same rate.
const minRateInterval = int64(time.Second)

// rate records usage at time at for key and returns its rate since the
// key's previous sample: nil for a first sample, or when the usage went
// back (a new cgroup under the same key). A sample less than
// minRateInterval after the last one returns the last rate and is not
// kept.
func (r *cpuRates) rate(key string, at int64, usage uint64) *uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.last == nil {
		r.last = map[string]cpuSample{}
	}
	prev, ok := r.last[key]
	if ok && at-prev.at < minRateInterval {
		return prev.rate
	}
	s := cpuSample{at: at, usage: usage}
	if ok && usage >= prev.usage {
		// In floats: delta × 1e9 overflows uint64 past 18 core-seconds.
		v := uint64(float64(usage-prev.usage) / float64(at-prev.at) * 1e9)
		s.rate = &v
	}
	r.last[key] = s
	return s.rate
}

// keep forgets every key not in keys: containers and pods that are gone.
func (r *cpuRates) keep(keys map[string]bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for k := range r.last {
		if !keys[k] {
			delete(r.last, k)
		}
	}
}
