package routingpolicy

import (
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
)

// Validate checks a configuration however it was made (Parse, Named, or
// written in code): every filter, scorer and picker known and given once,
// weights above 0 and at most 1000, margins off (-1) or from 0 to 1000, at least one filter,
// a scorer for the pickers that order by score, and a home bound (from 1
// to MaxHomeBound) only with max-score or two-choices. Its errors wrap
// ErrSyntax, as Parse's do.
func (c Config) Validate() error {
	if c.Picker >= numPickers {
		return fmt.Errorf("%w: unknown picker %d", ErrSyntax, c.Picker)
	}
	if len(c.Filters) == 0 {
		return fmt.Errorf("%w: no filter; want some of %v", ErrSyntax, filterNames)
	}
	for i, f := range c.Filters {
		if f >= NumFilters {
			return fmt.Errorf("%w: unknown filter %d", ErrSyntax, f)
		}
		if slices.Contains(c.Filters[:i], f) {
			return fmt.Errorf("%w: filter %s given twice", ErrSyntax, f)
		}
	}
	for i, s := range c.Scorers {
		if s.Scorer >= NumScorers {
			return fmt.Errorf("%w: unknown scorer %d", ErrSyntax, s.Scorer)
		}
		if !(s.Weight > 0 && s.Weight <= maxWeight) {
			return fmt.Errorf("%w: weight %v of %s is not a number above 0 and at most %d", ErrSyntax, s.Weight, s.Scorer, maxWeight)
		}
		if slices.ContainsFunc(c.Scorers[:i], func(o WeightedScorer) bool { return o.Scorer == s.Scorer }) {
			return fmt.Errorf("%w: scorer %s given twice", ErrSyntax, s.Scorer)
		}
	}
	for _, m := range []struct {
		name  string
		value float64
	}{{"affinity-margin", c.AffinityMargin}, {"queue-margin", c.QueueMargin}} {
		if m.value != -1 && !(m.value >= 0 && m.value <= maxWeight) {
			return fmt.Errorf("%w: %s %v is not off (-1) or a number from 0 to %d", ErrSyntax, m.name, m.value, maxWeight)
		}
	}
	if len(c.Scorers) == 0 && (c.Picker == PickMaxScore || c.Picker == PickTwoChoices) {
		return fmt.Errorf("%w: picker %s needs at least one scorer", ErrSyntax, c.Picker)
	}
	if math.IsNaN(c.HomeBound) || c.HomeBound != 0 && (c.HomeBound < 1 || c.HomeBound > MaxHomeBound) {
		return fmt.Errorf("%w: home bound %v is not 0 (none) or from 1 to %d", ErrSyntax, c.HomeBound, MaxHomeBound)
	}
	if c.HomeBound > 0 && c.Picker != PickMaxScore && c.Picker != PickTwoChoices {
		return fmt.Errorf("%w: home-bound needs the max-score or two-choices picker, not %s", ErrSyntax, c.Picker)
	}
	return nil
}

// Canonical is the configuration in the one form every reader takes alike:
// its name when it is a named configuration unchanged, else every item
// written out in a fixed order (scorers as given, then pick, filters,
// affinity-margin, queue-margin, home-bound, then prefix-reports=off when
// set: readers of releases before the reports take the default, on, as
// not reading them), so that no default of a
// reader's version fills in what the writer's meant. Parse reads it back to
// the same configuration. It is what mci-apiserver serves on an import, so
// that an inline configuration crosses clusters as the exporter wrote it.
func (c Config) Canonical() string {
	if n, ok := Named()[c.Name]; ok && reflect.DeepEqual(n, c) {
		return c.Name
	}
	var b strings.Builder
	for _, s := range c.Scorers {
		fmt.Fprintf(&b, "%s=%s,", s.Scorer, formatNumber(s.Weight))
	}
	fmt.Fprintf(&b, "pick=%s,filters=", c.Picker)
	for i, f := range c.Filters {
		if i > 0 {
			b.WriteByte('+')
		}
		b.WriteString(f.String())
	}
	fmt.Fprintf(&b, ",affinity-margin=%s,queue-margin=%s,home-bound=", formatMargin(c.AffinityMargin), formatMargin(c.QueueMargin))
	if c.HomeBound == 0 {
		b.WriteString("off")
	} else {
		b.WriteString(formatNumber(c.HomeBound))
	}
	if c.IgnorePrefixReports {
		b.WriteString(",prefix-reports=off")
	}
	return b.String()
}

// formatMargin writes a margin as Parse reads it: off when negative.
func formatMargin(m float64) string {
	if m < 0 {
		return "off"
	}
	return formatNumber(m)
}

func formatNumber(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
