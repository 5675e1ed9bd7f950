package sidecar

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/eppanswer"
	"github.com/mci-dev/mci/pkg/extproc"
	"github.com/mci-dev/mci/pkg/publishedaddrs"
	"github.com/mci-dev/mci/pkg/routetable"
)

// BenchmarkRemoteAnswerWork measures what the trust boundary adds to a
// decision relayed to a remote EPP, per request: the request prepared for
// the remote EPP (forRemote, with and without the credentials stripped),
// the admission (a stream and its body's bytes), and the EPP's answer
// filtered (eppanswer) rather than relayed as it came. "before" is the
// work as it was (forRemote without stripping, the answer as it came);
// "after" all of it. It reports the p99 of one request's work.
func BenchmarkRemoteAnswerWork(b *testing.B) {
	headers := []*corev3.HeaderValue{
		{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/chat/completions")},
		{Key: ":authority", RawValue: []byte("my.model.com")}, {Key: "content-type", RawValue: []byte("application/json")},
		{Key: "authorization", RawValue: []byte("Bearer sk-0123456789abcdef")}, {Key: "user-agent", RawValue: []byte("openai-python/1.0")},
		{Key: "x-request-id", RawValue: []byte("6f1c8c1e-2f43-4c8e-9d0a-1d2f3e4a5b6c")}, {Key: "content-length", RawValue: []byte("48")},
	}
	body := []byte(`{"model":"chat","messages":[{"role":"user","content":"hello"}]}`)
	msgs := []*extprocv3.ProcessingRequest{
		{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: headers}}}},
		{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}},
	}
	req, err := extproc.ReadRequest(&replayStream{msgs: msgs}, 0)
	require.NoError(b, err)
	answer := req.Route([]string{"10.8.0.5:8000"}, nil)
	// A pool of publishedaddrs.Max pods, 10.8.0.5 among them.
	var pods []netip.Addr
	for i := range publishedaddrs.Max {
		pods = append(pods, netip.AddrFrom4([4]byte{10, 8, byte(i / 250), byte(i%250 + 1)}))
	}
	addrs, err := publishedaddrs.Parse(publishedaddrs.Publish(pods))
	require.NoError(b, err)
	c := &routetable.Cluster{Name: "cluster-a", Mode: v1alpha1.RoutingModeEndpoint, Published: eppanswer.Published{Port: 8000, Addresses: addrs}}
	remote := newRemoteAnswers(eppanswer.Policy{Denied: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12"), netip.MustParsePrefix("10.244.0.0/16")}}, nil, nil, nil, logr.Discard())
	admit := newAdmission(DefaultMaxStreams, DefaultMaxInflightBodyBytes, nil, logr.Discard())
	// keep strips nothing and forwards every namespace (there is none).
	keep := &remoteAnswers{}

	for _, tt := range []struct {
		name string
		work func() error
	}{
		{name: "before", work: func() error {
			_ = forRemote(msgs, "cluster-b", keep)
			return nil
		}},
		{name: "after", work: func() error {
			if !admit.enter() || !admit.reserve(2*int64(len(body))) {
				b.Fatal("not admitted")
			}
			_ = forRemote(msgs, "cluster-b", remote)
			_, err := remote.filter(c, req, answer)
			admit.release(2 * int64(len(body)))
			admit.leave()
			return err
		}},
	} {
		b.Run(tt.name, func(b *testing.B) {
			took := make([]time.Duration, 0, b.N)
			for b.Loop() {
				start := time.Now()
				if err := tt.work(); err != nil {
					b.Fatal(err)
				}
				took = append(took, time.Since(start))
			}
			slices.Sort(took)
			b.ReportMetric(float64(took[len(took)*99/100].Nanoseconds()), "p99-ns")
		})
	}
}

// replayStream is a gateway's stream that sends msgs.
type replayStream struct {
	extproc.Stream
	msgs []*extprocv3.ProcessingRequest
}

func (s *replayStream) Recv() (*extprocv3.ProcessingRequest, error) {
	m := s.msgs[0]
	s.msgs = s.msgs[1:]
	return m, nil
}
