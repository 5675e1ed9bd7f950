package localclusterset

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Options says what ClusterSet to run and where.
type Options struct {
	// Dir holds everything: certificates, kubeconfigs, etcd data, logs and,
	// when Detached, state.json. Required.
	Dir string
	// Clusters are the member cluster names; DefaultClusters when empty.
	Clusters []string
	// BinDir holds kube-apiserver, kube-controller-manager and etcd
	// (hack/build-kube-tools.sh);
	// BinDir() ($MCI_BIN_DIR, else _output/bin of this repository) when
	// empty.
	BinDir string
	// MCIAPIServerBinary is the mci-apiserver to run in every cluster;
	// empty runs none.
	MCIAPIServerBinary string
	// Replicas is how many mci-apiservers run in every cluster; 1 when 0.
	// The APIService points at a TCP front on loopback that plays the
	// Service: it spreads connections over the replicas whose /readyz
	// answers, as kube-proxy does over ready endpoints. The front runs in
	// the calling process, so a Detached ClusterSet has none (its one
	// replica is dialled directly) and Replicas > 1 cannot be Detached.
	Replicas int
	// MemberUnreachableAfter is every mci-apiserver's
	// --member-unreachable-after; the server's default when 0.
	MemberUnreachableAfter time.Duration
	// MemberRemoveAfter is every mci-apiserver's --member-remove-after, the
	// server's default when 0. The server requires it to exceed
	// --member-unreachable-after (whose default is 10s).
	MemberRemoveAfter time.Duration
	// MemberSummaries is every mci-apiserver's --member-summaries ("auto"
	// or "never"), the server's default (auto) when empty.
	MemberSummaries string
	// MemberSummariesOf overrides MemberSummaries for the clusters it
	// names, so that one ClusterSet can hold readers of both modes side by
	// side (the benchmark compares them on the same changes).
	MemberSummariesOf map[string]string
	// WatchHistorySize is every mci-apiserver's --watch-history-size, the
	// server's default when 0: a short history lets a test outrun it
	// (the conformance suite's 410 Gone test).
	WatchHistorySize int
	// SummaryReaderOnly grants the identity of the members/ kubeconfigs
	// the read of mci-apiserver's summaries only, as a member in summary
	// mode grants the others (artifacts/deploy/mci-apiserver): an
	// mci-apiserver that still watched a member's objects would be
	// refused. Without it that identity may read both the summaries and
	// the objects, so that full mode works too.
	SummaryReaderOnly bool
	// ReaderIdentities has each cluster's mci-apiservers read the others
	// with an identity of their own that names them (group
	// mci.x-k8s.io:member:<cluster>, in members-by-reader/<cluster>/), as
	// members hand out one identity per reader for scoped exports: a
	// member outside an export's scope is not sent its summary. Without
	// it every reader shares the identity of the members/ kubeconfigs,
	// which tests edit to make members leave and join.
	ReaderIdentities bool
	// MemberLabels gives the clusters it names labels in the ClusterSet,
	// as a real ClusterSet gives a member labels on the object that makes
	// it one: every mci-apiserver finds such a member in a Secret of its
	// mci-system namespace, labelled mci.x-k8s.io/member-cluster and with
	// these labels, rather than in its member kubeconfig directory, so
	// that exports can be scoped by selector (docs/api.md). Its own
	// cluster included: a server knows its own labels from its member
	// list. Leave and Join move the Secrets too.
	MemberLabels map[string]map[string]string
	// Links puts a controllable TCP proxy on each link between an
	// mci-apiserver and a member it watches, between a test client and each
	// kube-apiserver, and (with StartDataPath) between mci-sidecar and each
	// EPP: see MemberLink, ClientLink, EPPLink. The proxies run in the
	// calling process, so Links cannot be Detached.
	Links bool
	// Detached servers outlive the calling process (`make clusterset-up`):
	// they run in their own session, are recorded in <Dir>/state.json, and
	// Down stops them. Up then reuses a healthy ClusterSet found in Dir.
	Detached bool
	// Log receives progress lines; nothing is printed when nil.
	Log io.Writer
	// CRDPaths are YAML files or directories of CRDs to install in every
	// cluster; the project's CRDs and the Gateway API standard CRDs when
	// empty.
	CRDPaths []string
}

func (o *Options) complete() error {
	if o.Log == nil {
		o.Log = io.Discard
	}
	if o.Dir == "" {
		return errors.New("clusterset: Options.Dir is required")
	}
	var err error
	if o.Dir, err = filepath.Abs(o.Dir); err != nil {
		return fmt.Errorf("clusterset: %w", err)
	}
	if len(o.Clusters) == 0 {
		o.Clusters = slices.Clone(DefaultClusters)
	}
	seen := map[string]bool{}
	for _, c := range o.Clusters {
		if errs := validation.IsDNS1123Label(c); len(errs) > 0 {
			return fmt.Errorf("clusterset: cluster name %q: %s", c, strings.Join(errs, "; "))
		}
		if seen[c] {
			return fmt.Errorf("clusterset: cluster %q named twice", c)
		}
		seen[c] = true
	}
	for c, set := range o.MemberLabels {
		if !seen[c] {
			return fmt.Errorf("clusterset: Options.MemberLabels names %q, which is not a cluster", c)
		}
		for k, v := range set {
			if errs := append(validation.IsQualifiedName(k), validation.IsValidLabelValue(v)...); len(errs) > 0 || k == memberClusterLabel {
				return fmt.Errorf("clusterset: Options.MemberLabels of %s: %s=%s is not a label it may have: %s", c, k, v, strings.Join(errs, "; "))
			}
		}
	}
	switch {
	case o.Replicas == 0:
		o.Replicas = 1
	case o.Replicas < 0:
		return fmt.Errorf("clusterset: Options.Replicas is %d", o.Replicas)
	case o.Replicas > 1 && o.Detached:
		return errors.New("clusterset: Options.Replicas > 1 needs an attached ClusterSet: the front that spreads connections over the replicas runs in the calling process")
	}
	if o.Links && o.Detached {
		return errors.New("clusterset: Options.Links needs an attached ClusterSet: the link proxies run in the calling process")
	}
	if o.MemberUnreachableAfter < 0 {
		return fmt.Errorf("clusterset: Options.MemberUnreachableAfter is %s", o.MemberUnreachableAfter)
	}
	// Said here rather than as an mci-apiserver that exits at start-up.
	switch {
	case o.MemberRemoveAfter < 0:
		return fmt.Errorf("clusterset: Options.MemberRemoveAfter is %s", o.MemberRemoveAfter)
	case o.MemberRemoveAfter > 0 && o.MemberUnreachableAfter > 0 && o.MemberRemoveAfter <= o.MemberUnreachableAfter:
		return fmt.Errorf("clusterset: Options.MemberRemoveAfter (%s) must exceed Options.MemberUnreachableAfter (%s)", o.MemberRemoveAfter, o.MemberUnreachableAfter)
	}
	if o.BinDir == "" {
		if o.BinDir, err = BinDir(); err != nil {
			return fmt.Errorf("clusterset: %w", err)
		}
	}
	var root string
	if len(o.CRDPaths) == 0 {
		if root, err = repoRoot(); err != nil {
			return err
		}
	}
	if o.BinDir, err = filepath.Abs(o.BinDir); err != nil {
		return fmt.Errorf("clusterset: %w", err)
	}
	for _, b := range kubeTools {
		if err := executable(filepath.Join(o.BinDir, b)); err != nil {
			return fmt.Errorf("clusterset: %w; build it with hack/build-kube-tools.sh (the first build takes several minutes)", err)
		}
	}
	if o.MCIAPIServerBinary != "" {
		if o.MCIAPIServerBinary, err = filepath.Abs(o.MCIAPIServerBinary); err != nil {
			return fmt.Errorf("clusterset: %w", err)
		}
		if err := executable(o.MCIAPIServerBinary); err != nil {
			return fmt.Errorf("clusterset: %w; build it with `go build -o %s ./cmd/mci-apiserver`", err, o.MCIAPIServerBinary)
		}
	}
	if len(o.CRDPaths) == 0 {
		if o.CRDPaths, err = defaultCRDPaths(root); err != nil {
			return fmt.Errorf("clusterset: %w", err)
		}
	}
	return nil
}

// kubeTools are the binaries hack/build-kube-tools.sh builds and every
// ClusterSet runs.
var kubeTools = []string{"etcd", "kube-apiserver", "kube-controller-manager"}

func executable(path string) error {
	info, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("%s not found", path)
	}
	if info.IsDir() || info.Mode()&0o111 == 0 {
		return fmt.Errorf("%s is not an executable file", path)
	}
	return nil
}

const modulePath = "github.com/mci-dev/mci"

// repoRoot finds this repository from the working directory, which is a
// package directory under `go test` and the repository under `go run`.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && slices.Contains(strings.Split(string(data), "\n"), "module "+modulePath) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("clusterset: not inside the github.com/mci-dev/mci repository; set Options.BinDir and Options.CRDPaths")
		}
		dir = parent
	}
}

// summariesFor is cluster's --member-summaries: its own when set, else
// every server's.
func (f mciServerFlags) summariesFor(cluster string) string {
	if mode, ok := f.summariesOf[cluster]; ok {
		return mode
	}
	return f.memberSummaries
}
