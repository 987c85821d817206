package api

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/cairn-os/cairn/api/machine"
	"github.com/cairn-os/cairn/internal/broker"
	"github.com/cairn-os/cairn/machineconfig"
)

// auditRingSize is how many audit records the agent keeps for Audit; the
// agent's log keeps them all.
const auditRingSize = 1024

// auditValueMax bounds each request field in a record: a name or a
// number, not a payload.
const auditValueMax = 256

// audited says whether calls to method are audited: every one but the
// reader calls, so a method added later is audited unless it is made a
// reader's.
func audited(method string) bool {
	return minRole[method] != machineconfig.RoleReader
}

// auditLog records the calls that are audited, to its logger under the
// key "audit" and into a ring of the latest ones.
type auditLog struct {
	log *slog.Logger

	mu      sync.Mutex
	size    int
	records []*machine.AuditRecord // a ring once full: next is the oldest
	next    int
	// added gets each record as it is added, for Events.
	added broker.Broker[*machine.AuditRecord]
}

func newAuditLog(log *slog.Logger, size int) *auditLog {
	return &auditLog{log: log, size: size}
}

// unary is the interceptor of unary calls. It runs before authorization,
// so that refused calls are audited too.
func (a *auditLog) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	method := methodName(info.FullMethod)
	if !audited(method) {
		return h(ctx, req)
	}
	start := time.Now()
	resp, err := h(ctx, req)
	a.record(ctx, method, req, start, err)
	return resp, err
}

// stream is the interceptor of streaming calls; the request recorded is
// the first message the handler received, none when it was refused before.
func (a *auditLog) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	method := methodName(info.FullMethod)
	if !audited(method) {
		return h(srv, ss)
	}
	start := time.Now()
	rs := &firstRecv{ServerStream: ss}
	err := h(srv, rs)
	a.record(ss.Context(), method, rs.first, start, err)
	return err
}

// firstRecv keeps the first message a stream's handler receives.
type firstRecv struct {
	grpc.ServerStream
	first any
}

func (f *firstRecv) RecvMsg(m any) error {
	err := f.ServerStream.RecvMsg(m)
	if err == nil && f.first == nil {
		f.first = m
	}
	return err
}

func (a *auditLog) record(ctx context.Context, method string, req any, start time.Time, err error) {
	r := &machine.AuditRecord{
		Time:     timestamppb.New(start),
		Method:   method,
		Request:  requestFields(req),
		Duration: durationpb.New(time.Since(start)),
	}
	if cert, err := clientCert(ctx); err == nil {
		r.Caller = cert.Subject.CommonName
		r.Role, _ = machineconfig.RoleFromCert(cert)
	}
	if p, ok := peer.FromContext(ctx); ok {
		r.Peer = p.Addr.String()
	}
	st := status.Convert(err)
	r.Code = st.Code().String()
	if err != nil {
		r.Error = st.Message()
	}
	a.add(r)

	level := slog.LevelInfo
	if st.Code() != codes.OK {
		level = slog.LevelWarn
	}
	var reqAttrs []any
	for _, k := range slices.Sorted(maps.Keys(r.Request)) {
		reqAttrs = append(reqAttrs, slog.String(k, r.Request[k]))
	}
	attrs := []any{"caller", r.Caller, "role", r.Role, "peer", r.Peer, "method", method,
		slog.Group("request", reqAttrs...), "code", r.Code, "duration", r.Duration.AsDuration()}
	if r.Error != "" {
		attrs = append(attrs, "error", r.Error)
	}
	a.log.LogAttrs(ctx, level, "API call", slog.Group("audit", attrs...))
}

// requestFields are the request's set scalar fields, as text. Bytes and
// messages, where a config, an image or a secret travels, are left out:
// a request field that holds a secret must be one of those.
func requestFields(req any) map[string]string {
	m, ok := req.(proto.Message)
	if !ok {
		return nil
	}
	out := map[string]string{}
	m.ProtoReflect().Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if fd.IsList() || fd.IsMap() {
			return true
		}
		var s string
		switch fd.Kind() {
		case protoreflect.BytesKind, protoreflect.MessageKind, protoreflect.GroupKind:
			return true
		case protoreflect.EnumKind:
			s = fmt.Sprint(v.Enum())
			if ev := fd.Enum().Values().ByNumber(v.Enum()); ev != nil {
				s = string(ev.Name())
			}
		default:
			s = fmt.Sprint(v.Interface())
		}
		if len(s) > auditValueMax {
			s = strings.ToValidUTF8(s[:auditValueMax], "") + "…" // not a rune cut in two
		}
		out[string(fd.Name())] = s
		return true
	})
	if len(out) == 0 {
		return nil
	}
	return out
}

func (a *auditLog) add(r *machine.AuditRecord) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.added.Publish(r)
	if len(a.records) < a.size {
		a.records = append(a.records, r)
		return
	}
	a.records[a.next] = r
	a.next = (a.next + 1) % a.size
}

// latest returns the last n records kept (all for n <= 0), oldest first.
func (a *auditLog) latest(n int) []*machine.AuditRecord {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.latestLocked(n)
}

// follow returns the last n records kept and, from then on without a gap,
// each new one until cancel.
func (a *auditLog) follow(n int) ([]*machine.AuditRecord, <-chan *machine.AuditRecord, func()) {
	a.mu.Lock()
	defer a.mu.Unlock()
	ch, cancel := a.added.Subscribe(a.log)
	return a.latestLocked(n), ch, cancel
}

func (a *auditLog) latestLocked(n int) []*machine.AuditRecord {
	out := append(slices.Clone(a.records[a.next:]), a.records[:a.next]...)
	if n > 0 && n < len(out) {
		out = out[len(out)-n:]
	}
	return out
}

// Audit returns the latest audit records the agent keeps.
func (s *machineServer) Audit(_ context.Context, req *machine.AuditRequest) (*machine.AuditResponse, error) {
	return &machine.AuditResponse{Records: s.audit.latest(int(req.Limit))}, nil
}
