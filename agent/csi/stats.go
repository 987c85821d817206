package csi

import (
	"context"
	"os"
	"path/filepath"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
)

// VolumeStats asks the drivers of the pod uid's CSI volumes what each
// holds (NodeGetVolumeStats), for the drivers that tell
// (GET_VOLUME_STATS), in the kubelet's Summary form: by the pod's name of
// the volume, with its claim. A volume whose driver is away or fails is
// left out, and the call counted in csi_operations_seconds.
func (p *Plugins) VolumeStats(ctx context.Context, uid types.UID) []statsv1alpha1.VolumeStats {
	root := p.root(uid, false) // file systems: a block device has no use to tell
	ents, err := os.ReadDir(root)
	if err != nil {
		return nil
	}
	var out []statsv1alpha1.VolumeStats
	for _, e := range ents {
		dir := filepath.Join(root, e.Name())
		data, err := readVolData(dir)
		if err != nil || data.Volume == "" {
			continue
		}
		d, err := p.driver(data.Driver)
		if err != nil || !d.stats {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		start := time.Now()
		resp, err := d.node.NodeGetVolumeStats(cctx, &csipb.NodeGetVolumeStatsRequest{
			VolumeId: data.Handle, VolumePath: target(dir, false), StagingTargetPath: data.StagingPath,
		})
		cancel()
		p.observe(d.name, "NodeGetVolumeStats", start, err)
		if err != nil {
			p.log.Warn("volume stats", "driver", d.name, "volume", data.Handle, "err", err)
			continue
		}
		vs := statsv1alpha1.VolumeStats{Name: data.Volume, FsStats: statsv1alpha1.FsStats{Time: metav1.NewTime(start)}}
		if data.Claim != "" {
			vs.PVCRef = &statsv1alpha1.PVCReference{Name: data.Claim, Namespace: data.ClaimNamespace}
		}
		for _, u := range resp.Usage {
			avail, total, used := uint64(u.Available), uint64(u.Total), uint64(u.Used)
			switch u.Unit {
			case csipb.VolumeUsage_BYTES:
				vs.AvailableBytes, vs.CapacityBytes, vs.UsedBytes = &avail, &total, &used
			case csipb.VolumeUsage_INODES:
				vs.InodesFree, vs.Inodes, vs.InodesUsed = &avail, &total, &used
			}
		}
		out = append(out, vs)
	}
	return out
}
