package server

import (
	"net/http"
	"slices"
	"testing"
)

func TestSubresources(t *testing.T) {
	for _, tt := range []struct {
		path string
		want []string
	}{
		{"/healthz", []string{"healthz", "proxy"}},
		{"/pods", []string{"pods", "proxy"}},
		{"/podsx", []string{"proxy"}},
		{"/stats/summary", []string{"stats"}},
		{"/metrics/resource", []string{"metrics"}},
		{"/logs/messages", []string{"log"}},
		{"/containerLogs/default/web/app", []string{"proxy"}},
		{"/exec/default/web/app", []string{"proxy"}},
	} {
		if got := subresources(tt.path); !slices.Equal(got, tt.want) {
			t.Errorf("subresources(%q) = %v, want %v", tt.path, got, tt.want)
		}
	}
}

func TestVerbOf(t *testing.T) {
	for method, want := range map[string]string{
		http.MethodGet: "get", http.MethodHead: "get", http.MethodPost: "create",
		http.MethodPut: "update", http.MethodPatch: "patch", http.MethodDelete: "delete",
	} {
		if got := verbOf(method); got != want {
			t.Errorf("verbOf(%s) = %q, want %q", method, got, want)
		}
	}
}
