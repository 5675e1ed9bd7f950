package sidecar

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/stats"
)

// streamGauge counts the ext_proc streams open to EPPs, from gRPC's own
// view of each stream on the relay's connections: Begin when a stream is
// created, End when gRPC has released it (the EPP ended it, it failed, or
// it was reset). A stream the relay forgets to end stays counted, so the
// gauge, mci_sidecar_epp_streams, is how a leak shows: with no request
// open, it is 0.
type streamGauge struct {
	open prometheus.Gauge
}

func (g streamGauge) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }

func (g streamGauge) HandleRPC(_ context.Context, s stats.RPCStats) {
	switch s.(type) {
	case *stats.Begin:
		g.open.Inc()
	case *stats.End:
		g.open.Dec()
	}
}

func (g streamGauge) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }

func (g streamGauge) HandleConn(context.Context, stats.ConnStats) {}
