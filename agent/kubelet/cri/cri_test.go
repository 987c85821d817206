package cri

import (
	"testing"

	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func TestReady(t *testing.T) {
	cond := func(typ string, ok bool, reason, msg string) *criv1.RuntimeCondition {
		return &criv1.RuntimeCondition{Type: typ, Status: ok, Reason: reason, Message: msg}
	}
	for _, tc := range []struct {
		name          string
		st            *criv1.RuntimeStatus
		rt, net, fail bool
		reason        string
	}{
		{name: "nil", st: nil, fail: true},
		{name: "both ready", st: &criv1.RuntimeStatus{Conditions: []*criv1.RuntimeCondition{
			cond(criv1.RuntimeReady, true, "", ""), cond(criv1.NetworkReady, true, "", ""), cond("Other", false, "x", "y"),
		}}, rt: true, net: true},
		{name: "no network", st: &criv1.RuntimeStatus{Conditions: []*criv1.RuntimeCondition{
			cond(criv1.RuntimeReady, true, "", ""), cond(criv1.NetworkReady, false, "NetworkPluginNotReady", "cni config uninitialized"),
		}}, rt: true, reason: "NetworkReady=false reason:NetworkPluginNotReady message:cni config uninitialized"},
		{name: "nothing reported", st: &criv1.RuntimeStatus{}, reason: "RuntimeReady not reported; NetworkReady not reported"},
	} {
		rt, net, reason, err := Ready(tc.st)
		if rt != tc.rt || net != tc.net || reason != tc.reason || (err != nil) != tc.fail {
			t.Errorf("%s: Ready() = %v, %v, %q, %v; want %v, %v, %q, error %v", tc.name, rt, net, reason, err, tc.rt, tc.net, tc.reason, tc.fail)
		}
	}
}
