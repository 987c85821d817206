package node

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cairn-os/cairn/agent/node/host"
)

// healthy is an observation of a node with nothing wrong.
func healthy() observation {
	return observation{
		runtimeReady: true, networkReady: true,
		memory: host.Memory{Total: 8 << 30, Available: 4 << 30},
		disk:   host.Filesystem{Size: 100 << 30, Free: 50 << 30, Inodes: 1000, InodesFree: 900},
		pids:   host.PIDs{Used: 300, Max: 32768},

		routesReady: true,

		thresholds: DefaultThresholds,
	}
}

// brief is a condition without times.
type brief struct {
	Status         corev1.ConditionStatus
	Reason, Prefix string // Prefix: of the message
}

func TestConditions(t *testing.T) {
	tests := []struct {
		name   string
		change func(*observation)
		want   map[corev1.NodeConditionType]brief
	}{
		{
			name:   "healthy",
			change: func(*observation) {},
			want: map[corev1.NodeConditionType]brief{
				corev1.NodeReady:              {"True", "KubeletReady", "cairn-agent is posting ready status"},
				corev1.NodeMemoryPressure:     {"False", "KubeletHasSufficientMemory", ""},
				corev1.NodeDiskPressure:       {"False", "KubeletHasNoDiskPressure", ""},
				corev1.NodePIDPressure:        {"False", "KubeletHasSufficientPID", ""},
				corev1.NodeNetworkUnavailable: {"False", "NetworkReady", ""},
			},
		},
		{
			name:   "runtime not ready",
			change: func(o *observation) { o.runtimeReady, o.runtimeReason = false, "containerd is starting" },
			want: map[corev1.NodeConditionType]brief{
				corev1.NodeReady: {"False", "RuntimeNotReady", "container runtime not ready: containerd is starting"},
			},
		},
		{
			name:   "network not ready",
			change: func(o *observation) { o.networkReady, o.runtimeReason = false, "no CNI config" },
			want: map[corev1.NodeConditionType]brief{
				corev1.NodeReady:              {"False", "NetworkNotReady", "container runtime network not ready: no CNI config"},
				corev1.NodeNetworkUnavailable: {"True", "NetworkPluginNotReady", "pod network not ready: no CNI config"},
			},
		},
		{
			name:   "routes to other nodes not in",
			change: func(o *observation) { o.routesReady, o.routesWhy = false, "routes not programmed yet" },
			want: map[corev1.NodeConditionType]brief{
				corev1.NodeReady:              {"True", "KubeletReady", ""},
				corev1.NodeNetworkUnavailable: {"True", "NoRouteCreated", "routes not programmed yet"},
			},
		},
		{
			name: "runtime unreachable",
			change: func(o *observation) {
				o.runtimeErr = errors.New("dial unix /run/containerd/containerd.sock: no such file")
			},
			want: map[corev1.NodeConditionType]brief{
				corev1.NodeReady:              {"False", "RuntimeStatusUnknown", "cannot get the container runtime's status: dial unix"},
				corev1.NodeNetworkUnavailable: {"Unknown", "RuntimeStatusUnknown", "cannot get"},
			},
		},
		{
			name:   "memory below 100 MiB",
			change: func(o *observation) { o.memory.Available = 99 << 20 },
			want: map[corev1.NodeConditionType]brief{
				corev1.NodeMemoryPressure: {"True", "KubeletHasInsufficientMemory", "available memory is below 100 MiB"},
			},
		},
		{
			name:   "memory at 100 MiB",
			change: func(o *observation) { o.memory.Available = 100 << 20 },
			want: map[corev1.NodeConditionType]brief{
				corev1.NodeMemoryPressure: {"False", "KubeletHasSufficientMemory", ""},
			},
		},
		{
			name:   "disk below 10 %",
			change: func(o *observation) { o.disk.Free = 9 << 30 },
			want: map[corev1.NodeConditionType]brief{
				corev1.NodeDiskPressure: {"True", "KubeletHasDiskPressure", "free space"},
			},
		},
		{
			name:   "inodes below 5 %",
			change: func(o *observation) { o.disk.InodesFree = 49 },
			want: map[corev1.NodeConditionType]brief{
				corev1.NodeDiskPressure: {"True", "KubeletHasDiskPressure", "free inodes"},
			},
		},
		{
			name:   "images' filesystem below 15 %",
			change: func(o *observation) { o.imagefs = host.Filesystem{Size: 100 << 30, Free: 14 << 30} },
			want: map[corev1.NodeConditionType]brief{
				corev1.NodeDiskPressure: {"True", "KubeletHasDiskPressure", "free space of the images' filesystem is below 15 %"},
			},
		},
		{
			name: "images' filesystem not known",
			change: func(o *observation) {
				o.imagefs, o.imagefsErr = host.Filesystem{Size: 100 << 30}, errors.New("no runtime")
			},
			want: map[corev1.NodeConditionType]brief{
				corev1.NodeDiskPressure: {"False", "KubeletHasNoDiskPressure", ""},
			},
		},
		{
			name:   "pids nearly exhausted",
			change: func(o *observation) { o.pids.Used = 32768 - 3000 },
			want: map[corev1.NodeConditionType]brief{
				corev1.NodePIDPressure: {"True", "KubeletHasInsufficientPID", ""},
			},
		},
		{
			name: "nothing measured",
			change: func(o *observation) {
				err := errors.New("no /proc")
				o.memoryErr, o.diskErr, o.pidsErr = err, err, err
			},
			want: map[corev1.NodeConditionType]brief{
				corev1.NodeMemoryPressure: {"Unknown", "MemoryNotMeasured", "no /proc"},
				corev1.NodeDiskPressure:   {"Unknown", "DiskNotMeasured", "no /proc"},
				corev1.NodePIDPressure:    {"Unknown", "PIDsNotMeasured", "no /proc"},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := healthy()
			tt.change(&o)
			cs := conditions(nil, &o, metav1.Now())
			if len(cs) != len(ourConditions) {
				t.Fatalf("conditions() gave %d conditions, want %d", len(cs), len(ourConditions))
			}
			for typ, want := range tt.want {
				c := findCondition(cs, typ)
				got := brief{c.Status, c.Reason, c.Message[:min(len(want.Prefix), len(c.Message))]}
				if got != want {
					t.Errorf("%s = %+v (message %q), want %+v", typ, got, c.Message, want)
				}
			}
		})
	}
}

func TestConditionTimes(t *testing.T) {
	t0 := metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	t1 := metav1.NewTime(t0.Add(10 * time.Second))
	o := healthy()
	others := corev1.NodeCondition{Type: "example.com/Custom", Status: "True", LastHeartbeatTime: t0, LastTransitionTime: t0}
	first := append(conditions(nil, &o, t0), others)

	o.networkReady = false
	second := conditions(first, &o, t1)
	times := map[corev1.NodeConditionType][2]metav1.Time{} // heartbeat, transition
	for _, c := range second {
		times[c.Type] = [2]metav1.Time{c.LastHeartbeatTime, c.LastTransitionTime}
	}
	want := map[corev1.NodeConditionType][2]metav1.Time{
		corev1.NodeReady:              {t1, t1}, // True → False
		corev1.NodeNetworkUnavailable: {t1, t1}, // False → True
		corev1.NodeMemoryPressure:     {t1, t0},
		corev1.NodeDiskPressure:       {t1, t0},
		corev1.NodePIDPressure:        {t1, t0},
		"example.com/Custom":          {t0, t0}, // someone else's, kept as it is
	}
	if diff := cmp.Diff(want, times); diff != "" {
		t.Errorf("condition times (heartbeat, transition) mismatch (-want +got):\n%s", diff)
	}
}

func TestSameStatus(t *testing.T) {
	t0, t1 := metav1.NewTime(time.Unix(1000, 0)), metav1.NewTime(time.Unix(1010, 0))
	o := healthy()
	status := func(now metav1.Time, cpus int) corev1.NodeStatus {
		c := capacity(cpus, &o.memory, &o.disk)
		return corev1.NodeStatus{Capacity: c, Allocatable: allocatable(c, DefaultThresholds), Conditions: conditions(nil, &o, now)}
	}
	a, b := status(t0, 2), status(t0, 2)
	for i := range b.Conditions {
		b.Conditions[i].LastHeartbeatTime = t1
	}
	if !sameStatus(&a, &b) {
		t.Errorf("sameStatus() = false for statuses that differ in heartbeats only")
	}
	// A quantity as the API server returns it, parsed from its string.
	b.Capacity[corev1.ResourceMemory] = resource.MustParse(b.Capacity.Memory().String())
	if !sameStatus(&a, &b) {
		t.Errorf("sameStatus() = false for a quantity in another form")
	}
	if c := status(t0, 4); sameStatus(&a, &c) {
		t.Errorf("sameStatus() = true for another cpu capacity")
	}
	c := status(t0, 2)
	c.Conditions[0].Reason = "Other"
	if sameStatus(&a, &c) {
		t.Errorf("sameStatus() = true for another reason")
	}
	d := status(t0, 2)
	d.DaemonEndpoints.KubeletEndpoint.Port = 10250
	if sameStatus(&a, &d) {
		t.Errorf("sameStatus() = true for another kubelet port")
	}
}
