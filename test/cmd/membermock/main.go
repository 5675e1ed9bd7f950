// Command membermock serves the summary API of many virtual member
// clusters (package test/membermock), for measuring one mci-apiserver
// against a fleet:
//
//	membermock --kubeconfig-dir=DIR [--members=50] [--pools=10] \
//	    [--clusterset-name=local] [--reader=cluster-x] [--namespace=fleet] \
//	    [--export-changes=0] [--flaps=0] [--membership-changes=0] \
//	    [--watch-history-size=0] [--duration=0]
//
// Each member serves at a loopback port of its own; its kubeconfig is
// written to DIR as <member>.kubeconfig, which mci-apiserver's
// --member-kubeconfig-dir reads. The members are named member-0001 and on;
// each has --pools exported pools in --namespace. --export-changes and
// --flaps are per second fleet-wide, --membership-changes per minute
// (a member that leaves has its kubeconfig removed, one that joins again
// written anew). The line "membermock: ready" is printed once every member
// serves. It runs until --duration passes (0: until SIGTERM or SIGINT).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"k8s.io/klog/v2"

	"github.com/mci-dev/mci/test/membermock"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "membermock:", err)
		os.Exit(1)
	}
}

// maxMembers bounds --members: each member is a listener and two stores.
const maxMembers = 5000

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("membermock", flag.ContinueOnError)
	dir := fs.String("kubeconfig-dir", "", "directory the members' kubeconfigs are written to (required)")
	members := fs.Int("members", 50, "how many members to serve")
	pools := fs.Int("pools", 10, "exported pools per member")
	clusterSet := fs.String("clusterset-name", "local", "the ClusterSet's name, as mci-apiserver's --clusterset-name")
	reader := fs.String("reader", "", "the cluster that reads the members, named by the readers' identity (empty: the shared identity, which names none)")
	namespace := fs.String("namespace", "fleet", "namespace of the members' pools")
	exportChanges := fs.Float64("export-changes", 0, "export changes a second, fleet-wide")
	flaps := fs.Float64("flaps", 0, "EPP readiness flaps a second, fleet-wide")
	membership := fs.Float64("membership-changes", 0, "members leaving or joining again a minute")
	history := fs.Int("watch-history-size", 0, "changes each member's watches can resume across (0: mci-apiserver's default)")
	duration := fs.Duration("duration", 0, "how long to serve (0: until a signal)")
	klog.InitFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case *dir == "":
		return errors.New("--kubeconfig-dir is required")
	case *members < 1 || *members > maxMembers:
		return fmt.Errorf("--members must be between 1 and %d", maxMembers)
	case *pools < 0 || *pools > 1000:
		return errors.New("--pools must be between 0 and 1000")
	}
	if *duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *duration)
		defer cancel()
	}
	fleet, err := membermock.NewFleet(membermock.Options{ClusterSetName: *clusterSet, Reader: *reader, HistorySize: *history})
	if err != nil {
		return err
	}
	failed := make(chan error, 1)
	go func() { failed <- fleet.Run(ctx) }()
	if err := joinAll(ctx, fleet, *members, *namespace, *pools); err != nil {
		return err
	}
	if err := fleet.WriteKubeconfigs(*dir); err != nil {
		return err
	}
	fmt.Println("membermock: ready")
	fleet.RunChurn(ctx, membermock.Churn{
		Namespace:         *namespace,
		Pools:             *pools,
		ExportChanges:     *exportChanges,
		Flaps:             *flaps,
		MembershipChanges: *membership,
		Joined: func(name string) error {
			data, err := fleet.Kubeconfig(name)
			if err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(*dir, name+".kubeconfig"), data, 0o600)
		},
		Left: func(name string) error { return os.Remove(filepath.Join(*dir, name+".kubeconfig")) },
	})
	select {
	case <-ctx.Done():
		return nil
	case err := <-failed:
		return err
	}
}

// joinAll joins the members, once the fleet runs, and gives each its
// pools.
func joinAll(ctx context.Context, fleet *membermock.Fleet, members int, namespace string, pools int) error {
	for i := 1; i <= members; i++ {
		name := fmt.Sprintf("member-%04d", i)
		var m *membermock.Member
		for {
			var err error
			if m, err = fleet.Join(name); !errors.Is(err, membermock.ErrNotRunning) {
				if err != nil {
					return err
				}
				break
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(10 * time.Millisecond):
			}
		}
		if err := membermock.Populate(m, namespace, pools); err != nil {
			return err
		}
	}
	return nil
}
