package virtual

import (
	"context"
	"fmt"
	"maps"
	"math/rand"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/mci-dev/mci/pkg/apis/inference"
	"github.com/mci-dev/mci/pkg/clusterset"
	"github.com/mci-dev/mci/pkg/imports"
)

// A client resumes here with a version another replica issued: that
// replica's membership stamp comes from its own clock, later than this
// one's by a millisecond or by minutes. A change this replica made for a
// member event alone has no member resourceVersion to place it: cluster-b
// joined (its caches are new: the event is marked Replaced), or became
// unreachable (the view changes). The client must get the change, or be
// told to relist. Never may it wait, stale, for an event that was skipped.
func TestAForeignVersionWithALaterMembershipStampMissesNoChange(t *testing.T) {
	for _, tc := range []struct {
		name  string
		event clusterset.Event
		view  *imports.Unreachable
	}{
		{"a member joins", clusterset.Event{Member: "cluster-b", Kind: clusterset.KindMember, Namespace: "ns", Name: "c", Replaced: true}, nil},
		{"a member becomes unreachable", clusterset.Event{Member: "cluster-b", Kind: clusterset.KindMember, Namespace: "ns", Name: "c"}, &imports.Unreachable{}},
	} {
		for _, skew := range []time.Duration{time.Millisecond, 10 * time.Minute} {
			t.Run(tc.name+"/"+skew.String(), func(t *testing.T) {
				r, members, s, seen := listedAtClusterC5(t)

				r.set("ns", "c", nil, "cluster-c", "cluster-b")
				members.setUnreachable("cluster-b", tc.view)
				s.Notify(tc.event)
				s.recompute(context.Background())
				c, _, _ := s.Get("ns", "c")
				require.Len(t, c.(*inference.InferencePoolImport).Status.Clusters, 2)
				stamped, err := ParseVersion(c.GetResourceVersion())
				require.NoError(t, err)

				// The other replica had seen cluster-c up to 5, not the
				// member event; its clock stamped something later.
				foreign, err := ParseVersion(seen)
				require.NoError(t, err)
				foreign[epochComponent] = 1
				foreign[reachabilityComponent] = stamped[reachabilityComponent] + uint64(skew.Milliseconds())
				w, err := s.Watch(context.Background(), WatchOptions{ResourceVersion: foreign.String()})
				if err != nil {
					assert.True(t, apierrors.IsResourceExpired(err), "a resume that cannot be proven complete is 410 Gone: %v", err)
					return
				}
				defer w.Stop()
				select {
				case ev := <-w.ResultChan():
					assert.Equal(t, watch.Modified, ev.Type)
					assert.Equal(t, "c", nameOf(ev))
				case <-time.After(time.Second):
					t.Fatal("the change made for the member event alone was never sent, and the watch was not refused")
				}
			})
		}
	}
}

// A member event that leaves the member's data as it was and changes
// nothing served (cluster-b's outage flags nothing of ns/c) leaves no
// mark: a version the other replica issued before the outage, with the
// view that holds again after it, resumes without a relist.
func TestAForeignVersionResumesAcrossAnOutageThatChangedNothing(t *testing.T) {
	_, members, s, seen := listedAtClusterC5(t)
	for _, u := range []*imports.Unreachable{{Message: "gone"}, nil} {
		members.setUnreachable("cluster-b", u)
		s.Notify(clusterset.Event{Member: "cluster-b", Kind: clusterset.KindMember})
		s.recompute(context.Background())
	}
	foreign, err := ParseVersion(seen)
	require.NoError(t, err)
	foreign[epochComponent] = 1
	// Of a replica whose objects differ from this one's by their
	// wording: no state of this Store's, so the member components alone
	// place it.
	foreign[stateLowComponent]++
	w, err := s.Watch(context.Background(), WatchOptions{ResourceVersion: foreign.String()})
	require.NoError(t, err, "an outage of another member that changed nothing must not refuse the resume")
	w.Stop()

	// A member read anew (its caches replaced) does refuse it.
	s.Notify(clusterset.Event{Member: "cluster-b", Kind: clusterset.KindMember, Replaced: true})
	s.recompute(context.Background())
	_, err = s.Watch(context.Background(), WatchOptions{ResourceVersion: foreign.String()})
	assert.True(t, apierrors.IsResourceExpired(err), "after a member was read anew, before its next change: %v", err)
}

// listedAtClusterC5 starts a Store of members cluster-b and cluster-c
// serving ns/c, exported by cluster-c at 5, and lists it: seen is the
// version a client got.
func listedAtClusterC5(t *testing.T) (r *tableResource, members *settableSnapshot, s *Store, seen string) {
	t.Helper()
	r = &tableResource{objects: map[string]*inference.InferencePoolImport{}}
	r.set("ns", "c", nil, "cluster-c")
	members = &settableSnapshot{cs: imports.ClusterSet{Members: []imports.Member{{Name: "cluster-b"}, {Name: "cluster-c"}}}}
	s = startStoreOf(t, r, members)
	notifyPool(s, "cluster-c", "ns", "c", 5)
	s.recompute(context.Background())
	s.takeBaseline()
	_, seen, err := s.ListWithOptions(context.Background(), ListOptions{})
	require.NoError(t, err)
	return r, members, s, seen
}

// settableSnapshot is a ClusterSet whose members' reachability a test
// sets.
type settableSnapshot struct {
	mu sync.Mutex
	cs imports.ClusterSet
}

func (s *settableSnapshot) Snapshot() imports.ClusterSet {
	s.mu.Lock()
	defer s.mu.Unlock()
	return imports.ClusterSet{Members: slices.Clone(s.cs.Members)}
}

func (*settableSnapshot) Ready() error { return nil }

func (s *settableSnapshot) setUnreachable(member string, u *imports.Unreachable) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range s.cs.Members {
		if s.cs.Members[i].Name == member {
			s.cs.Members[i].Unreachable = u
		}
	}
}

// simWorld is what the member clusters do, which every replica sees in
// each member's order but at its own pace: each member's changes (at
// growing resourceVersions) and one sequence of membership changes.
type simWorld struct {
	members []string
	changes map[string][]simChange
	flips   []string // the member whose reachability changes, in order
}

type simChange struct {
	rv    uint64
	key   string
	value string // "" deletes
}

// simReplica is one replica's caches: the members' data as far as it has
// read them, and its view of their reachability.
type simReplica struct {
	data        map[string]map[string]simObject // member -> key -> object
	read        map[string]int                  // member -> changes applied
	unreachable map[string]bool
	flipped     int
	sentinel    bool
}

type simObject struct {
	rv    uint64
	value string
}

func newSimReplica(w *simWorld) *simReplica {
	r := &simReplica{data: map[string]map[string]simObject{}, read: map[string]int{}, unreachable: map[string]bool{}}
	for _, m := range w.members {
		// Every replica starts having listed each member's first change:
		// an object that is always there, as a cluster always has
		// namespaces, so that a relist always lists something the
		// replica had read before.
		c := w.changes[m][0]
		r.data[m] = map[string]simObject{c.key: {rv: c.rv, value: c.value}}
		r.read[m] = 1
	}
	return r
}

func (r *simReplica) Snapshot() imports.ClusterSet {
	var cs imports.ClusterSet
	for _, m := range []string{"m1", "m2", "m3"} {
		mem := imports.Member{Name: m}
		if r.unreachable[m] {
			mem.Unreachable = &imports.Unreachable{}
		}
		cs.Members = append(cs.Members, mem)
	}
	return cs
}

func (r *simReplica) Ready() error { return nil }

// object computes key as an import would: one cluster entry per member
// that has it, flagged when the member is unreachable.
func (r *simReplica) object(key string) (Object, bool) {
	ns, name := splitKey(key)
	o := &inference.InferencePoolImport{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if key == "zz/sentinel" {
		return o, r.sentinel
	}
	for _, m := range []string{"m1", "m2", "m3"} {
		if obj, ok := r.data[m][key]; ok {
			c := m + "=" + obj.value
			if r.unreachable[m] {
				c += "!"
			}
			o.Status.Clusters = append(o.Status.Clusters, inference.ImportedCluster{Name: c})
		}
	}
	return o, len(o.Status.Clusters) > 0
}

// simResource computes from a simReplica (which the test drives from one
// goroutine, between recomputations).
type simResource struct{ r *simReplica }

func (s simResource) Compute(_ imports.ClusterSet, ns, name string) (Object, bool) {
	return s.r.object(key(ns, name))
}

func (s simResource) ComputeNamespace(_ imports.ClusterSet, ns string) []Object {
	keys := map[string]bool{"zz/sentinel": true}
	for _, d := range s.r.data {
		for k := range d {
			keys[k] = true
		}
	}
	var out []Object
	for k := range keys {
		if o, ok := s.r.object(k); ok && (ns == "" || o.GetNamespace() == ns) {
			out = append(out, o)
		}
	}
	return out
}

func (simResource) Affected(ev clusterset.Event) Dirty {
	if ev.Kind == clusterset.KindMember {
		return Dirty{All: true}
	}
	return Dirty{Keys: []string{key(ev.Namespace, ev.Name)}}
}

func (simResource) CarryTransitionTimes(Object, Object, metav1.Time) {}

// simStep is one thing a replica does: read a member's next change (or,
// relisting, several at once), or see the next membership change.
type simStep struct {
	member  string
	n       int  // changes read
	flip    bool // the next membership change
	recheck bool // recompute after it
	// bookmark: after reading one change, the member's informers tell a
	// version up to its next change (a bookmark's; KindListed).
	bookmark bool
}

// apply does step on replica r of store s, notifying s as the member
// caches must: a relist passes every object it lists on at its
// resourceVersion, every deletion without one, and says that it relisted
// (an event without a resourceVersion).
func (w *simWorld) apply(r *simReplica, s *Store, st simStep) {
	if st.flip {
		m := w.flips[r.flipped]
		r.flipped++
		r.unreachable[m] = !r.unreachable[m]
		s.Notify(clusterset.Event{Member: m, Kind: clusterset.KindMember})
		return
	}
	before := maps.Clone(r.data[st.member])
	for range st.n {
		c := w.changes[st.member][r.read[st.member]]
		r.read[st.member]++
		if c.value == "" {
			delete(r.data[st.member], c.key)
		} else {
			r.data[st.member][c.key] = simObject{rv: c.rv, value: c.value}
		}
		if st.n == 1 {
			ns, name := splitKey(c.key)
			s.Notify(clusterset.Event{Member: st.member, Kind: clusterset.KindInferencePool, Namespace: ns, Name: name, ResourceVersion: c.rv})
		}
	}
	if st.n == 1 {
		if st.bookmark {
			s.Notify(clusterset.Event{Member: st.member, Kind: clusterset.KindListed, ResourceVersion: w.bookmarkAfter(st.member, r.read[st.member])})
		}
		return
	}
	for k, o := range r.data[st.member] {
		ns, name := splitKey(k)
		s.Notify(clusterset.Event{Member: st.member, Kind: clusterset.KindInferencePool, Namespace: ns, Name: name, ResourceVersion: o.rv})
	}
	for k := range before {
		if _, ok := r.data[st.member][k]; !ok {
			ns, name := splitKey(k)
			s.Notify(clusterset.Event{Member: st.member, Kind: clusterset.KindInferencePool, Namespace: ns, Name: name})
		}
	}
	s.Notify(clusterset.Event{Member: st.member, Kind: clusterset.KindInferencePool, Namespace: "ns", Name: st.member})
}

// bookmarkAfter is the version a bookmark carries once read changes of
// member are read: the last before its next change (its server moved with
// changes the summaries do not reflect), or past the last one.
func (w *simWorld) bookmarkAfter(member string, read int) uint64 {
	if read < len(w.changes[member]) {
		return w.changes[member][read].rv - 1
	}
	return w.changes[member][read-1].rv + 5
}

func newSimWorld(rng *rand.Rand) *simWorld {
	w := &simWorld{members: []string{"m1", "m2", "m3"}, changes: map[string][]simChange{}}
	for _, m := range w.members {
		rv := uint64(rng.Intn(1000) + 1)
		w.changes[m] = append(w.changes[m], simChange{rv: rv, key: "ns/" + m, value: "0"})
		for i := range 4 + rng.Intn(8) {
			rv += uint64(1 + rng.Intn(3))
			c := simChange{rv: rv, key: fmt.Sprintf("ns/k%d", rng.Intn(4)), value: fmt.Sprint(i + 1)}
			if rng.Intn(4) == 0 {
				c.value = ""
			}
			w.changes[m] = append(w.changes[m], c)
		}
	}
	for range rng.Intn(5) {
		w.flips = append(w.flips, w.members[rng.Intn(len(w.members))])
	}
	return w
}

// schedule is one replica's way through the world: each member's changes
// in order (sometimes several at once, as a relist reads them), the
// membership changes in order, interleaved at random.
func (w *simWorld) schedule(rng *rand.Rand) []simStep {
	left := map[string]int{}
	for _, m := range w.members {
		left[m] = len(w.changes[m]) - 1
	}
	flips := len(w.flips)
	var steps []simStep
	for {
		var choices []string
		for _, m := range w.members {
			if left[m] > 0 {
				choices = append(choices, m)
			}
		}
		if flips > 0 {
			choices = append(choices, "")
		}
		if len(choices) == 0 {
			return steps
		}
		st := simStep{member: choices[rng.Intn(len(choices))], recheck: rng.Intn(2) > 0}
		if st.member == "" {
			st.flip = true
			flips--
		} else {
			st.n = 1
			if rng.Intn(10) == 0 {
				st.n = 1 + rng.Intn(left[st.member])
			}
			st.bookmark = st.n == 1 && rng.Intn(3) == 0
			left[st.member] -= st.n
		}
		steps = append(steps, st)
	}
}

// startSim starts a Store of replica r whose clock runs offset from the
// test's, as Run starts one, without Run's goroutine: the test recomputes.
func startSim(t *testing.T, r *simReplica, offset time.Duration) *Store {
	t.Helper()
	s := NewStore(simResource{r}, r, func() Object { return &inference.InferencePoolImport{} })
	start := time.Unix(1_760_000_000, 0).Add(offset)
	var tick time.Duration
	s.now = func() time.Time { tick += time.Millisecond; return start.Add(tick) }
	s.epoch = uint64(start.UnixMilli())
	s.version[epochComponent] = s.epoch
	for m, d := range r.data {
		for k, o := range d {
			ns, name := splitKey(k)
			s.Notify(clusterset.Event{Member: m, Kind: clusterset.KindInferencePool, Namespace: ns, Name: name, ResourceVersion: o.rv})
		}
	}
	s.pending.All = true
	s.recompute(t.Context())
	s.started = true
	s.takeBaseline()
	require.NotNil(t, s.baseline)
	return s
}

func (w *simWorld) run(t *testing.T, r *simReplica, s *Store, steps []simStep) {
	t.Helper()
	for _, st := range steps {
		w.apply(r, s, st)
		if st.recheck {
			s.recompute(t.Context())
		}
	}
	s.recompute(t.Context())
}

// Two replicas read the same members in their own orders and at their own
// pace, see the same membership changes at other moments, and stamp them
// by clocks minutes apart. A client that listed on one resumes its watch on
// the other at any point: either the watch is refused with 410 Gone (the
// client relists), or the events it gets bring its cache to exactly what
// the other replica serves once both have read everything.
func TestAWatchResumedOnAnotherReplicaMissesNothing(t *testing.T) {
	defer func(d time.Duration) { blockTimeout = d }(blockTimeout)
	blockTimeout = time.Millisecond // the simulation reads nothing more while a watch waits
	seed := time.Now().UnixNano()
	if v := os.Getenv("MCI_SIM_SEED"); v != "" {
		seed, _ = strconv.ParseInt(v, 10, 64)
	}
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewSource(seed))
	var resumed, refused, laterStamp int
	trials := 1000
	if testing.Short() {
		trials = 200
	}
	for trial := range trials {
		w := newSimWorld(rng)
		ra, rb := newSimReplica(w), newSimReplica(w)
		skew := time.Duration(rng.Intn(20*60*1000)-10*60*1000) * time.Millisecond
		sa, sb := startSim(t, ra, 0), startSim(t, rb, skew)
		stepsA, stepsB := w.schedule(rng), w.schedule(rng)

		cutB := rng.Intn(len(stepsB) + 1)
		w.run(t, rb, sb, stepsB[:cutB])
		pg, since, err := sb.ListWithOptions(t.Context(), ListOptions{})
		require.NoError(t, err)
		cache := map[string]string{}
		for _, o := range pg.items {
			cache[key(o.GetNamespace(), o.GetName())] = fmt.Sprint(o.(*inference.InferencePoolImport).Status.Clusters)
		}

		cutA := rng.Intn(len(stepsA) + 1)
		w.run(t, ra, sa, stepsA[:cutA])
		sinceV, err := ParseVersion(since)
		require.NoError(t, err)
		// A watch from a replica that read further waits for this one
		// to get there (it reads on meanwhile).
		for ; !sa.version.coversMembers(sinceV) && cutA < len(stepsA); cutA++ {
			w.run(t, ra, sa, stepsA[cutA:cutA+1])
		}
		if sinceV[reachabilityComponent] > sa.version[reachabilityComponent] {
			laterStamp++
		}
		wi, err := sa.Watch(t.Context(), WatchOptions{ResourceVersion: since})
		if err != nil {
			// 504 Too large resource version: this replica never got as
			// far as the version (a relist's deletions carry no newer
			// resourceVersion), and the client relists too.
			require.True(t, apierrors.IsResourceExpired(err) || apierrors.IsTimeout(err), "trial %d: %v", trial, err)
			refused++
			continue
		}
		resumed++
		w.run(t, ra, sa, stepsA[cutA:])
		ra.sentinel = true
		sa.Notify(clusterset.Event{Member: "m1", Kind: clusterset.KindInferencePool, Namespace: "zz", Name: "sentinel", ResourceVersion: 1})
		sa.recompute(t.Context())
		var got []string
		for done := false; !done; {
			ev := next(t, wi)
			o := ev.Object.(*inference.InferencePoolImport)
			k := key(o.Namespace, o.Name)
			got = append(got, fmt.Sprint(ev.Type, " ", k, " ", o.Status.Clusters))
			switch {
			case k == "zz/sentinel":
				done = true
			case ev.Type == watch.Deleted:
				delete(cache, k)
			default:
				cache[k] = fmt.Sprint(o.Status.Clusters)
			}
		}
		wi.Stop()

		want := map[string]string{}
		pg, _, err = sa.ListWithOptions(t.Context(), ListOptions{})
		require.NoError(t, err)
		for _, o := range pg.items {
			if k := key(o.GetNamespace(), o.GetName()); k != "zz/sentinel" {
				want[k] = fmt.Sprint(o.(*inference.InferencePoolImport).Status.Clusters)
			}
		}
		if !assert.ObjectsAreEqual(want, cache) {
			t.Logf("world %+v\nB %+v cut %d\nA %+v cut %d\nevents %q", w, stepsB, cutB, stepsA, cutA, got)
		}
		require.Equal(t, want, cache, "trial %d (seed %d): the client resumed at %s and its cache is not the replica's", trial, seed, since)
	}
	t.Logf("resumed %d, refused with 410 %d; the other replica's stamp was later in %d", resumed, refused, laterStamp)
	assert.Greater(t, resumed, trials/20, "resumes are proven complete often enough to test them")
	assert.Positive(t, laterStamp, "the other replica's later stamp is exercised")
}

// TestAFoldedPassRefusesOnlyVersionsBetweenItsEvents: one pass folds two
// events of cluster-c (ns/b added at 6, ns/a withdrawn at 7) with the
// version of the bookmark that came after them (9). Another replica's
// version at 6 may have shown a state this Store never computed (b
// without a's withdrawal) and is refused; one at 7 or 8 holds every change
// up to the bookmark, as this Store does, and resumes.
func TestAFoldedPassRefusesOnlyVersionsBetweenItsEvents(t *testing.T) {
	ctx := context.Background()
	r := &tableResource{objects: map[string]*inference.InferencePoolImport{}}
	// No Run loop: the test decides which events a pass folds.
	s := NewStore(r, emptySnapshot{}, func() Object { return &inference.InferencePoolImport{} })
	r.set("ns", "a", nil, "cluster-c")
	s.pending.All = true
	notifyPool(s, "cluster-c", "ns", "a", 4)
	s.recompute(ctx)
	s.takeBaseline()

	r.set("ns", "b", nil, "cluster-c")
	notifyPool(s, "cluster-c", "ns", "b", 6)
	r.remove("ns", "a")
	notifyPool(s, "cluster-c", "ns", "a", 7)
	s.Notify(clusterset.Event{Member: "cluster-c", Kind: clusterset.KindListed, ResourceVersion: 9})
	s.recompute(ctx)
	s.mu.RLock()
	here := s.version.clone()
	s.mu.RUnlock()
	require.Equal(t, uint64(9), here["cluster-c"])

	for n, resumes := range map[uint64]bool{6: false, 7: true, 8: true, 9: true} {
		foreign := Version{"cluster-c": n, reachabilityComponent: here[reachabilityComponent], epochComponent: here[epochComponent] + 1, viewComponent: here[viewComponent]}
		w, err := s.Watch(ctx, WatchOptions{ResourceVersion: foreign.String()})
		if resumes {
			if assert.NoError(t, err, "another replica's version at %d", n) {
				w.Stop()
			}
			continue
		}
		assert.True(t, apierrors.IsResourceExpired(err), "another replica's version at %d, between the folded events, is refused: %v", n, err)
	}
}
