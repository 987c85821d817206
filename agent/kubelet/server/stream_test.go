package server

import (
	"net/url"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseStreamOptions(t *testing.T) {
	for _, tc := range []struct {
		name    string
		query   string
		exec    bool
		want    streamOptions
		wantErr bool
	}{
		{"as the API server sends exec", "command=ls&command=-l&input=1&output=1&error=1", true,
			streamOptions{command: []string{"ls", "-l"}, stdin: true, stdout: true, stderr: true}, false},
		{"a terminal has no stderr", "command=sh&input=1&output=1&error=1&tty=1", true,
			streamOptions{command: []string{"sh"}, stdin: true, stdout: true, tty: true}, false},
		{"attach needs no command", "output=true", false, streamOptions{stdout: true}, false},
		{"exec needs a command", "output=1", true, streamOptions{stdout: true}, true},
		{"something to stream", "command=true", true, streamOptions{command: []string{"true"}}, true},
		{"not a boolean", "command=true&output=yes", true, streamOptions{command: []string{"true"}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q, err := url.ParseQuery(tc.query)
			if err != nil {
				t.Fatal(err)
			}
			got, err := parseStreamOptions(q, tc.exec)
			if (err != nil) != tc.wantErr {
				t.Errorf("parseStreamOptions(%q) error = %v, want an error: %v", tc.query, err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(streamOptions{})); diff != "" {
				t.Errorf("parseStreamOptions(%q) (-want +got):\n%s", tc.query, diff)
			}
		})
	}
}

func TestParsePorts(t *testing.T) {
	for _, tc := range []struct {
		query   string
		want    []int32
		wantErr bool
	}{
		{"", nil, false},
		{"port=80&port=8080", []int32{80, 8080}, false},
		{"port=0", nil, true},
		{"port=65536", nil, true},
		{"port=http", nil, true},
	} {
		q, err := url.ParseQuery(tc.query)
		if err != nil {
			t.Fatal(err)
		}
		got, err := parsePorts(q)
		if (err != nil) != tc.wantErr || !cmp.Equal(got, tc.want) {
			t.Errorf("parsePorts(%q) = %v, %v; want %v, an error: %v", tc.query, got, err, tc.want, tc.wantErr)
		}
	}
}
