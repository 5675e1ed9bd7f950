// Package podstart tests that the pods the Helm chart charts/mci renders
// really start: for the default values and a values file per mode
// (testdata), it renders the chart with helm, installs what it renders in
// a cluster of a local ClusterSet (real kube-apiservers), and starts every
// container as a kubelet would. `make test-pods-start` runs it after
// `make images`.
//
// What it does as the kubelet does: the entrypoint is the one of the image
// `make images` built, run from the image's own file system (the process
// is chrooted into it, as the only change of root); the rendered command,
// args and env, with $(VAR) references expanded and fieldRef,
// secretKeyRef and configMapKeyRef resolved; the container runs as the
// rendered runAsUser/runAsGroup (else the image's user); the pod's
// volumes (ConfigMaps, Secrets, projected ServiceAccount tokens and the
// kube-root-ca.crt, downwardAPI, emptyDir) are files at their mountPaths,
// read from the cluster the chart is installed in; a ServiceAccount token
// from the TokenRequest API of the pod's ServiceAccount, with ca.crt and
// namespace, is mounted at /var/run/secrets/kubernetes.io/serviceaccount
// unless automounting is off; KUBERNETES_SERVICE_HOST and _PORT point at
// the cluster's kube-apiserver. Init containers run in order, native
// sidecars (restartPolicy Always) until their startup probe passes, then
// the containers; every startup, readiness and liveness probe runs as
// rendered (httpGet, tcpSocket, grpc; named ports; the probe's own
// timing) against the pod's address, and the test fails with the
// container's log when one does not pass in time.
//
// What it cannot do, and does instead:
//   - No network namespace: each pod gets a loopback address of its own
//     (127.0.x.y) as its pod IP, and each mci binary is given
//     --bind-address=<pod IP>, the one flag the test adds. Services have no
//     cluster IPs that route: the Service an APIService names is
//     installed as an ExternalName Service of a loopback address on which
//     the test plays kube-proxy (the Service's port to the ready pods'
//     targetPort).
//   - No mount namespace: volumes are files written into each container's
//     root, not mounts; a volume shared by two containers is two copies.
//     The root file system is not remounted read-only: it belongs to root
//     and the containers run as the non-root users the chart sets, so only
//     emptyDirs are writable to them.
//   - No cgroups (resources are not enforced), no seccomp profile, no
//     no_new_privs, no capability bounding set beyond what a non-root user
//     has, no UTS namespace (the hostname is the machine's), and no
//     service links besides KUBERNETES_SERVICE_HOST/_PORT.
//   - Images not built by `make images` (Envoy's) cannot be pulled here:
//     the test names each such container and does not start it.
//
// It must run as root, to chroot and to change the user.
package podstart
