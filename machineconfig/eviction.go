package machineconfig

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Eviction sets the node's hard eviction thresholds, as the kubelet's
// evictionHard: by signal, memory.available as a quantity (500Mi), the
// others as a percent (10%) of the filesystem's space or inodes, or of
// kernel.pid_max. A signal left out keeps the kubelet's default.
type Eviction struct {
	Hard map[string]string `json:"hard,omitempty"`
}

// EvictionSignals are the signals Eviction.Hard takes.
var EvictionSignals = []string{"memory.available", "nodefs.available", "nodefs.inodesFree", "imagefs.available", "pid.available"}

// HardThresholds returns the thresholds a validated Eviction sets, by
// signal: bytes for memory.available, percents for the others.
func (e *Eviction) HardThresholds() map[string]uint64 {
	out := map[string]uint64{}
	for signal, v := range e.Hard {
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
	for _, signal := range sortedKeys(e.Hard) {
		p := fmt.Sprintf("machine.eviction.hard[%q]", signal)
		if !slices.Contains(EvictionSignals, signal) {
			v.add(p, "not a signal: use one of %s", strings.Join(EvictionSignals, ", "))
			continue
		}
		if _, err := parseThreshold(signal, e.Hard[signal]); err != nil {
			v.add(p, "%v", err)
		}
	}
}
