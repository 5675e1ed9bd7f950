package poll

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// counter is a check that counts its calls per target and fails for the
// targets in failing.
type counter struct {
	mu      sync.Mutex
	calls   map[string]int
	failing map[string]bool
}

func (c *counter) check(_ context.Context, target string) (*int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls[target]++
	if c.failing[target] {
		return nil, errors.New("down")
	}
	n := c.calls[target]
	return &n, nil
}

func run(t *testing.T, p *Poller[int]) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
}

func TestPoller(t *testing.T) {
	c := &counter{calls: map[string]int{}, failing: map[string]bool{"down": true}}
	p := New(time.Hour, c.check)
	var forgotten []string
	var mu sync.Mutex
	p.Forget = func(target string) { mu.Lock(); forgotten = append(forgotten, target); mu.Unlock() }

	p.Set([]string{"a", "down", ""})
	assert.ElementsMatch(t, []string{"a", "down"}, p.Keys(), `"" is no target`)
	assert.Nil(t, p.Get("a"), "nothing before Run")
	run(t, p)

	require.Eventually(t, func() bool { return p.Get("a") != nil }, 5*time.Second, time.Millisecond, "a target is checked at once")
	assert.Equal(t, 1, *p.Get("a"))
	assert.Nil(t, p.Get("down"), "a failed check records nothing")

	p.Poke("a")
	require.Eventually(t, func() bool { return *p.Get("a") == 2 }, 5*time.Second, time.Millisecond, "a poke checks at once, not after the interval")

	v := 42
	p.Put("a", &v)
	assert.Equal(t, 42, *p.Get("a"))
	p.Put("missing", &v)
	assert.False(t, p.Has("missing"), "Put adds no target")

	p.Set([]string{"a"})
	assert.False(t, p.Has("down"))
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(forgotten) == 1 }, 5*time.Second, time.Millisecond)
	assert.Equal(t, []string{"down"}, forgotten, "a removed target is forgotten once its loop ends")
	assert.Equal(t, 42, *p.Get("a"), "a kept target keeps its value")

	assert.Error(t, p.Run(context.Background()), "one Run at a time")
}

// The readers look targets up in a copy made when they change: every Set
// that adds or removes one must be seen at once, and a target removed and
// set again must read as new, not as the one removed.
func TestReadersSeeEverySet(t *testing.T) {
	p := New(time.Hour, (&counter{calls: map[string]int{}}).check)
	v := 7
	p.Set([]string{"a"})
	p.Put("a", &v)
	require.Equal(t, 7, *p.Get("a"))

	p.Set([]string{"a", "b"})
	assert.True(t, p.Has("b"), "an added target is seen")
	assert.Nil(t, p.Get("b"))
	assert.Equal(t, 7, *p.Get("a"), "a kept target keeps its value")

	p.Set([]string{"b"})
	assert.False(t, p.Has("a"), "a removed target is gone")
	assert.Nil(t, p.Get("a"))
	p.Put("a", &v)
	assert.Nil(t, p.Get("a"), "Put does not bring a removed target back")

	p.Set([]string{"a", "b"})
	assert.True(t, p.Has("a"))
	assert.Nil(t, p.Get("a"), "a target set again starts with no value")
}

// A Ref reads its target's latest value while the targets are those of
// the version it was made in; a change of the targets changes the
// version, so that a reader who keeps Refs looks them up again.
func TestRefsReadTheirTargetsUntilTheTargetsChange(t *testing.T) {
	p := New(time.Hour, (&counter{calls: map[string]int{}}).check)
	keys := []string{"a", "b", "none"}
	p.Set([]string{"a", "b"})
	refs := make([]Ref[int], len(keys))
	version := p.Refs(func(i int) string { return keys[i] }, refs)
	require.Equal(t, version, p.Version())
	assert.Nil(t, refs[0].Load(), "no value yet")
	assert.Nil(t, refs[2].Load(), "a key that is no target has no value")
	assert.Nil(t, Ref[int]{}.Load())

	one, two := 1, 2
	p.Put("a", &one)
	assert.Equal(t, 1, *refs[0].Load(), "a Ref reads the latest value")
	p.Put("a", &two)
	assert.Equal(t, 2, *refs[0].Load())

	p.Set([]string{"b", "a", "", "a"})
	assert.Equal(t, version, p.Version(), "a Set that changes nothing keeps the version")
	p.Set([]string{"a", "a"})
	assert.False(t, p.Has("b"), "a repeated key does not stand for another target")
	assert.NotEqual(t, version, p.Version())
	p.Set([]string{"a", "b"})
	version = p.Version()

	p.Set([]string{"b"})
	assert.NotEqual(t, version, p.Version(), "removing a target changes the version")
	version = p.Version()
	p.Set([]string{"a", "b"})
	assert.NotEqual(t, version, p.Version(), "adding one changes it")
	p.Put("a", &one)
	assert.Equal(t, 2, *refs[0].Load(), "the old Ref reads the target removed, not the new one")
	p.Refs(func(i int) string { return keys[i] }, refs)
	assert.Equal(t, 1, *refs[0].Load(), "looked up again, it reads the new one")
}

// BenchmarkSet is the targets set again as an export change at 1,000
// clusters x 10 pools sets them: one-change with one of 10,000 replaced,
// which publishes them anew; same as they were (a new routing table of
// the same EPPs).
func BenchmarkSet(b *testing.B) {
	keys := make([]string, 10000)
	for i := range keys {
		keys[i] = fmt.Sprintf("127.1.%d.%d:9003", i>>8, i&255)
	}
	other := slices.Clone(keys)
	other[0] = "127.2.0.0:9003"
	b.Run("one-change", func(b *testing.B) {
		p := New(time.Hour, (&counter{calls: map[string]int{}}).check)
		p.Set(keys)
		for k := 0; b.Loop(); k++ {
			if k%2 == 0 {
				p.Set(other)
			} else {
				p.Set(keys)
			}
		}
	})
	b.Run("same", func(b *testing.B) {
		p := New(time.Hour, (&counter{calls: map[string]int{}}).check)
		p.Set(keys)
		for b.Loop() {
			p.Set(keys)
		}
	})
}
