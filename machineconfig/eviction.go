package machineconfig

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Eviction sets the node's eviction thresholds, as the kubelet's
// evictionHard and evictionSoft: by signal, memory.available as a
// quantity (500Mi), the others as a percent (10%) of the filesystem's
// space or inodes, or of kernel.pid_max.
type Eviction struct {
	// Hard thresholds evict at once; a signal left out keeps the
	// kubelet's default.
	Hard map[string]string `json:"hard,omitempty"`
	// Soft thresholds evict once crossed for their SoftGracePeriod (a Go
	// duration, by signal), giving the pod at most MaxPodGracePeriod
	// (default 30s) to stop. None by default.
	Soft              map[string]string `json:"soft,omitempty"`
	SoftGracePeriod   map[string]string `json:"softGracePeriod,omitempty"`
	MaxPodGracePeriod string            `json:"maxPodGracePeriod,omitempty"`
}

// EvictionSignals are the signals Eviction.Hard takes.
var EvictionSignals = []string{"memory.available", "nodefs.available", "nodefs.inodesFree", "imagefs.available", "pid.available"}

// HardThresholds returns the hard thresholds a validated Eviction sets,
// by signal: bytes for memory.available, percents for the others.
func (e *Eviction) HardThresholds() map[string]uint64 { return thresholds(e.Hard) }

// SoftThresholds returns the soft thresholds, as HardThresholds, with
// their grace periods and the most a pod gets to stop.
func (e *Eviction) SoftThresholds() (soft map[string]uint64, grace map[string]time.Duration, maxPodGrace time.Duration) {
	grace = map[string]time.Duration{}
	for signal, v := range e.SoftGracePeriod {
		grace[signal], _ = time.ParseDuration(v)
	}
	maxPodGrace, _ = time.ParseDuration(cmp.Or(e.MaxPodGracePeriod, "30s"))
	return thresholds(e.Soft), grace, maxPodGrace
}

func thresholds(by map[string]string) map[string]uint64 {
	out := map[string]uint64{}
	for signal, v := range by {
		if n, err := parseThreshold(signal, v); err == nil {
			out[signal] = n
		}
	}
	return out
}

// parseThreshold reads v, the threshold of signal.
func parseThreshold(signal, v string) (uint64, error) {
	if signal == "memory.available" {
		n, err := Quantity(v).Bytes()
		if err != nil || n <= 0 {
			return 0, fmt.Errorf("%q is not a quantity of memory above 0, such as 500Mi", v)
		}
		return uint64(n), nil
	}
	n, err := strconv.ParseUint(strings.TrimSuffix(v, "%"), 10, 64)
	if !strings.HasSuffix(v, "%") || err != nil || n == 0 || n >= 100 {
		return 0, fmt.Errorf("%q is not a percent between 1%% and 99%%, such as 10%%", v)
	}
	return n, nil
}

func (v *validator) eviction(e *Eviction) {
	v.thresholds("machine.eviction.hard", e.Hard)
	v.thresholds("machine.eviction.soft", e.Soft)
	for _, signal := range sortedKeys(e.Soft) {
		if _, ok := e.SoftGracePeriod[signal]; !ok && slices.Contains(EvictionSignals, signal) {
			v.add(fmt.Sprintf("machine.eviction.softGracePeriod[%q]", signal), "required: how long the soft threshold must stay crossed")
		}
	}
	for _, signal := range sortedKeys(e.SoftGracePeriod) {
		p := fmt.Sprintf("machine.eviction.softGracePeriod[%q]", signal)
		if _, ok := e.Soft[signal]; !ok {
			v.add(p, "no soft threshold of this signal in machine.eviction.soft")
		} else if d, err := time.ParseDuration(e.SoftGracePeriod[signal]); err != nil || d < 0 {
			v.add(p, "%q is not a duration of 0s or more, such as 1m30s", e.SoftGracePeriod[signal])
		}
	}
	if e.MaxPodGracePeriod != "" {
		if d, err := time.ParseDuration(e.MaxPodGracePeriod); err != nil || d < 0 {
			v.add("machine.eviction.maxPodGracePeriod", "%q is not a duration of 0s or more, such as 30s", e.MaxPodGracePeriod)
		}
	}
}

// thresholds checks the thresholds at p, by signal.
func (v *validator) thresholds(p string, by map[string]string) {
	for _, signal := range sortedKeys(by) {
		fp := fmt.Sprintf("%s[%q]", p, signal)
		if !slices.Contains(EvictionSignals, signal) {
			v.add(fp, "not a signal: use one of %s", strings.Join(EvictionSignals, ", "))
			continue
		}
		if _, err := parseThreshold(signal, by[signal]); err != nil {
			v.add(fp, "%v", err)
		}
	}
}
