package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/cairn-os/cairn/agent/drain"
	"github.com/cairn-os/cairn/api/machine"
	"github.com/cairn-os/cairn/machineconfig"
)

// restartInit is init's stand-in for service restarts: containerd
// restarts, any other service is unknown.
type restartInit struct{ recordingInit }

func (*restartInit) ServiceRestart(_ context.Context, req *machine.ServiceRestartRequest, _ ...grpc.CallOption) (*machine.ServiceRestartResponse, error) {
	if req.Name != "containerd" {
		return nil, status.Errorf(codes.NotFound, "no service %q", req.Name)
	}
	return &machine.ServiceRestartResponse{}, nil
}

// syncBuffer is a log destination the server's goroutines share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// auditLines are the "audit" groups of the JSON records logged so far.
func (s *syncBuffer) auditLines(t *testing.T) []map[string]any {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(s.b.String()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if a, ok := rec["audit"].(map[string]any); ok {
			out = append(out, a)
		}
	}
	return out
}

// captureLog sends the default logger, which the agent logs to, to a
// buffer for the test.
func captureLog(t *testing.T) *syncBuffer {
	buf := &syncBuffer{}
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewJSONHandler(buf, nil)))
	t.Cleanup(func() { slog.SetDefault(old) })
	return buf
}

// TestAudit calls the real server as each role: what changes the node is
// audited, in the agent's log and in Audit's answer, refused or not; what
// only reads (Version, PodLogs) is not.
func TestAudit(t *testing.T) {
	logs := captureLog(t)
	b, endpoint := serve(t, &restartInit{}, t.TempDir())
	ctx := context.Background()
	operator := clientWithRole(t, b, endpoint, machineconfig.RoleOperator)
	reader := clientWithRole(t, b, endpoint, machineconfig.RoleReader)

	if _, err := operator.ServiceRestart(ctx, &machine.ServiceRestartRequest{Name: "containerd"}); err != nil {
		t.Fatalf("operator's ServiceRestart(containerd) = %v", err)
	}
	if _, err := operator.ServiceRestart(ctx, &machine.ServiceRestartRequest{Name: "nope"}); status.Code(err) != codes.NotFound {
		t.Fatalf("operator's ServiceRestart(nope) = %v, want NotFound", err)
	}
	if _, err := reader.Reboot(ctx, &machine.RebootRequest{}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("reader's Reboot() = %v, want PermissionDenied", err)
	}
	if _, err := reader.Version(ctx, &machine.VersionRequest{}); err != nil {
		t.Fatalf("reader's Version() = %v", err)
	}
	// A reader's stream is not audited, even when it fails.
	if s, err := reader.PodLogs(ctx, &machine.PodLogsRequest{Namespace: "default", Pod: "none"}); err != nil {
		t.Fatalf("reader's PodLogs() = %v", err)
	} else if _, err := s.Recv(); status.Code(err) != codes.NotFound {
		t.Fatalf("reader's PodLogs() of no pod = %v, want NotFound", err)
	}
	if _, err := reader.Audit(ctx, &machine.AuditRequest{}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("reader's Audit() = %v, want PermissionDenied (an operator's call)", err)
	}

	resp, err := operator.Audit(ctx, &machine.AuditRequest{})
	if err != nil {
		t.Fatalf("operator's Audit() = %v", err)
	}
	type rec struct{ Caller, Role, Method, Request, Code string }
	want := []rec{
		{"test-operator", "operator", "ServiceRestart", "name=containerd", "OK"},
		{"test-operator", "operator", "ServiceRestart", "name=nope", "NotFound"},
		{"test-reader", "reader", "Reboot", "", "PermissionDenied"},
		{"test-reader", "reader", "Audit", "", "PermissionDenied"},
	}
	var got []rec
	for _, r := range resp.Records {
		var req []string
		for k, v := range r.Request {
			req = append(req, k+"="+v)
		}
		got = append(got, rec{r.Caller, r.Role, r.Method, strings.Join(req, ","), r.Code})
		if r.Time == nil || r.Duration == nil || !strings.HasPrefix(r.Peer, "127.0.0.1:") {
			t.Errorf("record %v: want its time, duration and the caller's address", r)
		}
		if (r.Code == "OK") != (r.Error == "") {
			t.Errorf("record %v: want an error message exactly when the call failed", r)
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Audit() records (-want +got):\n%s", diff)
	}

	// The log has the same records, and the operator's Audit call last
	// (it is no reader call either); Version appears in neither.
	var logged []rec
	for _, a := range logs.auditLines(t) {
		var req []string
		if r, ok := a["request"].(map[string]any); ok {
			for k, v := range r {
				req = append(req, fmt.Sprintf("%s=%v", k, v))
			}
		}
		logged = append(logged, rec{fmt.Sprint(a["caller"]), fmt.Sprint(a["role"]), fmt.Sprint(a["method"]), strings.Join(req, ","), fmt.Sprint(a["code"])})
	}
	want = append(want, rec{"test-operator", "operator", "Audit", "", "OK"})
	if diff := cmp.Diff(want, logged); diff != "" {
		t.Errorf("audit records in the agent's log (-want +got):\n%s", diff)
	}
}

func TestAuditRing(t *testing.T) {
	a := newAuditLog(slog.New(slog.DiscardHandler), 3)
	for i := range 5 {
		a.add(&machine.AuditRecord{Method: fmt.Sprint(i)})
	}
	methods := func(rs []*machine.AuditRecord) []string {
		var out []string
		for _, r := range rs {
			out = append(out, r.Method)
		}
		return out
	}
	for _, tt := range []struct {
		n    int
		want []string
	}{
		{0, []string{"2", "3", "4"}},
		{2, []string{"3", "4"}},
		{10, []string{"2", "3", "4"}},
	} {
		if got := methods(a.latest(tt.n)); !cmp.Equal(got, tt.want) {
			t.Errorf("latest(%d) after 5 records in a ring of 3 = %v, want %v", tt.n, got, tt.want)
		}
	}
}

func TestRequestFields(t *testing.T) {
	for _, tt := range []struct {
		req  any
		want map[string]string
	}{
		{&machine.ServiceKillRequest{Name: "containerd", Signal: 15}, map[string]string{"name": "containerd", "signal": "15"}},
		{&machine.RebootRequest{}, nil},
		{&machine.LogsChunk{Data: []byte("secret")}, nil},
		{&machine.AuditResponse{Records: []*machine.AuditRecord{{Caller: "x"}}}, nil},
		{&machine.ServiceRestartRequest{Name: "a" + strings.Repeat("é", 200)}, map[string]string{"name": "a" + strings.Repeat("é", 127) + "…"}}, // cut at a rune
		{nil, nil},
	} {
		if got := requestFields(tt.req); !cmp.Equal(got, tt.want) {
			t.Errorf("requestFields(%v) = %v, want %v", tt.req, got, tt.want)
		}
	}
}

// TestAuditStream calls a client-streaming method (none of the API's is
// yet: an upload would be) on the real server: the request recorded is the
// first message, and a refused stream is audited without one.
func TestAuditStream(t *testing.T) {
	logs := captureLog(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	endpoint := l.Addr().String()
	b, err := machineconfig.Generate(machineconfig.GenerateOptions{Hostname: "unit", Endpoints: []string{endpoint}, Now: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	creds, err := NewCredentials(&b.Config.Machine.API)
	srv := NewServer(creds, &recordingInit{}, drain.New(filepath.Join(t.TempDir(), "drain.json"), slog.Default()), "")
	if err != nil {
		t.Fatal(err)
	}
	srv.RegisterService(&grpc.ServiceDesc{
		ServiceName: "cairn.test.Uploads",
		HandlerType: (*any)(nil),
		Streams: []grpc.StreamDesc{{StreamName: "Upload", ClientStreams: true, Handler: func(_ any, s grpc.ServerStream) error {
			for {
				if err := s.RecvMsg(&machine.ServiceKillRequest{}); err == io.EOF {
					return s.SendMsg(&machine.ServiceKillResponse{})
				} else if err != nil {
					return err
				}
			}
		}}},
	}, struct{}{})
	go srv.Serve(l)
	t.Cleanup(srv.Stop)

	upload := func(role string) error {
		cert, key, err := b.CA.IssueClient("test-"+role, role, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		cc := *b.Client
		cc.Cert, cc.Key = string(cert), string(key)
		tlsCfg, err := cc.TLSConfig("127.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		conn, err := grpc.NewClient(endpoint, grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		s, err := conn.NewStream(context.Background(), &grpc.StreamDesc{ClientStreams: true}, "/cairn.test.Uploads/Upload")
		if err != nil {
			return err
		}
		for _, name := range []string{"first", "second"} {
			if err := s.SendMsg(&machine.ServiceKillRequest{Name: name, Signal: 3}); err != nil && err != io.EOF {
				return err
			}
		}
		if err := s.CloseSend(); err != nil {
			return err
		}
		return s.RecvMsg(&machine.ServiceKillResponse{})
	}
	if err := upload(machineconfig.RoleAdmin); err != nil {
		t.Fatalf("admin's Upload = %v", err)
	}
	if err := upload(machineconfig.RoleOperator); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("operator's Upload = %v, want PermissionDenied (an unlisted method is an admin's)", err)
	}

	var got []string
	for _, a := range logs.auditLines(t) {
		got = append(got, fmt.Sprintf("%v %v %v %v", a["caller"], a["method"], a["request"], a["code"]))
	}
	want := []string{
		"test-admin Upload map[name:first signal:3] OK",
		"test-operator Upload <nil> PermissionDenied",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("audit records of a streaming call in the agent's log (-want +got):\n%s", diff)
	}
}
