package clusterset

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	clusterinventory "github.com/mci-dev/mci/pkg/apis/clusterinventory/v1alpha1"
	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	mciclient "github.com/mci-dev/mci/pkg/generated/clientset/versioned"
	mciinformers "github.com/mci-dev/mci/pkg/generated/informers/externalversions"
	"github.com/mci-dev/mci/pkg/recompute"
)

// ProfileSource follows the ClusterProfiles of one ClusterSet (those
// labelled multicluster.x-k8s.io/clusterset=<ClusterSet>) in one
// namespace of a hub cluster. Each profile is a member named after it,
// reached through the first of the operator's providers (ProviderFile)
// that the profile offers among its access providers.
type ProfileSource struct {
	// Client reaches the hub.
	Client     mciclient.Interface
	Namespace  string
	ClusterSet string
	// ProviderFile is the operator's KEP-5339 provider file, read again
	// every Interval (10s when 0) so that a mounted ConfigMap that changes
	// is followed.
	ProviderFile string
	Interval     time.Duration
}

// Name identifies the source in logs and conflicts.
func (s ProfileSource) Name() string { return "clusterprofiles:" + s.Namespace }

// Run reports the profiles' members until ctx ends.
func (s ProfileSource) Run(ctx context.Context, report func(string, map[string]MemberConfig)) {
	selector := labels.Set{clusterinventory.LabelClusterSet: s.ClusterSet}.AsSelector().String()
	factory := mciinformers.NewSharedInformerFactoryWithOptions(s.Client, 0,
		mciinformers.WithNamespace(s.Namespace),
		mciinformers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = selector }))
	informer := factory.ClusterInventory().V1alpha1().ClusterProfiles()
	lister := informer.Lister()
	loop := recompute.New("member_clusterprofiles")
	_, _ = informer.Informer().AddEventHandler(loop.Handler())
	providers := &providerFileWatch{path: s.ProviderFile}
	providers.read(ctx)
	interval := s.Interval
	if interval == 0 {
		interval = 10 * time.Second
	}
	go wait.UntilWithContext(ctx, func(ctx context.Context) {
		if providers.read(ctx) {
			loop.Notify()
		}
	}, interval)
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), informer.Informer().HasSynced) {
		return
	}
	state := newProfileState()
	loop.Run(ctx, func(ctx context.Context) error {
		profiles, err := lister.List(labels.Everything())
		if err != nil {
			return err
		}
		report(s.Name(), state.members(klog.FromContext(ctx), profiles, providers.get()))
		return nil
	})
}

// providerFileWatch holds the last provider file that could be read and
// parsed: a file that turns bad keeps the providers in use.
type providerFileWatch struct {
	path string
	mu   sync.Mutex
	data []byte
	file *ProviderFile
	err  error
}

// read reads the file again and says whether what it holds changed.
func (w *providerFileWatch) read(ctx context.Context) bool {
	data, err := os.ReadFile(w.path)
	var file *ProviderFile
	if err == nil {
		file, err = ParseProviderFile(data)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil {
		if w.err == nil || w.err.Error() != err.Error() {
			klog.FromContext(ctx).Error(err, "Reading the ClusterProfile provider file; keeping the providers read before, if any", "file", w.path)
		}
		w.err = err
		return false
	}
	w.err = nil
	if w.file != nil && bytes.Equal(data, w.data) {
		return false
	}
	w.data, w.file = data, file
	return true
}

func (w *providerFileWatch) get() *ProviderFile {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.file
}

// profileState remembers what was said of each profile, so that a problem
// or a health hint is logged and counted once per change, not once per
// recomputation.
type profileState struct {
	problems map[string]string
	health   map[string]string
}

func newProfileState() *profileState {
	return &profileState{problems: map[string]string{}, health: map[string]string{}}
}

// members are the members the profiles describe. A profile whose name is
// not a valid cluster name is left out; one that cannot be reached with
// the operator's providers is reported with its error, which keeps a
// connection already made to it (as a broken kubeconfig does).
func (st *profileState) members(logger klog.Logger, profiles []*clusterinventory.ClusterProfile, f *ProviderFile) map[string]MemberConfig {
	profiles = slices.Clone(profiles)
	sort.Slice(profiles, func(i, j int) bool { return profiles[i].Name < profiles[j].Name })
	members := map[string]MemberConfig{}
	seen := map[string]bool{}
	profileHealth.Reset()
	for _, p := range profiles {
		seen[p.Name] = true
		st.noteHealth(logger, p)
		reason, mc := profileMember(p, f)
		st.noteProblem(logger, p, reason, mc.err)
		if reason == reasonInvalidName {
			continue
		}
		mc.created = p.CreationTimestamp.Time
		mc.labels = maps.Clone(p.Labels)
		mc.drain = p.Annotations[v1alpha1.DrainAnnotation]
		members[p.Name] = mc
	}
	for name := range st.problems {
		if !seen[name] {
			delete(st.problems, name)
		}
	}
	for name := range st.health {
		if !seen[name] {
			delete(st.health, name)
		}
	}
	return members
}

// Why a profile is not a usable member, as counted by
// mci_clusterset_clusterprofile_unusable_total.
const (
	reasonInvalidName    = "InvalidName"
	reasonNoProviderFile = "NoProviderFile"
	reasonNoAccess       = "NoUsableAccessProvider"
)

// profileMember is the member of one profile, or the reason it has none.
func profileMember(p *clusterinventory.ClusterProfile, f *ProviderFile) (string, MemberConfig) {
	if errs := validation.IsDNS1123Subdomain(p.Name); len(errs) > 0 {
		err := fmt.Errorf("profile name %q is not a valid cluster name: %s", p.Name, strings.Join(errs, "; "))
		return reasonInvalidName, MemberConfig{err: err}
	}
	if f == nil {
		return reasonNoProviderFile, memberFromProfile(p, nil)
	}
	mc := memberFromProfile(p, f)
	if mc.err != nil {
		return reasonNoAccess, mc
	}
	return "", mc
}

func (st *profileState) noteProblem(logger klog.Logger, p *clusterinventory.ClusterProfile, reason string, err error) {
	if err == nil {
		delete(st.problems, p.Name)
		return
	}
	said := reason + ": " + err.Error()
	if st.problems[p.Name] == said {
		return
	}
	st.problems[p.Name] = said
	profileUnusable.WithLabelValues(reason).Inc()
	logger.Error(err, "ClusterProfile is not a usable member", "profile", klog.KObj(p), "reason", reason)
}

// noteHealth reads the cluster manager's ControlPlaneHealthy condition as
// a hint: it is logged and exported, never a reason to drop the member,
// whose reachability mci's own probes decide.
func (st *profileState) noteHealth(logger klog.Logger, p *clusterinventory.ClusterProfile) {
	status, value := "Unknown", -1.0
	if c := metaCondition(p.Status.Conditions, clusterinventory.ConditionControlPlaneHealthy); c != nil {
		status = string(c.Status)
		switch c.Status {
		case metav1.ConditionTrue:
			value = 1
		case metav1.ConditionFalse:
			value = 0
		}
	}
	profileHealth.WithLabelValues(p.Name).Set(value)
	if prev, ok := st.health[p.Name]; ok && prev == status {
		return
	}
	st.health[p.Name] = status
	logger.Info("ClusterProfile control plane health (a hint; mci's own probes decide reachability)", "profile", klog.KObj(p), "controlPlaneHealthy", status)
}

func metaCondition(conds []metav1.Condition, t string) *metav1.Condition {
	for i := range conds {
		if conds[i].Type == t {
			return &conds[i]
		}
	}
	return nil
}
