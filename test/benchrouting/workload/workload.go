// Package workload generates the seeded request stream of the routing
// benchmark (test/benchrouting): multi-turn chat conversations whose every
// turn resends the whole history, in groups that share a long system
// prompt, mixed with one-shot requests that share no prefix with anything,
// all arriving open-loop as a Poisson process. It is pure: the same
// Profile always yields the same requests, so that every routing policy
// of a run meets the identical workload.
package workload

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"
	"unicode"
)

// Profile describes a workload.
type Profile struct {
	Seed     uint64
	Duration time.Duration
	// Rate is the mean arrival rate in requests per second.
	Rate float64
	// Groups of conversations share a system prompt of SystemTokens
	// tokens.
	Groups       int
	SystemTokens int
	// ActiveConversations are open at any time; an arrival that is not a
	// one-shot request is the next turn of one of them, picked at random.
	// A conversation that has had Turns turns closes and a new one, of a
	// random group, takes its place.
	ActiveConversations int
	Turns               int
	// UserTokens is the length of each user message; OutputTokens the
	// answer's (max_tokens), which the next turn resends as the
	// assistant's message.
	UserTokens   int
	OutputTokens int
	// OneShotShare of the arrivals are one-shot requests of OneShotTokens
	// tokens sharing no prefix (1: no shared prefixes at all).
	OneShotShare  float64
	OneShotTokens int
	// OneShotSalt starts the text of every one-shot request, so that the
	// one-shot requests of two workloads that differ only by it share
	// nothing either (same arrivals, conversations and lengths).
	OneShotSalt string
	// ConversationSalt starts the text of every conversation's messages
	// (not its system prompt), so that two profiles that differ only by
	// it have the same arrivals, groups and lengths but conversations
	// that share no block beyond their group's system prompt.
	ConversationSalt string
	// TextPrefix starts the text of every prompt (system prompts,
	// messages, one-shot requests): a population's own text, which no
	// other population's shares a block with.
	TextPrefix string
	// Users, when set, split the workload into populations that enter
	// in different places (Population); nil: one population, whose
	// requests have no Entry.
	Users []Population
	// SharedSystemPrompts: the populations' conversations open with the
	// same Groups system prompts, each population drawing from all of
	// them (one application whose users reach it through several
	// clusters); their messages stay their own.
	SharedSystemPrompts bool
}

// Validate reports what makes p unusable.
func (p Profile) Validate() error {
	var errs []error
	if p.Duration <= 0 {
		errs = append(errs, fmt.Errorf("duration %s is not positive", p.Duration))
	}
	if !(p.Rate > 0) || p.Rate > 10000 {
		errs = append(errs, fmt.Errorf("rate %v is not between 0 and 10000 requests per second", p.Rate))
	}
	if !(p.OneShotShare >= 0 && p.OneShotShare <= 1) {
		errs = append(errs, fmt.Errorf("one-shot share %v is not between 0 and 1", p.OneShotShare))
	}
	if p.OneShotShare > 0 && p.OneShotTokens < 1 {
		errs = append(errs, fmt.Errorf("one-shot requests of %d tokens", p.OneShotTokens))
	}
	if p.OneShotShare < 1 {
		for name, v := range map[string]int{"groups": p.Groups, "active conversations": p.ActiveConversations, "turns": p.Turns, "user tokens": p.UserTokens} {
			if v < 1 {
				errs = append(errs, fmt.Errorf("%s %d: conversations need at least 1", name, v))
			}
		}
		if p.SystemTokens < 0 {
			errs = append(errs, fmt.Errorf("system prompt of %d tokens", p.SystemTokens))
		}
	}
	if p.OutputTokens < 1 {
		errs = append(errs, fmt.Errorf("output tokens %d: want at least 1", p.OutputTokens))
	}
	if n := p.Rate * p.Duration.Seconds(); n > 1e6 {
		errs = append(errs, fmt.Errorf("%.0f requests: want at most a million", n))
	}
	errs = append(errs, validateUsers(p.Users)...)
	return errors.Join(errs...)
}

// Message is a chat message.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// Request is one request of the workload.
type Request struct {
	Index int
	// At is when it is sent, from the start of the run.
	At time.Duration
	// Conversation and Group are -1 for a one-shot request; Turn counts
	// from 1.
	Conversation, Group, Turn int
	Messages                  []Message
	MaxTokens                 int
	// Entry is where the request enters: its population's
	// (Population.Entry); "" without populations.
	Entry string
}

// PromptTokens counts the request's tokens as the simulator does: the
// words of its messages' contents.
func (r Request) PromptTokens() int {
	n := 0
	for _, m := range r.Messages {
		n += words(m.Content)
	}
	return n
}

// words is len(strings.Fields(s)) without making the slice: calibrating
// a workload counts every request's prompt several times.
func words(s string) int {
	n, in := 0, false
	for _, r := range s {
		switch {
		case unicode.IsSpace(r):
			in = false
		case !in:
			in = true
			n++
		}
	}
	return n
}

// conversation is an open conversation: its group and history.
type conversation struct {
	id, group int
	history   []Message
}

// Generate returns the workload's requests in the order they are sent.
func Generate(p Profile) ([]Request, error) {
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("workload: %w", err)
	}
	if len(p.Users) > 0 {
		return generateUsers(p), nil
	}
	return generate(p, p.TextPrefix), nil
}

// generate is Generate of one valid population, whose system prompts'
// text opens with systemPrefix.
func generate(p Profile, systemPrefix string) []Request {
	rng := rand.New(rand.NewPCG(p.Seed, p.Seed^0x9e3779b97f4a7c15))
	systems := make([]string, p.Groups)
	for g := range systems {
		systems[g] = text(fmt.Sprintf("%ssys%d-", systemPrefix, g), p.SystemTokens)
	}
	nextID := 0
	open := func() *conversation {
		c := &conversation{id: nextID, group: rng.IntN(max(p.Groups, 1))}
		nextID++
		if p.SystemTokens > 0 {
			c.history = []Message{{Role: "system", Content: systems[c.group]}}
		}
		return c
	}
	active := make([]*conversation, max(p.ActiveConversations, 0))
	for i := range active {
		active[i] = open()
	}
	oneShots := 0

	var out []Request
	for at := exp(rng, p.Rate); at < p.Duration; at += exp(rng, p.Rate) {
		r := Request{Index: len(out), At: at, MaxTokens: p.OutputTokens}
		if len(active) == 0 || rng.Float64() < p.OneShotShare {
			r.Conversation, r.Group, r.Turn = -1, -1, 1
			r.Messages = []Message{{Role: "user", Content: text(fmt.Sprintf("%s%sonce%d-", p.TextPrefix, p.OneShotSalt, oneShots), p.OneShotTokens)}}
			oneShots++
			out = append(out, r)
			continue
		}
		slot := rng.IntN(len(active))
		c := active[slot]
		turn := len(c.history)/2 + 1 // system, then user and assistant per turn
		c.history = append(c.history, Message{Role: "user", Content: text(fmt.Sprintf("%s%sc%d-t%d-", p.TextPrefix, p.ConversationSalt, c.id, turn), p.UserTokens)})
		r.Conversation, r.Group, r.Turn = c.id, c.group, turn
		r.Messages = append([]Message(nil), c.history...)
		out = append(out, r)
		// The client resends the answer as the assistant's message; its
		// text stands for whatever the server answered.
		c.history = append(c.history, Message{Role: "assistant", Content: text(fmt.Sprintf("%s%sa%d-t%d-", p.TextPrefix, p.ConversationSalt, c.id, turn), p.OutputTokens)})
		if turn >= p.Turns {
			active[slot] = open()
		}
	}
	return out
}

// exp is the gap to the next arrival of a Poisson process of rate per
// second.
func exp(rng *rand.Rand, rate float64) time.Duration {
	return time.Duration(rng.ExpFloat64() / rate * float64(time.Second))
}

// text is n distinct words starting with prefix: a prompt no other prefix
// shares a block with.
func text(prefix string, n int) string {
	b := make([]byte, 0, n*(len(prefix)+5))
	for i := range n {
		if i > 0 {
			b = append(b, ' ')
		}
		b = strconv.AppendInt(append(b, prefix...), int64(i), 10)
	}
	return string(b)
}
