//go:build bench

package bench

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/cairn-os/cairn/test/agentnode"
	"github.com/cairn-os/cairn/test/kube"
	"github.com/cairn-os/cairn/test/runtime"
)

// startCairnAgent starts cairn-agent, the binary built from ./agent, as
// Node node with its state in dir (see agentnode.New), its kubelet server
// on a free port: the upstream kubelet beside it may hold 10250.
func startCairnAgent(b *testing.B, c *kube.Cluster, rt *runtime.Runtime, bin, cniBin, dir, node string) *proc {
	b.Helper()
	a := agentnode.New(b, c, rt, agentnode.Options{Name: node, Bin: bin, Dir: dir, CNIBin: cniBin})
	p := startProc(b, "cairn-agent", a.Log, a.Cmd, func() {
		var errs []error
		if err := removeSandboxes(context.Background(), rt); err != nil {
			errs = append(errs, err)
		}
		if err := a.Cleanup(); err != nil {
			errs = append(errs, err)
		}
		if err := errors.Join(errs...); err != nil {
			b.Errorf("after cairn-agent: %v", err)
		}
	})
	p.ready = a.Ready
	p.summary = func(ctx context.Context) (string, error) {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		m, err := a.Metrics(ctx)
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("its metrics (scraped over mTLS): pods started %.0f, Lease renewals %.0f, proxier syncs %.0f full + %.0f partial, %.0f rules",
			m["cairn_kubelet_pod_start_duration_seconds_count"], m[`cairn_kubelet_lease_renewals_total{result="success"}`],
			m[`cairn_proxy_sync_duration_seconds_count{kind="full"}`], m[`cairn_proxy_sync_duration_seconds_count{kind="partial"}`],
			m["cairn_proxy_rules"]), nil
	}
	return p
}
