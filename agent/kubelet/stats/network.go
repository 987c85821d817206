package stats

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/procfs"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
)

// podInterface is the pods' own interface, which the CNI names.
const podInterface = "eth0"

// sandboxNetwork reads a pod's interfaces in its network namespace,
// through the sandbox's process, which containerd's verbose status names;
// nil if it cannot (a host-network pod has the node's).
func (p *Provider) sandboxNetwork(ctx context.Context, id string) *statsv1alpha1.NetworkStats {
	pid, err := p.sandboxPid(ctx, id)
	if err != nil {
		p.cfg.Log.Debug("stats: no pod network", "sandbox", id, "err", err)
		return nil
	}
	pr, err := procfs.NewProc(pid)
	var dev procfs.NetDev
	if err == nil {
		dev, err = pr.NetDev()
	}
	if err != nil {
		p.cfg.Log.Debug("stats: no pod network", "sandbox", id, "err", err)
		return nil
	}
	return interfaces(dev, time.Now(), podInterface)
}

func (p *Provider) sandboxPid(ctx context.Context, id string) (int, error) {
	st, err := p.cfg.Runtime.PodSandboxStatus(ctx, &criv1.PodSandboxStatusRequest{PodSandboxId: id, Verbose: true})
	if err != nil {
		return 0, fmt.Errorf("CRI PodSandboxStatus: %w", err)
	}
	if st.GetStatus().GetLinux().GetNamespaces().GetOptions().GetNetwork() == criv1.NamespaceMode_NODE {
		return 0, fmt.Errorf("sandbox %s is in the node's network", id)
	}
	var info struct {
		Pid int `json:"pid"`
	}
	if err := json.Unmarshal([]byte(st.Info["info"]), &info); err != nil || info.Pid == 0 {
		return 0, fmt.Errorf("sandbox %s: no pid in the runtime's verbose status", id)
	}
	return info.Pid, nil
}

// interfaces lists dev but loopback, and the pods' veths on the host;
// def, if listed, is the top-level interface, else the first listed.
func interfaces(dev procfs.NetDev, now time.Time, def string) *statsv1alpha1.NetworkStats {
	n := &statsv1alpha1.NetworkStats{Time: metav1.NewTime(now)}
	for _, name := range slices.Sorted(maps.Keys(dev)) {
		if name == "lo" || strings.HasPrefix(name, "veth") {
			continue
		}
		d := dev[name]
		i := statsv1alpha1.InterfaceStats{Name: name, RxBytes: &d.RxBytes, RxErrors: &d.RxErrors,
			TxBytes: &d.TxBytes, TxErrors: &d.TxErrors}
		n.Interfaces = append(n.Interfaces, i)
		if name == def || n.Name == "" {
			n.InterfaceStats = i
		}
	}
	return n
}
