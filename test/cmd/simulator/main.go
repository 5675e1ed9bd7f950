// Command simulator runs a simulated vLLM model server (package
// test/simulator) for tests and `make run`:
//
//	simulator --listen=127.0.1.1:8000 --model=meta-llama/Llama-3.1-8B-Instruct \
//	    [--lora-adapters=lora-x,lora-y --max-lora=2] [--latency=20ms] [--concurrency=16] \
//	    [--instance-id=sim-a] [--not-ready] [--no-metadata] \
//	    [--pin-waiting=10] [--pin-running=2] [--pin-kv-cache=0.3] \
//	    [--pin-running-adapters=lora-x] [--pin-waiting-adapters=] \
//	    [--cost-model --block-tokens=16 --cache-blocks=4096 --prefill-base=5ms \
//	     --prefill-per-token=200us --decode-per-token=5ms --output-tokens=16 \
//	     --stream-chunk-tokens=4 --round-trip=0s]
//
// --cost-model, or any of the flags after it, makes requests cost prefill
// and decode time with a prefix cache (simulator.CostModel) instead of
// --latency.
// A pin flag given (even empty, for the adapter lists) fixes what /metrics
// reports; see simulator.Pins. The instance ID is --instance-id, else
// $POD_NAME, else the host name. SIGTERM or SIGINT marks the instance not
// ready and shuts down gracefully.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"k8s.io/klog/v2"

	"github.com/mci-dev/mci/test/simulator"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "simulator:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	opts, listen, err := parseFlags(args)
	if err != nil {
		return err
	}
	srv, err := simulator.New(opts)
	if err != nil {
		return err
	}
	l, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	logger := klog.FromContext(ctx)
	logger.Info("Serving", "instance", srv.InstanceID(), "address", l.Addr().String(), "model", opts.Model, "loraAdapters", opts.LoRAAdapters)
	return srv.Serve(ctx, l)
}

// parseFlags returns the simulator's options and the address to listen on.
func parseFlags(args []string) (simulator.Options, string, error) {
	fs := flag.NewFlagSet("simulator", flag.ContinueOnError)
	var (
		opts     simulator.Options
		listen   string
		adapters string
		notReady bool

		pinWaiting, pinRunning                 int
		pinKVCache                             float64
		pinRunningAdapters, pinWaitingAdapters string

		costModel bool
		cm        simulator.CostModel
	)
	fs.StringVar(&listen, "listen", "127.0.1.1:8000", "address to serve on; loopback addresses only in the local ClusterSet")
	fs.StringVar(&opts.Model, "model", "", "base model served (required)")
	fs.StringVar(&adapters, "lora-adapters", "", "comma-separated LoRA adapters the server can load")
	fs.IntVar(&opts.MaxLoRA, "max-lora", 0, fmt.Sprintf("how many LoRA adapters can be resident at once (%d when 0 and adapters are served)", simulator.DefaultMaxLoRA))
	fs.DurationVar(&opts.Latency, "latency", simulator.DefaultLatency, "how long a request runs once admitted to the batch (negative: none)")
	fs.IntVar(&opts.Concurrency, "concurrency", simulator.DefaultConcurrency, "batch size: requests beyond it wait")
	// The name vLLM and llm-d-inference-sim give the batch size; neither
	// publishes it as a metric, only vllm:num_requests_running, as this
	// simulator does.
	fs.IntVar(&opts.Concurrency, "max-num-seqs", simulator.DefaultConcurrency, "batch size, as vLLM names it: the same as --concurrency")
	fs.StringVar(&opts.InstanceID, "instance-id", "", "instance ID (default $POD_NAME, else the host name)")
	fs.BoolVar(&notReady, "not-ready", false, "start not ready (POST /admin/ready?ready=true makes it ready)")
	fs.BoolVar(&opts.NoMetadata, "no-metadata", false, "serve no seed 002 /metadata (404), as a plain vLLM server; by default /metadata names --model and --lora-adapters")
	fs.IntVar(&pinWaiting, "pin-waiting", 0, "report this many waiting requests")
	fs.IntVar(&pinRunning, "pin-running", 0, "report this many running requests")
	fs.Float64Var(&pinKVCache, "pin-kv-cache", 0, "report this KV cache usage (0 to 1)")
	fs.StringVar(&pinRunningAdapters, "pin-running-adapters", "", "report these running LoRA adapters (comma-separated)")
	fs.StringVar(&pinWaitingAdapters, "pin-waiting-adapters", "", "report these waiting LoRA adapters (comma-separated)")
	fs.BoolVar(&costModel, "cost-model", false, "cost requests by a prefill and decode model with a prefix cache instead of --latency")
	fs.IntVar(&cm.BlockTokens, "block-tokens", simulator.DefaultBlockTokens, "cost model: tokens per prefix cache block")
	fs.IntVar(&cm.CacheBlocks, "cache-blocks", simulator.DefaultCacheBlocks, "cost model: prefix cache capacity in blocks (least recently used evicted)")
	fs.DurationVar(&cm.Base, "prefill-base", 0, "cost model: fixed time to the first token")
	fs.DurationVar(&cm.PrefillPerToken, "prefill-per-token", 0, "cost model: prefill time of each uncached prompt token")
	fs.DurationVar(&cm.DecodePerToken, "decode-per-token", 0, "cost model: time of each output token after the first")
	fs.IntVar(&cm.OutputTokens, "output-tokens", simulator.DefaultOutputTokens, "cost model: answer length when a request sets no max_tokens")
	fs.IntVar(&cm.StreamChunkTokens, "stream-chunk-tokens", simulator.DefaultStreamChunkTokens, "cost model: tokens per streamed chunk")
	fs.DurationVar(&cm.RoundTrip, "round-trip", 0, "cost model: network round trip added before each response (a remote cluster's)")
	klog.InitFlags(fs)
	if err := fs.Parse(args); err != nil {
		return opts, "", err
	}
	if fs.NArg() > 0 {
		return opts, "", fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if opts.Model == "" {
		return opts, "", errors.New("--model is required")
	}
	opts.LoRAAdapters = split(adapters)
	opts.NotReady = notReady
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "pin-waiting":
			opts.Pins.Waiting = &pinWaiting
		case "pin-running":
			opts.Pins.Running = &pinRunning
		case "pin-kv-cache":
			opts.Pins.KVCacheUsage = &pinKVCache
		case "pin-running-adapters":
			opts.Pins.RunningAdapters = split(pinRunningAdapters)
		case "pin-waiting-adapters":
			opts.Pins.WaitingAdapters = split(pinWaitingAdapters)
		case "block-tokens", "cache-blocks", "prefill-base", "prefill-per-token",
			"decode-per-token", "output-tokens", "stream-chunk-tokens", "round-trip":
			costModel = true
		}
	})
	if costModel {
		opts.CostModel = &cm
	}
	return opts, listen, nil
}

// split splits a comma-separated list; an empty string is an empty, non-nil
// list, so that a pin flag given empty pins "none".
func split(list string) []string {
	out := []string{}
	for s := range strings.SplitSeq(list, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}
