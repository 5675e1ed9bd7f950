package podstart

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// serviceAccountDir is where a kubelet mounts the pod's ServiceAccount
// token, its cluster's CA and its namespace.
const serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// tokenExpirationSeconds is what a kubelet asks of the TokenRequest API for
// the automounted token.
const tokenExpirationSeconds = 3607

// kubelet starts pods of one cluster as processes of this machine.
type kubelet struct {
	kube kubernetes.Interface
	// apiHost and apiPort are the cluster's kube-apiserver, what
	// KUBERNETES_SERVICE_HOST and _PORT say; caPEM verifies it.
	apiHost, apiPort string
	caPEM            []byte
	images           *imageStore
	dir              string
}

// pod is one started pod.
type pod struct {
	name, namespace, uid string
	ip                   string
	labels, annotations  map[string]string
	spec                 corev1.PodSpec
	dir                  string
	// containers that run (native sidecars first), and the names of those
	// whose image cannot be had here.
	containers []*container
	notStarted []string
}

// container is one process of a pod.
type container struct {
	spec   corev1.Container
	root   string
	log    string
	cmd    *exec.Cmd
	done   chan struct{}
	exitMu sync.Mutex
	exit   error
}

// newPod is the pod a ReplicaSet of the workload would create, given the
// loopback address ip as its pod IP.
func (k *kubelet) newPod(name, namespace, ip string, labels, annotations map[string]string, spec corev1.PodSpec) *pod {
	return &pod{
		name: name, namespace: namespace, uid: string(uuid.NewUUID()), ip: ip,
		labels: labels, annotations: annotations, spec: spec,
		dir: filepath.Join(k.dir, namespace+"_"+name),
	}
}

// start starts every container of p as a kubelet would: init containers
// in order (a native sidecar, restartPolicy Always, counts as started
// once its startup probe passes), then the containers. It returns when
// every container runs; the probes are p's to run next.
func (k *kubelet) start(ctx context.Context, p *pod) error {
	if err := os.MkdirAll(p.dir, 0o755); err != nil {
		return err
	}
	for _, c := range p.spec.InitContainers {
		ctr, err := k.startContainer(ctx, p, c)
		if err != nil || ctr == nil {
			if err != nil {
				return err
			}
			continue
		}
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			p.containers = append(p.containers, ctr)
			if c.StartupProbe != nil {
				if err := runProbe(ctx, "startup", c.StartupProbe, p, ctr); err != nil {
					return err
				}
			}
			continue
		}
		select {
		case <-ctr.done:
		case <-ctx.Done():
			return ctx.Err()
		}
		if err := ctr.exitErr(); err != nil {
			return fmt.Errorf("init container %s of %s/%s: %w\n%s", c.Name, p.namespace, p.name, err, ctr.logTail())
		}
	}
	for _, c := range p.spec.Containers {
		ctr, err := k.startContainer(ctx, p, c)
		if err != nil {
			return err
		}
		if ctr != nil {
			p.containers = append(p.containers, ctr)
		}
	}
	return nil
}

// startContainer prepares c's root (image, volumes) and starts its
// process; nil when c's image is one that cannot be had here.
func (k *kubelet) startContainer(ctx context.Context, p *pod, c corev1.Container) (*container, error) {
	img, err := k.images.image(c.Image)
	if errors.Is(err, errImageNotBuiltHere) {
		p.notStarted = append(p.notStarted, c.Name+" ("+c.Image+")")
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("container %s of %s/%s: %w", c.Name, p.namespace, p.name, err)
	}
	ctr := &container{spec: c, root: filepath.Join(p.dir, c.Name), log: filepath.Join(p.dir, c.Name+".log"), done: make(chan struct{})}
	if err := os.MkdirAll(ctr.root, 0o755); err != nil {
		return nil, err
	}
	if err := img.Unpack(ctr.root); err != nil {
		return nil, err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	uid, gid, err := user(p.spec.SecurityContext, c.SecurityContext, cfg.Config.User)
	if err != nil {
		return nil, fmt.Errorf("container %s of %s/%s: %w", c.Name, p.namespace, p.name, err)
	}
	writable, err := k.mountVolumes(ctx, p, c, ctr.root, uid, gid)
	if err != nil {
		return nil, fmt.Errorf("container %s of %s/%s: %w", c.Name, p.namespace, p.name, err)
	}
	env, err := k.environment(ctx, p, c, cfg.Config.Env)
	if err != nil {
		return nil, fmt.Errorf("container %s of %s/%s: %w", c.Name, p.namespace, p.name, err)
	}
	vars := map[string]string{}
	for _, kv := range env {
		name, value, _ := strings.Cut(kv, "=")
		vars[name] = value
	}
	// The command and args as the runtime takes them: the image's
	// entrypoint and cmd unless the container says otherwise.
	argv := cfg.Config.Entrypoint
	args := cfg.Config.Cmd
	if len(c.Command) > 0 {
		argv, args = nil, nil
		for _, a := range c.Command {
			argv = append(argv, expand(a, vars))
		}
	}
	if len(c.Args) > 0 {
		args = nil
		for _, a := range c.Args {
			args = append(args, expand(a, vars))
		}
	}
	argv = append(argv, args...)
	// The one flag the test adds: each pod listens on its own loopback
	// address, which stands for its network namespace.
	argv = append(argv, "--bind-address="+p.ip)
	if len(argv) == 0 {
		return nil, fmt.Errorf("container %s of %s/%s: no command and no image entrypoint", c.Name, p.namespace, p.name)
	}
	binary, err := lookPath(ctr.root, argv[0], vars["PATH"])
	if err != nil {
		return nil, fmt.Errorf("container %s of %s/%s: %w", c.Name, p.namespace, p.name, err)
	}
	workDir := cmp(c.WorkingDir, cfg.Config.WorkingDir, "/")
	logFile, err := os.Create(ctr.log)
	if err != nil {
		return nil, err
	}
	var groups []int
	if sc := p.spec.SecurityContext; sc != nil {
		if sc.FSGroup != nil {
			groups = append(groups, int(*sc.FSGroup))
		}
		for _, g := range sc.SupplementalGroups {
			groups = append(groups, int(g))
		}
	}
	spec := containerSpec{
		Root: ctr.root, Writable: writable, Path: binary, Argv: argv, Env: env, Dir: workDir,
		UID: int(uid), GID: int(gid), Groups: groups,
	}
	if sc := c.SecurityContext; sc != nil {
		spec.ReadOnlyRoot = ptr.Deref(sc.ReadOnlyRootFilesystem, false)
		spec.NoNewPrivs = !ptr.Deref(sc.AllowPrivilegeEscalation, true)
	}
	encoded, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	// This test binary again, as the container's init (runtime_test.go),
	// in a mount namespace of its own.
	ctr.cmd = &exec.Cmd{
		Path: self, Args: []string{self}, Env: []string{containerInitEnv + "=" + string(encoded)},
		Stdout: logFile, Stderr: logFile,
		SysProcAttr: &syscall.SysProcAttr{
			Unshareflags: syscall.CLONE_NEWNS,
			Setpgid:      true,
			Pdeathsig:    syscall.SIGKILL,
		},
	}
	if err := ctr.cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("starting container %s of %s/%s (%s): %w", c.Name, p.namespace, p.name, strings.Join(argv, " "), err)
	}
	go func() {
		err := ctr.cmd.Wait()
		logFile.Close()
		ctr.exitMu.Lock()
		ctr.exit = err
		if err == nil {
			ctr.exit = errors.New("exited with status 0")
		}
		ctr.exitMu.Unlock()
		close(ctr.done)
	}()
	return ctr, nil
}

func (c *container) exitErr() error {
	c.exitMu.Lock()
	defer c.exitMu.Unlock()
	if c.exit != nil && c.exit.Error() == "exited with status 0" {
		return nil
	}
	return c.exit
}

// logTail is the end of the container's log, for failure messages.
func (c *container) logTail() string {
	data, err := os.ReadFile(c.log)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > 40 {
		lines = lines[len(lines)-40:]
	}
	return "--- last lines of " + c.log + ":\n" + strings.Join(lines, "\n")
}

// stop sends SIGTERM to every process of the pod, and SIGKILL to those
// still running after the grace period (at most 10s here).
func (p *pod) stop() {
	for _, c := range p.containers {
		_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGTERM)
	}
	grace := 10 * time.Second
	if s := p.spec.TerminationGracePeriodSeconds; s != nil && time.Duration(*s)*time.Second < grace {
		grace = time.Duration(*s) * time.Second
	}
	deadline := time.After(grace)
	for _, c := range p.containers {
		select {
		case <-c.done:
		case <-deadline:
			_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
			<-c.done
		}
	}
}

// user is the uid and gid a container runs as: its securityContext's, else
// the pod's, else the image's USER (numeric: the images have no
// /etc/passwd).
func user(pod *corev1.PodSecurityContext, c *corev1.SecurityContext, imageUser string) (uint32, uint32, error) {
	var uid, gid *int64
	if pod != nil {
		uid, gid = pod.RunAsUser, pod.RunAsGroup
	}
	if c != nil {
		if c.RunAsUser != nil {
			uid = c.RunAsUser
		}
		if c.RunAsGroup != nil {
			gid = c.RunAsGroup
		}
	}
	u, g, _ := strings.Cut(imageUser, ":")
	if uid == nil && u != "" {
		n, err := strconv.ParseInt(u, 10, 32)
		if err != nil {
			return 0, 0, fmt.Errorf("image user %q is not numeric", imageUser)
		}
		uid = &n
	}
	if gid == nil && g != "" {
		n, err := strconv.ParseInt(g, 10, 32)
		if err != nil {
			return 0, 0, fmt.Errorf("image group %q is not numeric", imageUser)
		}
		gid = &n
	}
	nonRoot := (pod != nil && ptr.Deref(pod.RunAsNonRoot, false)) || (c != nil && ptr.Deref(c.RunAsNonRoot, false))
	if uid == nil || *uid == 0 {
		if nonRoot {
			return 0, 0, errors.New("runAsNonRoot is set but the container would run as root: a kubelet refuses to start it")
		}
		uid = ptr.To[int64](0)
	}
	if gid == nil {
		gid = ptr.To[int64](0)
	}
	return uint32(*uid), uint32(*gid), nil
}

// environment is the container's environment as a runtime gives it: the
// image's, the kubernetes Service's variables, then envFrom and env in
// order, each value's $(VAR) expanded against those before it.
func (k *kubelet) environment(ctx context.Context, p *pod, c corev1.Container, imageEnv []string) ([]string, error) {
	vars := map[string]string{}
	var order []string
	set := func(name, value string) {
		if _, ok := vars[name]; !ok {
			order = append(order, name)
		}
		vars[name] = value
	}
	for _, kv := range imageEnv {
		name, value, _ := strings.Cut(kv, "=")
		set(name, value)
	}
	set("HOSTNAME", p.name)
	// The service links of the kubernetes Service; the others' cluster
	// IPs route nowhere here.
	hostPort := net.JoinHostPort(k.apiHost, k.apiPort)
	set("KUBERNETES_SERVICE_HOST", k.apiHost)
	set("KUBERNETES_SERVICE_PORT", k.apiPort)
	set("KUBERNETES_SERVICE_PORT_HTTPS", k.apiPort)
	set("KUBERNETES_PORT", "tcp://"+hostPort)
	set("KUBERNETES_PORT_443_TCP", "tcp://"+hostPort)
	set("KUBERNETES_PORT_443_TCP_PROTO", "tcp")
	set("KUBERNETES_PORT_443_TCP_PORT", k.apiPort)
	set("KUBERNETES_PORT_443_TCP_ADDR", k.apiHost)

	for _, from := range c.EnvFrom {
		var data map[string]string
		switch {
		case from.ConfigMapRef != nil:
			cm, err := k.kube.CoreV1().ConfigMaps(p.namespace).Get(ctx, from.ConfigMapRef.Name, metav1.GetOptions{})
			if err != nil {
				if apierrors.IsNotFound(err) && ptr.Deref(from.ConfigMapRef.Optional, false) {
					continue
				}
				return nil, fmt.Errorf("envFrom ConfigMap %s: %w", from.ConfigMapRef.Name, err)
			}
			data = cm.Data
		case from.SecretRef != nil:
			s, err := k.kube.CoreV1().Secrets(p.namespace).Get(ctx, from.SecretRef.Name, metav1.GetOptions{})
			if err != nil {
				if apierrors.IsNotFound(err) && ptr.Deref(from.SecretRef.Optional, false) {
					continue
				}
				return nil, fmt.Errorf("envFrom Secret %s: %w", from.SecretRef.Name, err)
			}
			data = map[string]string{}
			for key, v := range s.Data {
				data[key] = string(v)
			}
		}
		for key, v := range data {
			set(from.Prefix+key, v)
		}
	}
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			set(e.Name, expand(e.Value, vars))
			continue
		}
		v, ok, err := k.valueFrom(ctx, p, c, e.ValueFrom)
		if err != nil {
			return nil, fmt.Errorf("env %s: %w", e.Name, err)
		}
		if ok {
			set(e.Name, v)
		}
	}
	env := make([]string, 0, len(order))
	for _, name := range order {
		env = append(env, name+"="+vars[name])
	}
	return env, nil
}

// valueFrom resolves an env var's source; ok is false for an optional key
// that is missing.
func (k *kubelet) valueFrom(ctx context.Context, p *pod, c corev1.Container, src *corev1.EnvVarSource) (string, bool, error) {
	switch {
	case src.FieldRef != nil:
		v, err := p.field(src.FieldRef.FieldPath)
		return v, err == nil, err
	case src.SecretKeyRef != nil:
		ref := src.SecretKeyRef
		s, err := k.kube.CoreV1().Secrets(p.namespace).Get(ctx, ref.Name, metav1.GetOptions{})
		if err != nil {
			if apierrors.IsNotFound(err) && ptr.Deref(ref.Optional, false) {
				return "", false, nil
			}
			return "", false, fmt.Errorf("Secret %s: %w", ref.Name, err)
		}
		v, ok := s.Data[ref.Key]
		if !ok && !ptr.Deref(ref.Optional, false) {
			return "", false, fmt.Errorf("Secret %s has no key %q", ref.Name, ref.Key)
		}
		return string(v), ok, nil
	case src.ConfigMapKeyRef != nil:
		ref := src.ConfigMapKeyRef
		cm, err := k.kube.CoreV1().ConfigMaps(p.namespace).Get(ctx, ref.Name, metav1.GetOptions{})
		if err != nil {
			if apierrors.IsNotFound(err) && ptr.Deref(ref.Optional, false) {
				return "", false, nil
			}
			return "", false, fmt.Errorf("ConfigMap %s: %w", ref.Name, err)
		}
		v, ok := cm.Data[ref.Key]
		if !ok && !ptr.Deref(ref.Optional, false) {
			return "", false, fmt.Errorf("ConfigMap %s has no key %q", ref.Name, ref.Key)
		}
		return v, ok, nil
	case src.ResourceFieldRef != nil:
		return "", false, fmt.Errorf("resourceFieldRef %s is not resolved by this test", src.ResourceFieldRef.Resource)
	}
	return "", false, errors.New("an env source of no known kind")
}

// field is the downward API's value of a pod field.
func (p *pod) field(fieldPath string) (string, error) {
	if key, ok := strings.CutPrefix(fieldPath, "metadata.labels['"); ok {
		return p.labels[strings.TrimSuffix(key, "']")], nil
	}
	if key, ok := strings.CutPrefix(fieldPath, "metadata.annotations['"); ok {
		return p.annotations[strings.TrimSuffix(key, "']")], nil
	}
	switch fieldPath {
	case "metadata.name":
		return p.name, nil
	case "metadata.namespace":
		return p.namespace, nil
	case "metadata.uid":
		return p.uid, nil
	case "spec.serviceAccountName":
		return p.spec.ServiceAccountName, nil
	case "spec.nodeName", "status.hostIP", "status.hostIPs":
		return "127.0.0.1", nil
	case "status.podIP", "status.podIPs":
		return p.ip, nil
	}
	return "", fmt.Errorf("fieldRef %q is not a downward API field this test knows", fieldPath)
}

// expand replaces $(VAR) with VAR's value where VAR is defined and $$
// with $, as a kubelet expands env values, command and args.
func expand(s string, vars map[string]string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '$' && i+1 < len(s) {
			switch s[i+1] {
			case '$':
				b.WriteByte('$')
				i++
				continue
			case '(':
				if j := strings.IndexByte(s[i+2:], ')'); j >= 0 {
					name := s[i+2 : i+2+j]
					if v, ok := vars[name]; ok {
						b.WriteString(v)
					} else {
						b.WriteString(s[i : i+3+j])
					}
					i += 2 + j
					continue
				}
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// lookPath finds the command inside root as the runtime does: as it is
// when it holds a slash, else in the image's PATH.
func lookPath(root, name, pathEnv string) (string, error) {
	candidates := []string{name}
	if !strings.Contains(name, "/") {
		candidates = nil
		for _, dir := range filepath.SplitList(pathEnv) {
			candidates = append(candidates, path.Join(dir, name))
		}
	}
	for _, c := range candidates {
		if !path.IsAbs(c) {
			continue
		}
		if info, err := os.Stat(filepath.Join(root, c)); err == nil && info.Mode().IsRegular() && info.Mode()&0o111 != 0 {
			return c, nil
		}
	}
	return "", fmt.Errorf("executable %q not found in the image (PATH %q)", name, pathEnv)
}

// cmp returns the first non-empty string.
func cmp(values ...string) string {
	for _, v := range values {
		if v != "" {
			return v
		}
	}
	return ""
}

// mountVolumes writes the files of every volume c mounts at its
// mountPath under root, and the automounted ServiceAccount token, and
// returns the directories that stay writable under a read-only root (the
// emptyDirs), relative to root.
func (k *kubelet) mountVolumes(ctx context.Context, p *pod, c corev1.Container, root string, uid, gid uint32) ([]string, error) {
	var writable []string
	volumes := map[string]corev1.Volume{}
	for _, v := range p.spec.Volumes {
		volumes[v.Name] = v
	}
	mounted := map[string]bool{}
	for _, m := range c.VolumeMounts {
		v, ok := volumes[m.Name]
		if !ok {
			return nil, fmt.Errorf("volumeMount %s names no volume of the pod", m.Name)
		}
		files, dir, err := k.volumeFiles(ctx, p, v)
		if err != nil {
			return nil, fmt.Errorf("volume %s: %w", v.Name, err)
		}
		target := filepath.Join(root, filepath.Clean("/"+m.MountPath))
		mounted[path.Clean(m.MountPath)] = true
		if m.SubPath != "" {
			f, ok := files[m.SubPath]
			if !ok {
				return nil, fmt.Errorf("volumeMount %s: subPath %q is not in the volume", m.Name, m.SubPath)
			}
			if err := writeVolumeFile(target, f, uid, gid); err != nil {
				return nil, err
			}
			continue
		}
		if err := os.MkdirAll(target, dir); err != nil {
			return nil, err
		}
		if dir&0o002 != 0 {
			// An emptyDir: writable by every user, as a kubelet makes it.
			if err := os.Chmod(target, dir); err != nil {
				return nil, err
			}
			writable = append(writable, path.Clean("/"+m.MountPath))
		}
		for name, f := range files {
			if err := writeVolumeFile(filepath.Join(target, name), f, uid, gid); err != nil {
				return nil, err
			}
		}
	}
	if mounted[serviceAccountDir] || !k.automount(ctx, p) {
		return writable, nil
	}
	token, err := k.token(ctx, p, nil, tokenExpirationSeconds)
	if err != nil {
		return nil, err
	}
	target := filepath.Join(root, serviceAccountDir)
	for name, f := range map[string]volumeFile{
		"token":     {data: []byte(token), mode: 0o644},
		"ca.crt":    {data: k.caPEM, mode: 0o644},
		"namespace": {data: []byte(p.namespace), mode: 0o644},
	} {
		if err := writeVolumeFile(filepath.Join(target, name), f, uid, gid); err != nil {
			return nil, err
		}
	}
	return writable, nil
}

// automount says whether the pod gets the API access volume: the pod's
// field, else its ServiceAccount's, else yes.
func (k *kubelet) automount(ctx context.Context, p *pod) bool {
	if p.spec.AutomountServiceAccountToken != nil {
		return *p.spec.AutomountServiceAccountToken
	}
	sa, err := k.kube.CoreV1().ServiceAccounts(p.namespace).Get(ctx, serviceAccountName(p), metav1.GetOptions{})
	if err == nil && sa.AutomountServiceAccountToken != nil {
		return *sa.AutomountServiceAccountToken
	}
	return true
}

func serviceAccountName(p *pod) string {
	return cmp(p.spec.ServiceAccountName, "default")
}

// token asks the TokenRequest API for a token of the pod's
// ServiceAccount, as a kubelet does for every projected token.
func (k *kubelet) token(ctx context.Context, p *pod, audiences []string, expirationSeconds int64) (string, error) {
	tr, err := k.kube.CoreV1().ServiceAccounts(p.namespace).CreateToken(ctx, serviceAccountName(p), &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: audiences, ExpirationSeconds: &expirationSeconds},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("TokenRequest for ServiceAccount %s/%s: %w", p.namespace, serviceAccountName(p), err)
	}
	return tr.Status.Token, nil
}

// volumeFile is one file of a volume: its content, mode, and whether it
// belongs to the container's user (a projected token does).
type volumeFile struct {
	data  []byte
	mode  fs.FileMode
	owned bool
}

// volumeFiles are the files of a volume, by path within it, and the mode
// of its directory.
func (k *kubelet) volumeFiles(ctx context.Context, p *pod, v corev1.Volume) (map[string]volumeFile, fs.FileMode, error) {
	files := map[string]volumeFile{}
	switch {
	case v.EmptyDir != nil:
		return files, 0o777, nil
	case v.ConfigMap != nil:
		err := k.configMapFiles(ctx, p, v.ConfigMap.Name, v.ConfigMap.Items, v.ConfigMap.Optional, v.ConfigMap.DefaultMode, files)
		return files, 0o755, err
	case v.Secret != nil:
		err := k.secretFiles(ctx, p, v.Secret.SecretName, v.Secret.Items, v.Secret.Optional, v.Secret.DefaultMode, files)
		return files, 0o755, err
	case v.DownwardAPI != nil:
		err := p.downwardFiles(v.DownwardAPI.Items, v.DownwardAPI.DefaultMode, files)
		return files, 0o755, err
	case v.HostPath != nil:
		// What a bind mount of the node's directory shows: its files.
		err := filepath.WalkDir(v.HostPath.Path, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			info, err := d.Info()
			if err != nil {
				return err
			}
			if !info.Mode().IsRegular() {
				return fmt.Errorf("hostPath %s: %s is not a regular file", v.HostPath.Path, path)
			}
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			rel, err := filepath.Rel(v.HostPath.Path, path)
			if err != nil {
				return err
			}
			files[rel] = volumeFile{data: data, mode: info.Mode().Perm()}
			return nil
		})
		return files, 0o755, err
	case v.Projected != nil:
		for _, src := range v.Projected.Sources {
			var err error
			switch {
			case src.ConfigMap != nil:
				err = k.configMapFiles(ctx, p, src.ConfigMap.Name, src.ConfigMap.Items, src.ConfigMap.Optional, v.Projected.DefaultMode, files)
			case src.Secret != nil:
				err = k.secretFiles(ctx, p, src.Secret.Name, src.Secret.Items, src.Secret.Optional, v.Projected.DefaultMode, files)
			case src.DownwardAPI != nil:
				err = p.downwardFiles(src.DownwardAPI.Items, v.Projected.DefaultMode, files)
			case src.ServiceAccountToken != nil:
				var audiences []string
				if src.ServiceAccountToken.Audience != "" {
					audiences = []string{src.ServiceAccountToken.Audience}
				}
				var token string
				token, err = k.token(ctx, p, audiences, ptr.Deref(src.ServiceAccountToken.ExpirationSeconds, tokenExpirationSeconds))
				files[src.ServiceAccountToken.Path] = volumeFile{data: []byte(token), mode: 0o600, owned: true}
			default:
				err = errors.New("a projected source this test does not provide")
			}
			if err != nil {
				return nil, 0, err
			}
		}
		return files, 0o755, nil
	}
	return nil, 0, errors.New("a volume type this test does not provide (only configMap, secret, projected, downwardAPI, emptyDir, hostPath)")
}

func (k *kubelet) configMapFiles(ctx context.Context, p *pod, name string, items []corev1.KeyToPath, optional *bool, defaultMode *int32, files map[string]volumeFile) error {
	cm, err := k.kube.CoreV1().ConfigMaps(p.namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) && ptr.Deref(optional, false) {
			return nil
		}
		return fmt.Errorf("ConfigMap %s/%s: %w", p.namespace, name, err)
	}
	data := map[string][]byte{}
	for key, v := range cm.Data {
		data[key] = []byte(v)
	}
	for key, v := range cm.BinaryData {
		data[key] = v
	}
	return keyFiles("ConfigMap "+name, data, items, optional, defaultMode, files)
}

func (k *kubelet) secretFiles(ctx context.Context, p *pod, name string, items []corev1.KeyToPath, optional *bool, defaultMode *int32, files map[string]volumeFile) error {
	s, err := k.kube.CoreV1().Secrets(p.namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) && ptr.Deref(optional, false) {
			return nil
		}
		return fmt.Errorf("Secret %s/%s: %w", p.namespace, name, err)
	}
	return keyFiles("Secret "+name, s.Data, items, optional, defaultMode, files)
}

// keyFiles adds a file per key (or per item), with the items' modes, else
// defaultMode, else 0644.
func keyFiles(what string, data map[string][]byte, items []corev1.KeyToPath, optional *bool, defaultMode *int32, files map[string]volumeFile) error {
	mode := fs.FileMode(ptr.Deref(defaultMode, 0o644))
	if len(items) == 0 {
		for key, v := range data {
			files[key] = volumeFile{data: v, mode: mode}
		}
		return nil
	}
	for _, item := range items {
		v, ok := data[item.Key]
		if !ok {
			if ptr.Deref(optional, false) {
				continue
			}
			return fmt.Errorf("%s has no key %q", what, item.Key)
		}
		m := mode
		if item.Mode != nil {
			m = fs.FileMode(*item.Mode)
		}
		files[item.Path] = volumeFile{data: v, mode: m}
	}
	return nil
}

func (p *pod) downwardFiles(items []corev1.DownwardAPIVolumeFile, defaultMode *int32, files map[string]volumeFile) error {
	for _, item := range items {
		if item.FieldRef == nil {
			return fmt.Errorf("downwardAPI item %s: only fieldRef is provided by this test", item.Path)
		}
		v, err := p.field(item.FieldRef.FieldPath)
		if err != nil {
			return err
		}
		mode := fs.FileMode(ptr.Deref(item.Mode, ptr.Deref(defaultMode, 0o644)))
		files[item.Path] = volumeFile{data: []byte(v), mode: mode}
	}
	return nil
}

func writeVolumeFile(path string, f volumeFile, uid, gid uint32) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(path, f.data, f.mode); err != nil {
		return err
	}
	if err := os.Chmod(path, f.mode); err != nil {
		return err
	}
	if f.owned {
		return os.Chown(path, int(uid), int(gid))
	}
	return nil
}

// podName is the name a ReplicaSet would give replica r of a workload.
func podName(workload string, r int) string {
	return fmt.Sprintf("%s-podstart-%d", workload, r)
}

// objectKey names a namespaced object.
func objectKey(namespace, name string) types.NamespacedName {
	return types.NamespacedName{Namespace: namespace, Name: name}
}
