package imports

import (
	"strconv"
	"unicode/utf8"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// MaxConditionMessageBytes is the longest message a metav1.Condition may
// carry (the API's validation and OpenAPI maxLength: 32 KiB). Messages quote
// what members hold, an annotation value of up to 256 KiB among them, so a
// longer one is shortened rather than served as an invalid object.
const MaxConditionMessageBytes = 32 * 1024

// verdict is a condition before it has a type and a generation: whether it
// holds, a CamelCase reason and a message a person can act on.
type verdict struct {
	ok      bool
	reason  string
	message string
}

// condition turns a verdict into a condition. LastTransitionTime is left
// zero on purpose: the computation has no clock and must give the same
// answer on every replica; the server fills it with CarryTransitionTimes.
func (v verdict) condition(conditionType string, generation int64) metav1.Condition {
	status := metav1.ConditionFalse
	if v.ok {
		status = metav1.ConditionTrue
	}
	return metav1.Condition{
		Type:               conditionType,
		Status:             status,
		ObservedGeneration: generation,
		Reason:             v.reason,
		Message:            truncateMessage(v.message, MaxConditionMessageBytes),
	}
}

// truncateMessage shortens a message longer than limit bytes by cutting out
// its middle, marked with how many bytes were left out. The middle, because
// both ends matter: messages begin with what is wrong and end with what to
// do ("...; the only allowed value is ..."), while what grows without bound
// is a quoted value or a list in between. Cuts fall on UTF-8 boundaries, so
// the result stays valid text; it is deterministic, as every replica must
// serve the same message.
func truncateMessage(msg string, limit int) string {
	if len(msg) <= limit {
		return msg
	}
	// The marker's length depends on the number it carries; the largest
	// number it can carry is len(msg), so reserving for that is enough.
	reserve := len(elision(len(msg)))
	if limit <= reserve {
		return validPrefix(msg, limit)
	}
	keep := limit - reserve
	head := validPrefix(msg, keep-keep/4)
	tail := validSuffix(msg, keep/4)
	return head + elision(len(msg)-len(head)-len(tail)) + tail
}

func elision(n int) string {
	return " [... " + strconv.Itoa(n) + " bytes left out ...] "
}

// validPrefix is the longest prefix of s of at most n bytes that does not
// end inside a UTF-8 sequence.
func validPrefix(s string, n int) string {
	if n >= len(s) {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// validSuffix is the longest suffix of s of at most n bytes that does not
// begin inside a UTF-8 sequence.
func validSuffix(s string, n int) string {
	if n >= len(s) {
		return s
	}
	i := len(s) - n
	for i < len(s) && !utf8.RuneStart(s[i]) {
		i++
	}
	return s[i:]
}
