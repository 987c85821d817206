package handler

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// TestHTTPRedirects runs httpGet actions against a real HTTP server on
// 127.0.0.1 that redirects, and wants the kubelet's rules: a redirect to
// the same host followed (its target's status is the verdict), one to
// another host (localhost) not followed and a success with a warning that
// quotes the response's body, a loop stopped after 10 redirects.
func TestHTTPRedirects(t *testing.T) {
	var otherHits atomic.Int32
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		otherHits.Add(1)
		w.WriteHeader(http.StatusInternalServerError)
	}))
	defer other.Close()
	otherURL := "http://localhost:" + strconv.Itoa(other.Listener.Addr().(*net.TCPAddr).Port) + "/"
	var loops atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/to-ok":
			http.Redirect(w, r, "/ok", http.StatusFound)
		case "/to-bad":
			http.Redirect(w, r, "/bad", http.StatusMovedPermanently)
		case "/to-other":
			http.Redirect(w, r, otherURL, http.StatusFound)
		case "/loop":
			loops.Add(1)
			http.Redirect(w, r, "/loop", http.StatusFound)
		case "/bad":
			w.WriteHeader(http.StatusInternalServerError)
		case "/big":
			fmt.Fprint(w, strings.Repeat("x", 1<<20))
		}
	}))
	defer srv.Close()
	port := srv.Listener.Addr().(*net.TCPAddr).Port

	for _, tc := range []struct {
		path    string
		ok      bool
		errHas  string // in the error, if not ok
		warning string // what Warn is told, if anything
	}{
		{path: "/to-ok", ok: true},
		{path: "/to-bad", errHas: "500"},
		{path: "/to-other", ok: true, warning: "Probe terminated redirects, Response body: <a href=\"" + otherURL + "\">Found</a>."},
		{path: "/loop", errHas: "stopped after 10 redirects"},
		{path: "/big", ok: true},
	} {
		t.Run(tc.path, func(t *testing.T) {
			var warnings []string
			target := Target{Host: "127.0.0.1", Warn: func(msg string) { warnings = append(warnings, msg) }}
			a := Action{HTTPGet: &corev1.HTTPGetAction{Path: tc.path, Port: intstr.FromInt(port)}}
			err := Run(context.Background(), nil, a, 0, target)
			if tc.ok != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.errHas) {
				t.Errorf("Run(%s) = %v, want ok %v (error with %q)", tc.path, err, tc.ok, tc.errHas)
			}
			switch {
			case tc.warning == "" && len(warnings) > 0:
				t.Errorf("Run(%s) warned %q, want no warning", tc.path, warnings)
			case tc.warning != "" && (len(warnings) != 1 || strings.TrimSpace(warnings[0]) != tc.warning):
				t.Errorf("Run(%s) warned %q, want %q", tc.path, warnings, tc.warning)
			}
		})
	}
	if n := otherHits.Load(); n != 0 {
		t.Errorf("the other host got %d requests, want none: its redirect is not followed", n)
	}
	if n := loops.Load(); n != 10 {
		t.Errorf("the loop was asked %d times, want 10: the first request and 9 redirects, the 10th refused", n)
	}
}
