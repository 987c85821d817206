package machineconfig

import (
	"cmp"
	"time"
)

// Shutdown sets how the node ends its pods when it shuts down, reboots
// or upgrades, as the kubelet's graceful node shutdown
// (shutdownGracePeriod, shutdownGracePeriodCriticalPods).
type Shutdown struct {
	// GracePeriod is how long the pods get in all, a Go duration such as
	// "30s"; "0s" ends them with the node, at once. Default 30s.
	GracePeriod string `json:"gracePeriod,omitempty"`
	// CriticalPodsGracePeriod is the part of GracePeriod kept for the
	// critical pods (priority system-cluster-critical and above), which
	// end after the others. Default 10s.
	CriticalPodsGracePeriod string `json:"criticalPodsGracePeriod,omitempty"`
}

// Defaults of Shutdown.
const (
	DefaultShutdownGracePeriod             = "30s"
	DefaultShutdownCriticalPodsGracePeriod = "10s"
)

// Periods returns the grace periods of a validated Shutdown, empty
// fields taking their defaults: all pods', and the critical pods' part
// of it.
func (s *Shutdown) Periods() (grace, critical time.Duration) {
	grace, _ = time.ParseDuration(cmp.Or(s.GracePeriod, DefaultShutdownGracePeriod))
	critical, _ = time.ParseDuration(cmp.Or(s.CriticalPodsGracePeriod, DefaultShutdownCriticalPodsGracePeriod))
	return grace, critical
}

func (v *validator) shutdown(s *Shutdown) {
	const p = "machine.shutdown"
	grace, err := time.ParseDuration(cmp.Or(s.GracePeriod, DefaultShutdownGracePeriod))
	if err != nil || grace < 0 {
		v.add(p+".gracePeriod", "%q is not a duration of 0s or more, such as 30s", s.GracePeriod)
		return
	}
	critical, err := time.ParseDuration(cmp.Or(s.CriticalPodsGracePeriod, DefaultShutdownCriticalPodsGracePeriod))
	switch {
	case err != nil || critical < 0:
		v.add(p+".criticalPodsGracePeriod", "%q is not a duration of 0s or more, such as 10s", s.CriticalPodsGracePeriod)
	case critical > grace:
		v.add(p+".criticalPodsGracePeriod", "%s is longer than gracePeriod %s, of which it is a part", critical, grace)
	}
}
