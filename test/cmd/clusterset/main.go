// Command clusterset runs the local ClusterSet of package test/localclusterset in
// the background, for `make clusterset-up` and `make run`:
//
//	clusterset up [--clusters=N | --names=a,b,c] [--dir=_output/clusterset] [--mci-apiserver=_output/bin/mci-apiserver]
//	              [--member-summaries=auto|never] [--summary-reader-only] [--reader-identities] [--watch-history-size=N]
//	clusterset down [--dir=_output/clusterset]
//	clusterset status [--dir=_output/clusterset]
//	clusterset apply-examples [--dir=_output/clusterset] [--examples=artifacts/examples] [--datapath [--datapath-loopback-block=90]]
//	clusterset leave|join --member=NAME [--dir=_output/clusterset]
//
// `up` returns once every server is ready and leaves them running; running
// it again reuses a healthy ClusterSet (restarting the mci-apiservers if
// their binary was rebuilt). `down` stops exactly the servers `up` recorded.
// `apply-examples` applies each folder of --examples to the cluster of the
// same name, status included, since no controller that would write it runs; with
// --datapath it then starts the data path (clusterset.StartDataPath):
// model-server simulators behind mci-epp in the exporting clusters,
// mci-sidecar and an Envoy-like gateway in cluster-b, so that a request to
// cluster-b's gateway reaches a model server of another cluster. `leave`
// takes a member out of the ClusterSet as every mci-apiserver sees it, and
// `join` puts it back (the conformance suite's --member-leave-command and
// --member-join-command).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/mci-dev/mci/test/localclusterset"
)

const (
	defaultDir          = "_output/clusterset"
	defaultMCIAPIServer = "_output/bin/mci-apiserver"
	defaultExamples     = "artifacts/examples"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch cmd, args := os.Args[1], os.Args[2:]; cmd {
	case "up":
		err = up(ctx, args)
	case "down":
		err = down(args)
	case "status":
		err = status(ctx, args)
	case "apply-examples":
		err = applyExamples(ctx, args)
	case "leave", "join":
		err = membership(ctx, cmd, args)
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, `usage:
  clusterset up [--clusters=N | --names=a,b,c] [--dir=`+defaultDir+`] [--mci-apiserver=`+defaultMCIAPIServer+`]
                [--member-summaries=auto|never] [--summary-reader-only] [--reader-identities]
                [--member-labels=<member>:<key>=<value>,... ...]
  clusterset down [--dir=`+defaultDir+`]
  clusterset status [--dir=`+defaultDir+`]
  clusterset apply-examples [--dir=`+defaultDir+`] [--examples=`+defaultExamples+`] [--datapath [--datapath-loopback-block=90]]
  clusterset leave|join --member=NAME [--dir=`+defaultDir+`]`)
	os.Exit(2)
}

func up(ctx context.Context, args []string) error {
	flags := flag.NewFlagSet("up", flag.ExitOnError)
	dir := flags.String("dir", defaultDir, "directory for certificates, kubeconfigs, etcd data, logs and state")
	count := flags.Int("clusters", 0, "number of member clusters, named cluster-a, cluster-b, ... (default 3)")
	names := flags.String("names", "", "comma-separated member cluster names, instead of --clusters")
	mci := flags.String("mci-apiserver", defaultMCIAPIServer, `mci-apiserver binary to run in every cluster; "" runs none`)
	summaries := flags.String("member-summaries", "", "every mci-apiserver's --member-summaries: auto (summary mode, the default) or never (full mode)")
	watchHistory := flags.Int("watch-history-size", 0, "every mci-apiserver's --watch-history-size (default: the server's)")
	summaryReaderOnly := flags.Bool("summary-reader-only", false, "grant the member identity the read of mci-apiserver's summaries only, so that summary mode is the only one that works")
	readerIdentities := flags.Bool("reader-identities", false, "each cluster's mci-apiservers read the others with an identity of their own that names them, as scoped exports need in summary mode")
	memberLabels := map[string]map[string]string{}
	flags.Func("member-labels", "labels of one member, as <member>:<key>=<value>,... (<member>: for none): every mci-apiserver then finds that member in a member Secret with these labels, so that exports can be scoped by selector; repeat it per member", func(v string) error {
		member, list, ok := strings.Cut(v, ":")
		if !ok || member == "" {
			return fmt.Errorf("%q is not <member>:<key>=<value>,...", v)
		}
		set, err := labels.ConvertSelectorToLabelsMap(list)
		if err != nil {
			return fmt.Errorf("labels of %s: %w", member, err)
		}
		memberLabels[member] = set
		return nil
	})
	_ = flags.Parse(args)

	opts := localclusterset.Options{Dir: *dir, Detached: true, Log: os.Stderr, MemberSummaries: *summaries, SummaryReaderOnly: *summaryReaderOnly, ReaderIdentities: *readerIdentities, WatchHistorySize: *watchHistory, MemberLabels: memberLabels}
	switch {
	case *count != 0 && *names != "":
		return errors.New("give --clusters or --names, not both")
	case *names != "":
		opts.Clusters = strings.Split(*names, ",")
	case *count < 0 || *count > 26:
		return fmt.Errorf("--clusters=%d: want 1 to 26", *count)
	case *count > 0:
		for i := range *count {
			opts.Clusters = append(opts.Clusters, "cluster-"+string(rune('a'+i)))
		}
	}
	opts.MCIAPIServerBinary = *mci
	if !flagSet(flags, "mci-apiserver") {
		// The default path is only used when something was built there: the
		// clusters are useful without mci-apiserver too.
		if _, err := os.Stat(*mci); errors.Is(err, fs.ErrNotExist) {
			fmt.Fprintf(os.Stderr, "no %s: starting the clusters without mci-apiserver\n", *mci)
			opts.MCIAPIServerBinary = ""
		}
	}

	fmt.Fprintln(os.Stderr, "starting the local ClusterSet in", *dir)
	cs, err := localclusterset.Up(ctx, opts)
	if err != nil {
		if _, statErr := os.Stat(filepath.Join(*dir, "logs")); statErr == nil {
			err = fmt.Errorf("%w\nlogs are in %s", err, filepath.Join(*dir, "logs"))
		}
		return err
	}
	var kubeconfigs []string
	fmt.Println()
	for _, c := range cs.Clusters {
		fmt.Printf("%-12s %s  kubeconfig %s\n", c.Name, c.Server, c.Kubeconfig)
		kubeconfigs = append(kubeconfigs, c.Kubeconfig)
	}
	fmt.Printf("logs in %s; stop with: go run ./test/cmd/clusterset down --dir=%s\n\n", filepath.Join(cs.Dir, "logs"), *dir)
	fmt.Printf("export KUBECONFIG=%s\n", strings.Join(kubeconfigs, ":"))
	fmt.Printf("kubectl --context %s get inferencepoolimports -A\n", cs.Clusters[len(cs.Clusters)-1].Name)
	return nil
}

func down(args []string) error {
	flags := flag.NewFlagSet("down", flag.ExitOnError)
	dir := flags.String("dir", defaultDir, "directory of the ClusterSet")
	_ = flags.Parse(args)
	if _, err := os.Stat(filepath.Join(*dir, "state.json")); errors.Is(err, fs.ErrNotExist) {
		fmt.Fprintln(os.Stderr, "no ClusterSet runs from", *dir)
		return nil
	}
	if err := localclusterset.Down(*dir); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "stopped the ClusterSet in %s (logs and kubeconfigs kept)\n", *dir)
	return nil
}

func status(ctx context.Context, args []string) error {
	flags := flag.NewFlagSet("status", flag.ExitOnError)
	dir := flags.String("dir", defaultDir, "directory of the ClusterSet")
	_ = flags.Parse(args)
	cs, err := localclusterset.Load(*dir)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("no ClusterSet runs from %s", *dir)
	}
	if err != nil {
		return err
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "SERVER\tPID\tADDRESS\tSTATE\tLOG")
	for _, p := range cs.Processes() {
		state := "running"
		if !p.Alive {
			state = "DEAD"
		}
		fmt.Fprintf(w, "%s\t%d\t127.0.0.1:%d\t%s\t%s\n", p.Name, p.PID, p.Port, state, p.Log)
	}
	for _, p := range cs.DataPathServers() {
		state := "running"
		if !p.Alive {
			state = "DEAD"
		}
		fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%s\n", p.Name, p.PID, p.Address, state, p.Log)
	}
	_ = w.Flush()
	fmt.Println()
	for _, c := range cs.Clusters {
		fmt.Printf("%-12s kubeconfig %s\n", c.Name, c.Kubeconfig)
	}
	if err := cs.Healthy(ctx); err != nil {
		return fmt.Errorf("unhealthy:\n%w", err)
	}
	fmt.Println("healthy")
	return nil
}

// membership takes a member out of the ClusterSet (leave) or puts it back
// (join).
func membership(ctx context.Context, cmd string, args []string) error {
	flags := flag.NewFlagSet(cmd, flag.ExitOnError)
	dir := flags.String("dir", defaultDir, "directory of the ClusterSet")
	member := flags.String("member", "", "the member cluster that leaves or joins")
	_ = flags.Parse(args)
	if *member == "" {
		return fmt.Errorf("%s: --member is required", cmd)
	}
	cs, err := localclusterset.Load(*dir)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("no ClusterSet runs from %s", *dir)
	}
	if err != nil {
		return err
	}
	if cmd == "leave" {
		err = cs.Leave(ctx, *member)
	} else {
		err = cs.Join(ctx, *member)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "%s: %s\n", *member, map[string]string{"leave": "left the ClusterSet", "join": "joined the ClusterSet"}[cmd])
	return nil
}

func applyExamples(ctx context.Context, args []string) error {
	flags := flag.NewFlagSet("apply-examples", flag.ExitOnError)
	dir := flags.String("dir", defaultDir, "directory of the ClusterSet")
	examples := flags.String("examples", defaultExamples, "directory with one folder of manifests per cluster, named after it")
	datapath := flags.Bool("datapath", false, "then start the data path: model-server simulators behind mci-epp in every cluster but cluster-b, mci-sidecar and a gateway in cluster-b")
	block := flags.Int("datapath-loopback-block", localclusterset.DefaultDataPathLoopbackBlock, "the data path of the i-th cluster listens on 127.0.<block+i>.0/24")
	binDir := flags.String("datapath-bin-dir", "", "directory of mci-epp, mci-sidecar, simulator and gateway (default: the ClusterSet's)")
	_ = flags.Parse(args)
	cs, err := localclusterset.Load(*dir)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("no ClusterSet runs from %s: start one with `go run ./test/cmd/clusterset up`", *dir)
	}
	if err != nil {
		return err
	}
	entries, err := os.ReadDir(*examples)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		if _, err := cs.Cluster(e.Name()); err != nil {
			fmt.Fprintf(os.Stderr, "skipping %s: the ClusterSet has no cluster %s\n", filepath.Join(*examples, e.Name()), e.Name())
			continue
		}
		applied, err := cs.ApplyFiles(ctx, e.Name(), filepath.Join(*examples, e.Name()))
		for _, what := range applied {
			fmt.Fprintf(os.Stderr, "%s: applied %s\n", e.Name(), what)
		}
		if err != nil {
			return err
		}
	}
	if _, err := cs.Cluster("cluster-b"); *datapath && (err != nil || len(cs.Clusters) < 2) {
		fmt.Fprintln(os.Stderr, "skipping the data path: it needs a cluster-b for the gateway and another cluster to export a pool")
		*datapath = false
	}
	if !*datapath {
		printTryThis(cs, nil)
		return nil
	}
	fmt.Fprintln(os.Stderr, "starting the data path")
	dp, err := cs.StartDataPath(ctx, localclusterset.DataPathOptions{LoopbackBlock: *block, BinDir: *binDir, Log: os.Stderr})
	if err != nil {
		return fmt.Errorf("%w\n(if another data path uses 127.0.%d.x, move this one with `make run DATAPATH_LOOPBACK_BLOCK=<n>`)", err, *block)
	}
	printTryThis(cs, dp)
	return nil
}

// printTryThis tells the user what to look at once the examples are in.
func printTryThis(cs *localclusterset.ClusterSet, dp *localclusterset.DataPath) {
	kubeconfig := func(name string) string {
		c, err := cs.Cluster(name)
		if err != nil {
			return "<no " + name + ">"
		}
		return c.Kubeconfig
	}
	fmt.Printf(`
The examples are in: cluster-a exports example/llm-pool (EndpointMode), cluster-c
exports the same name (ParentMode), cluster-b imports it. Try:

  export KUBECONFIG=%s
  kubectl get inferencepoolimports -A            # short names: ipimp, infpimp
  kubectl get ipimp -n example llm-pool -o yaml  # status.clusters[] and status.controllers[]
  kubectl get ipimp -A -w                        # then, in another shell, withdraw cluster-a's export:
    kubectl --kubeconfig %s -n example annotate inferencepool llm-pool inference.networking.x-k8s.io/export-
  kubectl explain inferencepoolimport.status.clusters
  kubectl --kubeconfig %s get inferencepoolexports -A -o wide
`, kubeconfig("cluster-b"), kubeconfig("cluster-a"), kubeconfig("cluster-a"))
	if dp != nil {
		printDataPath(cs, dp)
	}
	fmt.Printf("\nStop everything with: make clusterset-down\n")
}

// printDataPath tells the user how to send a request through the data path.
func printDataPath(cs *localclusterset.ClusterSet, dp *localclusterset.DataPath) {
	var servers []string
	for _, c := range cs.Names() {
		servers = append(servers, dp.ModelServers[c]...)
	}
	logs := filepath.Join(cs.Dir, "logs")
	fmt.Printf(`
The data path runs: %s's gateway on %s asks its mci-sidecar over
ext_proc; the sidecar picks a cluster of the InferencePoolImport %s/%s and
asks that cluster's mci-epp for one of its model servers:
  %s
Send a request:

  curl -s %s -H 'Content-Type: application/json' \
    -d '%s'

The answer's "instance" (and header X-Simulator-Instance) names the model
server that served it. Then:

  kubectl get ipimp -n %s %s -o yaml     # the clusters the sidecar routes to
  go run ./test/cmd/clusterset status --dir=%s   # every server, its address and log
  tail -f %s/%s-mci-sidecar.log %s/%s-gateway.log
`, dp.GatewayCluster, dp.GatewayURL, dp.Namespace, dp.Pool, strings.Join(servers, ", "),
		dp.CompletionURL(), dp.CompletionBody(),
		dp.Namespace, dp.Pool, cs.Dir,
		logs, dp.GatewayCluster, logs, dp.GatewayCluster)
}

func flagSet(flags *flag.FlagSet, name string) bool {
	set := false
	flags.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
