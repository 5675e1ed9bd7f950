// Package hostileepp is an Endpoint Picker that answers as a hostile
// exporter would: a real ext_proc server on loopback whose answer to each
// request is a Case drawn from a seeded generator (Generate), covering
// every class of answer a remote EPP could use to reach past what routing
// needs: destinations outside what was published, header, body and mode
// mutations, immediate responses of every status, foreign dynamic
// metadata, oversized, garbled, truncated, slow and endless answers, and
// a hostile response phase. Each Case says what must become of it at the
// importing sidecar (Want), so that a test can check every answer its
// gateway got.
//
// A request names its case in the header CaseHeader. Every value a case
// sets carries Marker, so that a gateway's view holding Marker is
// something of the hostile EPP's that got through.
package hostileepp

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
)

// CaseHeader is the request header that names the Case a request gets.
const CaseHeader = "x-hostile-case"

// Marker is in every value a hostile answer sets beyond its destination and
// model: nothing the gateway gets may carry it.
const Marker = "hostile-epp-marker"

// RewrittenModel is the model a passing model rewrite names.
const RewrittenModel = "rewritten-model"

// The refusal reasons (pkg/eppanswer's, the reason label of
// mci_sidecar_epp_answers_refused_total), spelled here so that a change of
// them is a change of this harness too.
const (
	ReasonNoDestination           = "no_destination"
	ReasonConflictingDestinations = "conflicting_destinations"
	ReasonUnpublishedDestination  = "unpublished_destination"
	ReasonForbiddenDestination    = "forbidden_destination"
	ReasonBodyMutation            = "body_mutation"
	ReasonImmediateStatus         = "immediate_status"
	ReasonProtocol                = "protocol_violation"
)

// Want is what must become of a Case's answer at the importing sidecar.
// Exactly one of Reason, Fails, Status and Destination is set.
type Want struct {
	// Reason: the answer is refused with this reason, counted, and the
	// request goes to the next cluster.
	Reason string
	// Fails: the attempt fails without a refusal (the stream broke, the
	// answer could not be read or did not come in time, or an immediate
	// 503, which sends the request on), and the request goes to the next
	// cluster.
	Fails bool
	// Status: an immediate response that passes as this status alone.
	Status int
	// Destination: the answer passes, rebuilt by the sidecar, with this
	// destination value (endpoints joined by commas) and, when Model is
	// set, the request body with its model rewritten to Model.
	Destination string
	Model       string
	// ResponseReason, for an answer that passes: its response phase is
	// refused with this reason (counted) and the sidecar answers the rest
	// itself; "" when nothing of it is refused (what it mutates is
	// dropped).
	ResponseReason string
}

// Case is one hostile answer and what must become of it.
type Case struct {
	ID int
	// Class names the kind of hostility, Detail this instance of it.
	Class, Detail string
	Want          Want
	// act answers the request phase; respond, for an answer that passes,
	// the response phase.
	act     action
	respond responder
}

func (c *Case) String() string {
	return fmt.Sprintf("case %d (%s: %s)", c.ID, c.Class, c.Detail)
}

// Config is what the exporter published and the importing cluster denies.
type Config struct {
	// Port is the pool's published target port.
	Port int32
	// Addresses are IPv4 addresses a passing destination names: the test's
	// import must publish them as the pool's endpoint addresses, and no
	// other address of 10.0.0.0/8 outside the denied ranges.
	Addresses []netip.Addr
	// ServiceRange and PodRange are the importing cluster's own ranges,
	// which the sidecar under test denies.
	ServiceRange, PodRange netip.Prefix
}

// class makes one instance of a class of hostile answers.
type class struct {
	name string
	make func(g *gen) (detail string, act action, want Want)
	// weight is how many cases of it each round of classes has (1 when
	// 0).
	weight int
}

// gen draws a case's parameters.
type gen struct {
	r   *rand.Rand
	cfg Config
	// statuses are the immediate responses' statuses, swept from a drawn
	// start: statuses[immediates%len].
	statuses   []int
	immediates int
}

// Generate returns n cases drawn with seed, of the classes in rounds (each
// class once, or weight times, a round): n of at least Rounds(1) covers
// every class, and an immediate response of every status (Statuses) once
// n reaches Rounds(ImmediateRoundsForEveryStatus). Their parameters and
// response phases are drawn at random.
func Generate(seed uint64, n int, cfg Config) []*Case {
	g := &gen{r: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), cfg: cfg, statuses: Statuses()}
	g.immediates = g.r.IntN(len(g.statuses))
	var all []class
	for _, cl := range classes() {
		for range max(cl.weight, 1) {
			all = append(all, cl)
		}
	}
	cases := make([]*Case, n)
	for i := range cases {
		cl := all[i%len(all)]
		detail, act, want := cl.make(g)
		c := &Case{ID: i, Class: cl.name, Detail: detail, Want: want, act: act}
		if want.Destination != "" {
			c.respond, c.Want.ResponseReason = g.responder()
		}
		cases[i] = c
	}
	return cases
}

// Rounds is how many cases make rounds rounds of every class.
func Rounds(rounds int) int {
	n := 0
	for _, cl := range classes() {
		n += max(cl.weight, 1)
	}
	return rounds * n
}

// ImmediateRoundsForEveryStatus is how many rounds of classes draw an
// immediate response of every status.
func ImmediateRoundsForEveryStatus() int {
	return (len(Statuses()) + immediateWeight - 1) / immediateWeight
}

// immediateWeight is the weight of the immediate responses' class: they
// sweep the statuses.
const immediateWeight = 4

// Classes names every class Generate draws from, in order.
func Classes() []string {
	var names []string
	for _, c := range classes() {
		names = append(names, c.name)
	}
	return names
}

func (g *gen) pick(options ...string) string { return options[g.r.IntN(len(options))] }

// good is a published endpoint.
func (g *gen) good() string {
	return g.endpoint(g.cfg.Addresses[g.r.IntN(len(g.cfg.Addresses))])
}

func (g *gen) endpoint(a netip.Addr) string {
	return netip.AddrPortFrom(a, uint16(g.cfg.Port)).String()
}

// in is a random address of p.
func (g *gen) in(p netip.Prefix) netip.Addr {
	b := p.Addr().As16()
	if p.Addr().Is4() {
		b4 := p.Addr().As4()
		for i := p.Bits() / 8; i < 4; i++ {
			b4[i] |= byte(g.r.UintN(256)) & hostMask(p.Bits(), i)
		}
		return netip.AddrFrom4(b4)
	}
	for i := p.Bits() / 8; i < 16; i++ {
		b[i] |= byte(g.r.UintN(256)) & hostMask(p.Bits(), i)
	}
	return netip.AddrFrom16(b)
}

// hostMask is the mask of the host bits of byte i of a prefix of bits.
func hostMask(bits, i int) byte {
	switch {
	case bits >= 8*(i+1):
		return 0
	case bits <= 8*i:
		return 0xff
	}
	return 0xff >> (bits - 8*i)
}

func (g *gen) port() string { return strconv.Itoa(int(g.cfg.Port)) }

// refusedDestination is a class whose destination (in the header and the
// metadata alike) is refused for reason.
func refusedDestination(name, reason string, values func(g *gen) string) class {
	return class{name: name, make: func(g *gen) (string, action, Want) {
		v := values(g)
		return v, routeWith(v, v, nil), Want{Reason: reason}
	}}
}

// classes are every class of hostile answer.
func classes() []class {
	forbidden := ReasonForbiddenDestination
	return []class{
		refusedDestination("another port", ReasonUnpublishedDestination, func(g *gen) string {
			a := g.cfg.Addresses[g.r.IntN(len(g.cfg.Addresses))]
			port := g.r.IntN(65536)
			if port == int(g.cfg.Port) {
				port = 0
			}
			return netip.AddrPortFrom(a, uint16(port)).String()
		}),
		// Routable addresses on the published port that the exporter did
		// not publish: another of its networks, documentation ranges, the
		// IPv6 metadata address, or an unpublished fallback.
		refusedDestination("an address not published", ReasonUnpublishedDestination, func(g *gen) string {
			return g.pick(g.endpoint(g.in(netip.MustParsePrefix("10.200.0.0/16"))), g.endpoint(g.in(netip.MustParsePrefix("192.0.2.0/24"))),
				"[fd00:ec2::254]:"+g.port(), g.endpoint(g.in(netip.MustParsePrefix("2001:db8::/32"))),
				g.good()+","+g.endpoint(g.in(netip.MustParsePrefix("203.0.113.0/24"))))
		}),
		refusedDestination("loopback", forbidden, func(g *gen) string {
			return g.pick(g.endpoint(g.in(netip.MustParsePrefix("127.0.0.0/8"))), "[::1]:"+g.port())
		}),
		refusedDestination("link-local", forbidden, func(g *gen) string {
			return g.pick(g.endpoint(g.in(netip.MustParsePrefix("169.254.0.0/16"))), g.endpoint(g.in(netip.MustParsePrefix("fe80::/64"))))
		}),
		refusedDestination("metadata server", forbidden, func(g *gen) string {
			return g.pick("169.254.169.254:"+g.port(), "169.254.169.254:80", "[::ffff:169.254.169.254]:"+g.port())
		}),
		refusedDestination("unspecified, multicast or broadcast", forbidden, func(g *gen) string {
			return g.pick("0.0.0.0:"+g.port(), g.endpoint(g.in(netip.MustParsePrefix("0.0.0.0/8"))), "224.0.0.251:"+g.port(), "255.255.255.255:"+g.port(), "[::]:"+g.port(), "[ff02::1]:"+g.port())
		}),
		refusedDestination("the importing cluster's Service range", forbidden, func(g *gen) string {
			return g.endpoint(g.in(g.cfg.ServiceRange))
		}),
		refusedDestination("the importing cluster's Pod range", forbidden, func(g *gen) string {
			return g.endpoint(g.in(g.cfg.PodRange))
		}),
		refusedDestination("NAT64", forbidden, func(g *gen) string {
			return g.pick(g.endpoint(g.in(netip.MustParsePrefix("64:ff9b::/96"))), g.endpoint(g.in(netip.MustParsePrefix("64:ff9b:1::/48"))))
		}),
		refusedDestination("IPv4-mapped", forbidden, func(g *gen) string {
			inner := g.pick("127.0.0.1", "169.254.169.254", g.in(g.cfg.ServiceRange).String(), g.in(g.cfg.PodRange).String(), "0.0.0.0")
			return "[::ffff:" + inner + "]:" + g.port()
		}),
		refusedDestination("an IPv6 zone", forbidden, func(g *gen) string {
			return g.pick("[fe80::1%eth0]:", "[2001:db8::1%eth0]:", "[fd00::1%1]:") + g.port()
		}),
		refusedDestination("a local address among the fallbacks", forbidden, func(g *gen) string {
			return g.good() + "," + g.pick("127.0.0.1:", "169.254.169.254:", g.in(g.cfg.PodRange).String()+":") + g.port()
		}),
		refusedDestination("too many endpoints", ReasonUnpublishedDestination, func(g *gen) string {
			eps := make([]string, 17+g.r.IntN(200))
			for i := range eps {
				eps[i] = g.good()
			}
			return strings.Join(eps, ",")
		}),
		refusedDestination("an over-long value", ReasonUnpublishedDestination, func(g *gen) string {
			return g.good() + strings.Repeat(" ", 900+g.r.IntN(64<<10))
		}),
		refusedDestination("not an IP literal", ReasonUnpublishedDestination, func(g *gen) string {
			return g.pick("kubernetes.default.svc:", "metadata.google.internal:", "localhost:", "10.1.0.1.nip.io:") + g.port()
		}),
		refusedDestination("not an endpoint", ReasonUnpublishedDestination, func(g *gen) string {
			a := g.cfg.Addresses[0].String()
			return g.pick(a, "http://"+a+":"+g.port()+"/", a+":"+g.port()+"/v1", a+":-1", a+":99999", Marker)
		}),
		{name: "header and metadata disagree", make: func(g *gen) (string, action, Want) {
			h, md := g.good(), g.pick("169.254.169.254:80", "127.0.0.1:"+g.port(), g.in(g.cfg.ServiceRange).String()+":"+g.port())
			if g.r.IntN(2) == 0 {
				h, md = md, h
			}
			return h + " / " + md, routeWith(h, md, nil), Want{Reason: ReasonConflictingDestinations}
		}},
		{name: "two destination headers", make: func(g *gen) (string, action, Want) {
			extra := setHeader(destinationHeader, "127.0.0.1:"+g.port())
			return "a second header", routeWith(g.good(), "", []headerOption{extra}), Want{Reason: ReasonConflictingDestinations}
		}},
		{name: "no destination", make: func(g *gen) (string, action, Want) {
			v := g.pick("", " , ")
			return fmt.Sprintf("%q", v), routeWith(v, "", []headerOption{setHeader(":authority", Marker)}), Want{Reason: ReasonNoDestination}
		}},
		{name: "header mutations", make: headerMutations},
		{name: "dynamic metadata beyond the destination", make: foreignMetadata},
		{name: "mode overrides", make: modeOverrides},
		{name: "a destination in the metadata only", make: func(g *gen) (string, action, Want) {
			v := g.good()
			return v, routeWith("", v, nil), Want{Destination: v}
		}},
		{name: "fallbacks", make: func(g *gen) (string, action, Want) {
			v := g.good() + "," + g.good()
			return v, routeWith(v, v, nil), Want{Destination: v}
		}},
		{name: "a model rewrite", make: func(g *gen) (string, action, Want) {
			v := g.good()
			return v, bodyAnswer(v, rewriteModel), Want{Destination: v, Model: RewrittenModel}
		}},
		{name: "a slow answer", make: func(g *gen) (string, action, Want) {
			v, d := g.good(), g.r.IntN(150)
			return fmt.Sprintf("%d ms", d), slow(d, routeWith(v, v, nil)), Want{Destination: v}
		}},
		{name: "body mutations beyond the model", make: bodyMutations},
		{name: "a body past its limit", make: func(g *gen) (string, action, Want) {
			return "streamed back", bodyAnswer(g.good(), func(b []byte) []byte { return padJSON(b, 2*len(b)+(64<<10)+1+g.r.IntN(64<<10)) }), Want{Reason: ReasonProtocol}
		}},
		{name: "a body that never ends", make: func(g *gen) (string, action, Want) {
			return "1 KiB chunks", endlessBody(g.good()), Want{Reason: ReasonProtocol}
		}},
		{name: "an immediate response", make: immediateResponse, weight: immediateWeight},
		{name: "a message past gRPC's receive limit", make: func(g *gen) (string, action, Want) {
			return "5 MiB", oversized(g.good(), 5<<20), Want{Reason: ReasonProtocol}
		}},
		{name: "a garbled or truncated stream", make: garbled},
		{name: "an answer that never ends", make: func(g *gen) (string, action, Want) {
			d := g.pick("nothing", "the headers response only")
			return d, hang(d != "nothing", g.good()), Want{Fails: true}
		}},
	}
}

// Statuses are the immediate responses' statuses: every status net/http
// knows, and some it does not.
func Statuses() []int {
	codes := []int{0, 1, 99, 600, 999, 1 << 20}
	for c := 100; c < 600; c++ {
		if http.StatusText(c) != "" {
			codes = append(codes, c)
		}
	}
	return codes
}

// immediateResponse is the next status of the sweep.
func immediateResponse(g *gen) (string, action, Want) {
	code := g.statuses[g.immediates%len(g.statuses)]
	g.immediates++
	want := Want{Reason: ReasonImmediateStatus}
	switch code {
	case 400, 404, 413, 429:
		want = Want{Status: code}
	case 503:
		want = Want{Fails: true}
	}
	return strconv.Itoa(code), immediate(code), want
}
