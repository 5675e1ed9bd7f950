package soak

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"

	"github.com/mci-dev/mci/pkg/clusterset"
	mciclient "github.com/mci-dev/mci/pkg/generated/clientset/versioned"
	"github.com/mci-dev/mci/test/localclusterset"
)

// window is when a fault held: from its start to its heal.
type window struct {
	fault
	Start  time.Time `json:"start"`
	Healed time.Time `json:"healed"`
	// Err says what went wrong applying or healing it (a harness error).
	Err string `json:"error,omitempty"`
	// Checks are the invariants of its kind the injector checked after
	// the heal (member faults).
	Checks []check `json:"checks,omitempty"`
}

// check is one invariant of a fault: what must hold, what was seen.
type check struct {
	Target string `json:"target"`
	Figure string `json:"figure"`
	OK     bool   `json:"ok"`
}

// injector applies the faults of a schedule, each on its own goroutine at
// its time, and records their windows.
type injector struct {
	cs   *localclusterset.ClusterSet
	dp   *localclusterset.DataPath
	kube map[string]kubernetes.Interface
	w    *world
	mon  *monitor
	rot  *rotator
	// named is the member Secret whose member's name fails (nameFailure).
	named *rotator
	log   func(format string, args ...any)
	start time.Time
	// healBound is the soak's heal target, which a member fault's
	// watchers must come back within.
	healBound time.Duration
	// mciReplicas counts each cluster's mci-apiserver replicas: they read
	// their own cluster's pools (the other clusters read its summaries,
	// from those replicas).
	mciReplicas map[string]int
	mci         map[string]mciclient.Interface
	gens        *generations

	mu      sync.Mutex
	windows []*window
	// recorded are the checks a fault's injection made while it held, by
	// fault ID (checkAfterHeal reports them).
	recorded map[int][]check
	// held are the resources of the faults in flight (holdResources).
	held map[string]*sync.Mutex
}

// holdResources waits until no fault in flight holds one of f's
// resources, takes them, and returns what gives them back. The schedule
// keeps faults on a resource apart by their planned hold, but a process
// restarted under load can take longer to be ready than planned: a
// second restart of the same replica would then stop it while the first
// one's heal still waits for it. The resources are taken in their order,
// so that two faults never wait for each other.
func (in *injector) holdResources(f fault) (release func()) {
	names := slices.Compact(slices.Sorted(slices.Values(f.resources())))
	locks := make([]*sync.Mutex, len(names))
	in.mu.Lock()
	if in.held == nil {
		in.held = map[string]*sync.Mutex{}
	}
	for i, n := range names {
		if in.held[n] == nil {
			in.held[n] = &sync.Mutex{}
		}
		locks[i] = in.held[n]
	}
	in.mu.Unlock()
	for _, l := range locks {
		l.Lock()
	}
	return func() {
		for _, l := range locks {
			l.Unlock()
		}
	}
}

func (in *injector) run(ctx context.Context, faults []fault) {
	var wg sync.WaitGroup
	for _, f := range faults {
		wg.Go(func() {
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Until(in.start.Add(f.At))):
			}
			in.apply(ctx, f)
		})
	}
	wg.Wait()
}

func (in *injector) apply(ctx context.Context, f fault) {
	due := time.Now()
	release := in.holdResources(f)
	if late := time.Since(due); late > time.Second {
		in.log("fault %s: starts %s late: a fault before it on the same resources took longer to heal than planned", f, late.Round(100*time.Millisecond))
	}
	win := &window{fault: f, Start: time.Now()}
	in.mu.Lock()
	in.windows = append(in.windows, win)
	in.mu.Unlock()
	in.log("fault %s: start", f)
	heal, err := in.inject(ctx, f)
	if err != nil {
		win.Err = err.Error()
		in.log("fault %s: NOT APPLIED: %v", f, err)
	}
	// Held for its time even when the soak is stopping: every fault heals.
	// The sleep is the fault's duration. A compaction ends when its
	// restarted kube-apiserver is ready, which inject waited for: its heal
	// is measured from then, when every watch on the member resumes with
	// its 410 (its Hold is the budget of the restart in the schedule); a
	// rolling upgrade ends when its last new replica is ready, a
	// certificate renewal when its checks are done.
	if f.Kind != compaction && f.Kind != upgrade && f.Kind != certRenewal {
		time.Sleep(time.Until(win.Start.Add(f.Hold)))
	}
	if heal != nil {
		if err := heal(); err != nil {
			win.Err = strings.TrimPrefix(win.Err+"; heal: "+err.Error(), "; ")
			in.log("fault %s: HEAL FAILED: %v", f, err)
		}
	}
	in.mu.Lock()
	win.Healed = time.Now()
	in.mu.Unlock()
	release()
	in.log("fault %s: healed after %s", f, win.Healed.Sub(win.Start).Round(100*time.Millisecond))
	in.mon.await("heal", f.String(), f.ID, false)
	if err == nil {
		checks := in.checkAfterHeal(ctx, f, win.Healed)
		in.mu.Lock()
		win.Checks = checks
		in.mu.Unlock()
		for _, c := range checks {
			in.log("fault %s: %s: %s (%s)", f, c.Target, c.Figure, map[bool]string{true: "ok", false: "MISSED"}[c.OK])
		}
	}
}

// inject applies f and returns what heals it.
func (in *injector) inject(ctx context.Context, f fault) (func() error, error) {
	switch f.Kind {
	case partition, blackhole, slow500ms, slow2s:
		link, err := in.cs.MemberLink(f.Watcher, f.Target)
		if err != nil {
			return nil, err
		}
		in.w.fault(f.Watcher, f.Target, 1)
		healed := func() error {
			err := link.Heal()
			in.w.fault(f.Watcher, f.Target, -1)
			return err
		}
		switch f.Kind {
		case partition:
			link.Cut()
		case blackhole:
			err = link.Blackhole()
		case slow500ms:
			err = link.Latency(500*time.Millisecond, 50*time.Millisecond)
		case slow2s:
			err = link.Latency(2*time.Second, 200*time.Millisecond)
		}
		return healed, err
	case eppStall, eppReset:
		link, err := in.cs.EPPLink(f.Target)
		if err != nil {
			return nil, err
		}
		if f.Kind == eppStall {
			err = link.Blackhole()
		} else {
			err = link.ResetPeer(0)
		}
		return link.Heal, err
	case restart:
		if err := in.cs.StopMCIAPIServerReplica(f.Watcher, 1); err != nil {
			return nil, err
		}
		return func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			return in.cs.StartMCIAPIServerReplica(ctx, f.Watcher, 1)
		}, nil
	case pause:
		in.w.pause(f.Target, 1)
		if err := in.cs.PauseAPIServer(f.Target); err != nil {
			in.w.pause(f.Target, -1)
			return nil, err
		}
		return func() error {
			err := in.cs.ResumeAPIServer(f.Target)
			in.w.pause(f.Target, -1)
			return err
		}, nil
	case rotation:
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		return nil, in.rot.rotate(ctx)
	case compaction:
		return in.compact(ctx, f)
	case upgrade:
		return nil, in.upgrade(ctx, f)
	case certRenewal:
		return nil, in.renewCert(ctx, f)
	case nameFailure:
		return in.failName(ctx, f)
	case recreated:
		return in.recreate(ctx, f)
	case errorSink, hungFirstByte:
		mode := map[faultKind]string{errorSink: "error", hungFirstByte: "hang"}[f.Kind]
		// No withdrawal of the data path pool is planned from a second
		// before it to its cluster's return (planWithdrawals).
		healed := func() error { return in.setModelServerFault(f.Target, "") }
		return healed, in.setModelServerFault(f.Target, mode)
	}
	return nil, fmt.Errorf("unknown fault kind %q", f.Kind)
}

// setModelServerFault switches the fault of every model server of cluster
// (test/simulator's POST /admin/fault).
func (in *injector) setModelServerFault(cluster, mode string) error {
	var errs []error
	for _, u := range in.dp.ModelServerURLs[cluster] {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, u+"/admin/fault", strings.NewReader(`{"fault":"`+mode+`"}`))
		if err == nil {
			var resp *http.Response
			if resp, err = http.DefaultClient.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					err = fmt.Errorf("HTTP %d", resp.StatusCode)
				}
			}
		}
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("setting fault %q on %s: %w", mode, u, err))
		}
	}
	if len(in.dp.ModelServerURLs[cluster]) == 0 {
		errs = append(errs, fmt.Errorf("%s runs no model server", cluster))
	}
	return errors.Join(errs...)
}

func (in *injector) record(id int, checks ...check) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.recorded == nil {
		in.recorded = map[int][]check{}
	}
	in.recorded[id] = append(in.recorded[id], checks...)
}

func (in *injector) recordedChecks(id int) []check {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.recorded[id]
}

func (in *injector) result() []window {
	in.mu.Lock()
	defer in.mu.Unlock()
	out := make([]window, 0, len(in.windows))
	for _, w := range in.windows {
		out = append(out, *w)
	}
	return out
}

// rotator gives watcher's replicas their member's kubeconfig through a
// member Secret with a ServiceAccount token, and rotates it: a new
// ServiceAccount and token in the Secret, then the old ServiceAccount
// deleted, which revokes its token, as an operator rotating credentials
// does.
type rotator struct {
	cs *localclusterset.ClusterSet
	// names, when set, resolves the host name by which the Secret names
	// its member (memberName); else the Secret gives the member's address.
	names           *localclusterset.NameProxy
	watcher, member string
	watcherKube     kubernetes.Interface
	memberKube      kubernetes.Interface

	mu      sync.Mutex
	current string
	n       int
	// ip is the address the member's name resolves to.
	ip string
}

// resolved is the address the member's name resolves to, once a Secret
// names it.
func (r *rotator) resolved() (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ip, r.ip != ""
}

const rotatorSecret = "soak-member"

// setUp moves the member's kubeconfig from watcher's kubeconfig directory
// to a member Secret and waits until every replica of watcher connected
// from it.
func (r *rotator) setUp(ctx context.Context) error {
	before, err := r.secretJoins()
	if err != nil {
		return err
	}
	if err := r.rotate(ctx); err != nil {
		return err
	}
	file := filepath.Join(r.cs.MemberKubeconfigDir(r.watcher), r.member+".kubeconfig")
	if err := os.Rename(file, filepath.Join(r.cs.Dir, r.watcher+"-"+r.member+".kubeconfig.parked")); err != nil {
		return err
	}
	var last []int
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		now, err := r.secretJoins()
		if err != nil {
			return false, err
		}
		last = now
		for i := range now {
			if now[i] <= before[i] {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("the replicas of %s did not connect to %s from the member Secret (joins per replica %v, before %v): %w", r.watcher, r.member, last, before, err)
	}
	return nil
}

// rotate writes the Secret with a new ServiceAccount's token and deletes
// the previous ServiceAccount.
func (r *rotator) rotate(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n++
	name := fmt.Sprintf("soak-reader-%s-%d", r.watcher, r.n)
	token, err := r.token(ctx, name)
	if err != nil {
		return err
	}
	server, err := r.cs.MemberServer(r.watcher, r.member)
	if err != nil {
		return err
	}
	m, err := r.cs.Cluster(r.member)
	if err != nil {
		return err
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[r.member] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: m.Config.CAData}
	if r.names != nil {
		// The Secret names the member by a host name that the name proxy
		// resolves to its link, and the member's certificate is checked
		// for a name it holds.
		u, err := url.Parse(server)
		if err != nil {
			return err
		}
		r.ip = u.Hostname()
		r.names.Resolve(memberName(r.member), r.ip)
		cfg.Clusters[r.member].Server = "https://" + net.JoinHostPort(memberName(r.member), u.Port())
		cfg.Clusters[r.member].ProxyURL = r.names.URL()
		cfg.Clusters[r.member].TLSServerName = "localhost"
	}
	cfg.AuthInfos[r.member] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts[r.member] = &clientcmdapi.Context{Cluster: r.member, AuthInfo: r.member}
	cfg.CurrentContext = r.member
	kubeconfig, err := clientcmd.Write(*cfg)
	if err != nil {
		return err
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: rotatorSecret, Namespace: localclusterset.MCIAPIServerNamespace, Labels: map[string]string{clusterset.MemberClusterLabel: r.member}},
		Data:       map[string][]byte{clusterset.MemberKubeconfigKey: kubeconfig},
	}
	secrets := r.watcherKube.CoreV1().Secrets(localclusterset.MCIAPIServerNamespace)
	if r.current == "" {
		_, err = secrets.Create(ctx, secret, metav1.CreateOptions{})
	} else {
		var old *corev1.Secret
		if old, err = secrets.Get(ctx, rotatorSecret, metav1.GetOptions{}); err == nil {
			secret.ResourceVersion = old.ResourceVersion
			_, err = secrets.Update(ctx, secret, metav1.UpdateOptions{})
		}
	}
	if err != nil {
		return fmt.Errorf("writing the member Secret: %w", err)
	}
	if r.current != "" {
		if err := r.revoke(ctx, r.current); err != nil {
			return err
		}
	}
	r.current = name
	return nil
}

// readerRoles are the ClusterRoles a member Secret's ServiceAccount is
// bound to, as the deployment binds the identity it hands to the other
// members: the full reader's, and the summary reader's, which is all
// that the other clusters read a member with (summary mode). Without the
// second a replica that starts from the Secret is refused every read, and
// serves none of the member's pools.
var readerRoles = []string{"mci-member-reader", "mci-member-summary-reader"}

// bindingName is the ClusterRoleBinding of ServiceAccount name to role.
func bindingName(name, role string) string { return name + "-" + role }

// token creates a ServiceAccount in the member bound to the member reader
// roles and returns a token of it.
func (r *rotator) token(ctx context.Context, name string) (string, error) {
	ns := localclusterset.MCIAPIServerNamespace
	if _, err := r.memberKube.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		return "", fmt.Errorf("creating ServiceAccount %s: %w", name, err)
	}
	for _, role := range readerRoles {
		binding := &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: bindingName(name, role)},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: ns}},
		}
		if _, err := r.memberKube.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
			return "", fmt.Errorf("binding ServiceAccount %s to %s: %w", name, role, err)
		}
	}
	tr, err := r.memberKube.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3 * 3600)},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("token of ServiceAccount %s: %w", name, err)
	}
	return tr.Status.Token, nil
}

func (r *rotator) revoke(ctx context.Context, name string) error {
	for _, role := range readerRoles {
		if err := r.memberKube.RbacV1().ClusterRoleBindings().Delete(ctx, bindingName(name, role), metav1.DeleteOptions{}); err != nil {
			return fmt.Errorf("revoking %s: %w", name, err)
		}
	}
	if err := r.memberKube.CoreV1().ServiceAccounts(localclusterset.MCIAPIServerNamespace).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		return fmt.Errorf("revoking %s: %w", name, err)
	}
	return nil
}

// secretJoins counts, in the log of each of watcher's replicas, the
// connections to member made from a member Secret.
func (r *rotator) secretJoins() ([]int, error) {
	var counts []int
	for _, p := range r.cs.Processes() {
		if !strings.HasPrefix(p.Name, r.watcher+"-mci-apiserver") {
			continue
		}
		data, err := os.ReadFile(p.Log)
		if err != nil {
			return nil, err
		}
		n := 0
		for _, line := range strings.Split(string(data), "\n") {
			if strings.Contains(line, "Member joined the ClusterSet") && strings.Contains(line, `member="`+r.member+`"`) && strings.Contains(line, `source="secret`) {
				n++
			}
		}
		counts = append(counts, n)
	}
	return counts, nil
}
