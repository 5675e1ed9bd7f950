package metrics

import (
	"fmt"
	"strings"
	"testing"
)

// largeExposition is the V1 fixture plus the bulk of a real vLLM /metrics
// page: a dozen latency and token histograms of 30 buckets each.
func largeExposition(b *testing.B) string {
	var sb strings.Builder
	sb.WriteString(readFixture(b, "vllm-v1.txt"))
	for h := range 12 {
		name := fmt.Sprintf("vllm:histogram_%d_seconds", h)
		fmt.Fprintf(&sb, "# HELP %s A latency histogram.\n# TYPE %s histogram\n", name, name)
		for le := range 30 {
			fmt.Fprintf(&sb, "%s_bucket{engine=\"0\",le=\"%g\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} %d\n", name, float64(le)*0.05, le*10)
		}
		fmt.Fprintf(&sb, "%s_bucket{engine=\"0\",le=\"+Inf\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 300\n", name)
		fmt.Fprintf(&sb, "%s_count{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 300\n", name)
		fmt.Fprintf(&sb, "%s_sum{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 42.5\n", name)
	}
	return sb.String()
}

func BenchmarkParse(b *testing.B) {
	for _, bc := range []struct {
		name string
		text string
	}{
		{"fixture", readFixture(b, "vllm-v1.txt")},
		{"large", largeExposition(b)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(int64(len(bc.text)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Parse(strings.NewReader(bc.text)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
