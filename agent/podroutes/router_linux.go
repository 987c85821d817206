package podroutes

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/cairn-os/cairn/internal/backoff"
	"github.com/cairn-os/cairn/machineconfig"
)

// resyncPeriod is how often the routes are programmed again with no
// change to the Nodes, to put back what someone else removed.
const resyncPeriod = 30 * time.Second

// EventSource is the component the Router's Events come from.
const EventSource = "cairn-pod-routes"

// Reasons of the Router's Events, on the Node that is not routed.
const (
	ReasonRefused = "PodRoutesRefused"
)

// Config configures a Router.
type Config struct {
	// NodeName is this node's Node.
	NodeName string
	// Mode is a machineconfig.PodNetwork mode; empty is auto.
	Mode string
	// ServiceCIDRs are the cluster's Service ranges, if known: no pod
	// CIDR may overlap them.
	ServiceCIDRs []netip.Prefix
	// Netlink is the handle of the network namespace to program; nil is
	// the agent's own.
	Netlink *netlink.Handle
	Logger  *slog.Logger
}

// Router keeps the routes to the other nodes' pod CIDRs.
type Router struct {
	cfg Config
	k   kernel
	log *slog.Logger

	mu      sync.Mutex
	synced  bool   // the last sync programmed every route
	status  string // why not, or what was programmed
	refused map[string]string
}

// New returns a Router of cfg.
func New(cfg Config) (*Router, error) {
	switch cfg.Mode {
	case "":
		cfg.Mode = machineconfig.PodNetworkAuto
	case machineconfig.PodNetworkAuto, machineconfig.PodNetworkHostGW, machineconfig.PodNetworkVXLAN:
	default:
		return nil, fmt.Errorf("pod network mode %q is not one of auto, host-gw, vxlan", cfg.Mode)
	}
	h := cfg.Netlink
	if h == nil {
		var err error
		// Routes, links and neighbours only: a handle of every family
		// would need the kernel's xfrm, which nodes do not load.
		if h, err = netlink.NewHandle(unix.NETLINK_ROUTE); err != nil {
			return nil, fmt.Errorf("netlink: %w", err)
		}
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Router{cfg: cfg, k: kernel{h}, log: log, status: "routes to the other nodes' pod CIDRs not programmed yet", refused: map[string]string{}}, nil
}

// Ready says whether the routes to every other node that can be routed
// are in, and if not, why.
func (r *Router) Ready() (bool, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.synced, r.status
}

// PodMTU is the MTU for the pods of n, this node's Node: that of the
// links holding its InternalIPs, less VXLAN's overhead unless the mode is
// host-gw, so that a pod's packet fits in the tunnel to any node. It is 0,
// the links' default, when no link here holds an InternalIP (an address
// translated on the way to the node).
func (r *Router) PodMTU(n *corev1.Node) (int, error) {
	mtu := 0
	for _, a := range internalIPs(n) {
		m, err := r.k.linkMTU(a)
		if errors.Is(err, errNoLink) {
			r.log.Warn("no link holds the Node's InternalIP: its MTU is not known", "address", a)
			continue
		}
		if err != nil {
			return 0, err
		}
		if r.cfg.Mode != machineconfig.PodNetworkHostGW {
			m -= overhead(a.Is6())
		}
		if mtu == 0 || m < mtu {
			mtu = m
		}
	}
	return mtu, nil
}

// Run keeps the routes to the pod CIDRs of the Nodes that nodes, an
// informer the caller runs, holds until ctx ends. The routes stay when
// it returns: traffic keeps flowing while the agent restarts.
func (r *Router) Run(ctx context.Context, client kubernetes.Interface, nodes cache.SharedIndexInformer) error {
	events := record.NewBroadcaster(record.WithContext(ctx))
	events.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	defer events.Shutdown()
	recorder := events.NewRecorder(scheme.Scheme, corev1.EventSource{Component: EventSource, Host: r.cfg.NodeName})

	changed := make(chan struct{}, 1)
	poke := func(any) {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	reg, err := nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: poke, DeleteFunc: poke,
		// Nodes change all the time (conditions, images, volumes): only
		// their pod CIDRs and addresses matter here.
		UpdateFunc: func(old, o any) {
			if a, b := old.(*corev1.Node), o.(*corev1.Node); !slices.Equal(a.Spec.PodCIDRs, b.Spec.PodCIDRs) ||
				!slices.Equal(a.Status.Addresses, b.Status.Addresses) {
				poke(o)
			}
		},
	})
	if err != nil {
		return fmt.Errorf("watch Nodes: %w", err)
	}
	defer func() { _ = nodes.RemoveEventHandler(reg) }()
	if !cache.WaitForCacheSync(ctx.Done(), reg.HasSynced) {
		return nil
	}
	lister := corelisters.NewNodeLister(nodes.GetIndexer())
	r.log.Info("routing the other nodes' pod CIDRs", "mode", r.cfg.Mode)

	b := backoff.Backoff{Initial: time.Second, Max: 30 * time.Second, Jitter: 0.2}
	wait := time.Duration(0)
	for {
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil
		case <-changed:
			timer.Stop()
		case <-timer.C:
		}
		if err := r.sync(lister, recorder); err != nil {
			r.log.Error("pod routes not programmed; retrying", "err", err)
			wait = b.Next()
			continue
		}
		b.Reset()
		wait = resyncPeriod
	}
}

// sync programs the routes the Nodes of lister call for and tells of the
// nodes refused.
func (r *Router) sync(lister corelisters.NodeLister, recorder record.EventRecorder) error {
	nodes, err := lister.List(labels.Everything())
	if err != nil {
		return err
	}
	s, routes, refused, err := plan(r.cfg.NodeName, r.cfg.Mode, r.cfg.ServiceCIDRs, nodes, r.k.onLink)
	if err == nil {
		err = r.k.apply(s, routes)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.synced, r.status = false, "routes to the other nodes' pod CIDRs not programmed: "+err.Error()
		return err
	}
	tunnelled := 0
	for _, rt := range routes {
		if rt.vxlan {
			tunnelled++
		}
	}
	r.synced = true
	r.status = fmt.Sprintf("%d routes to other nodes' pod CIDRs (%d through VXLAN)", len(routes), tunnelled)
	if len(refused) > 0 {
		r.status += fmt.Sprintf("; %d nodes refused (see their Events)", len(refused))
	}
	now := map[string]string{}
	for _, f := range refused {
		now[f.node.Name] = f.why
		if r.refused[f.node.Name] != f.why {
			r.log.Warn("Node's pod CIDRs not routed", "node", f.node.Name, "why", f.why)
			recorder.Eventf(f.node, corev1.EventTypeWarning, ReasonRefused, "Node %s does not route to this Node's pods: %s", r.cfg.NodeName, f.why)
		}
	}
	r.refused = now
	return nil
}
